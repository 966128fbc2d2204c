#!/usr/bin/env -S node --max-semi-space-size=8
// A young generation of 2 x 8 MB instead of 2 x 16: the long-running
// commands (serve, relay, tail) allocate in bursts of one page, and the
// larger default only raises their resident memory (README, "Performance").
import '../dist/cli/main.js';
