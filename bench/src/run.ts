import { mkdir, writeFile } from 'node:fs/promises';
import { cpus } from 'node:os';
import { join } from 'node:path';
import { inWaves, installedDatabase, type BenchContext } from './context.js';
import { BenchServer } from './db.js';
import { Progress } from './progress.js';
import { renderMarkdown, type BenchReport, type ScenarioResult } from './report.js';
import { allContenders } from './contenders/index.js';
import type { Contender } from './contenders/types.js';
import { appendCost } from './scenarios/append-cost.js';
import { backlogDrain } from './scenarios/drain.js';
import { e2eLatency } from './scenarios/e2e-latency.js';
import { gapTorture } from './scenarios/gap-torture.js';
import { stallBlastRadius } from './scenarios/stall.js';
import { writerLatency } from './scenarios/writer-latency.js';
import { relayScenario } from './scenarios/relay.js';
import { groupsScenario } from './scenarios/groups.js';
import { redisRelayScenario } from './scenarios/redis-relay.js';
import { webhookRelayScenario } from './scenarios/webhook-relay.js';

/** Scenario ids, in run order. */
export const SCENARIOS: Record<string, (ctx: BenchContext) => Promise<ScenarioResult>> = {
  'gap-torture': gapTorture,
  stall: stallBlastRadius,
  'append-cost': appendCost,
  'writer-latency': writerLatency,
  'e2e-latency': e2eLatency,
  drain: backlogDrain,
  relay: relayScenario,
  groups: groupsScenario,
  'redis-relay': redisRelayScenario,
  'webhook-relay': webhookRelayScenario,
};

/**
 * Reference rows that are not contenders: measured in one scenario only, on
 * a server of their own. `logical`: logical decoding, the physical limit of
 * end-to-end latency (a server with wal_level=logical; e2e-latency).
 */
export const REFERENCE_IDS = ['logical'];

export const CONTENDER_IDS = [...allContenders().map((c) => c.id), ...REFERENCE_IDS];

export interface BenchOptions {
  /** A server URL whose role may create databases. */
  url: string;
  quick: boolean;
  /** Scenario ids to run; all when absent. */
  only?: string[];
  /** Contender ids to run; all when absent. */
  contenders?: string[];
  /** Where results go; default bench/results. */
  outDir: string;
  /** The command line, as the report shows it. */
  command: string;
  progress?: boolean;
}

export interface BenchOutcome {
  report: BenchReport;
  json: string;
  markdown: string;
}

/**
 * Installs each contender in a throwaway database first: one that cannot be
 * loaded or installed is left out of every scenario, and the report says why.
 */
async function preflight(server: BenchServer, contenders: Contender[]): Promise<Map<string, string>> {
  const unavailable = new Map<string, string>();
  await inWaves(contenders, 4, async (c) => {
    try {
      const { pool } = await installedDatabase(server, c, `preflight_${c.id}`);
      await pool.end();
    } catch (err) {
      unavailable.set(c.id, (err as Error).message);
    }
  });
  return unavailable;
}

/** Runs the chosen scenarios and writes `<outDir>/<date>[-quick].json` and `.md`. */
export async function runBench(options: BenchOptions): Promise<BenchOutcome> {
  const t0 = performance.now();
  const server = new BenchServer(options.url);
  const scenarioIds = options.only ?? Object.keys(SCENARIOS);
  const progress = new Progress(options.quick ? 90_000 : 600_000, process.stderr, options.progress ?? true);
  try {
    const wanted = allContenders().filter((c) => !options.contenders || options.contenders.includes(c.id));
    progress.step('installing contenders');
    const unavailable = await preflight(server, wanted);
    const ctx: BenchContext = {
      server,
      quick: options.quick,
      contenders: wanted.filter((c) => !unavailable.has(c.id)),
      references: REFERENCE_IDS.filter((id) => !options.contenders || options.contenders.includes(id)),
      progress,
      pick: (quick, full) => (options.quick ? quick : full),
    };
    const scenarios: ScenarioResult[] = [];
    for (const id of scenarioIds) scenarios.push(await SCENARIOS[id]!(ctx));
    const report: BenchReport = {
      date: new Date().toISOString(),
      command: options.command,
      quick: options.quick,
      machine: { cpus: cpus().length, node: process.version, platform: `${process.platform}-${process.arch}` },
      postgres: await server.settings(),
      contenders: wanted.map((c) => ({ id: c.id, title: c.title, kind: c.kind, notes: c.notes, unavailable: unavailable.get(c.id) })),
      scenarios,
      elapsedMs: performance.now() - t0,
    };
    await mkdir(options.outDir, { recursive: true });
    const stem = join(options.outDir, `${report.date.slice(0, 10)}${options.quick ? '-quick' : ''}`);
    await writeFile(`${stem}.json`, `${JSON.stringify(report, null, 2)}\n`);
    await writeFile(`${stem}.md`, renderMarkdown(report));
    return { report, json: `${stem}.json`, markdown: `${stem}.md` };
  } finally {
    progress.done();
    await server.close();
  }
}
