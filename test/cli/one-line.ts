/** What the CLI failure tests assert of stderr (docs/ERRORS.md, "Command line"). */
import assert from 'node:assert/strict';
import type { CliResult } from '../support/cli.js';

/** Exit codes of docs/ERRORS.md, written out: the tests pin the documented numbers. */
export const USAGE = 2;
export const DATABASE = 4;

/** One line on stderr, `tidemark: ...` matching `pattern`, no stack frame, and exit `code`. */
export function assertOneLine(r: CliResult, code: number, pattern: RegExp, what: string): void {
  const lines = r.stderr.trimEnd().split('\n');
  assert.equal(lines.length, 1, `${what}: exactly one line on stderr, got:\n${r.stderr}`);
  assert.match(lines[0]!, /^tidemark: /, what);
  assert.match(lines[0]!, pattern, what);
  assert.doesNotMatch(r.stderr, / {4}at /, `${what}: no stack trace`);
  assert.equal(r.code, code, `${what}: exit code (stderr: ${r.stderr})`);
}
