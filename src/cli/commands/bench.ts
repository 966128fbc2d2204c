import { access, constants, mkdir } from 'node:fs/promises';
import { resolve } from 'node:path';
import { CONTENDER_IDS, SCENARIOS, runBench } from '../../bench/run.js';
import { goalsTable, markdownTable } from '../../bench/report.js';
import { CliError } from '../cli-error.js';
import { openDatabase, type GlobalOptions } from '../context.js';

export interface BenchCommandOptions extends GlobalOptions {
  quick?: boolean;
  only?: string;
  contenders?: string;
  out: string;
  progress: boolean;
}

function list(text: string | undefined, known: string[], flag: string): string[] | undefined {
  if (text === undefined) return undefined;
  const items = text.split(',').map((s) => s.trim()).filter(Boolean);
  const unknown = items.filter((s) => !known.includes(s));
  if (items.length === 0 || unknown.length > 0) {
    throw new CliError(`${flag}: unknown ${unknown.length ? JSON.stringify(unknown.join(',')) : 'empty list'}; expected a comma-separated list of ${known.join(', ')}`);
  }
  return items;
}

/**
 * `tidemark bench [--quick] [--only s1,s2] [--contenders c1,c2] [--out dir]`:
 * tidemark and the alternatives side by side on one server; prints the
 * tables and writes JSON and markdown under --out.
 */
export async function benchCommand(options: BenchCommandOptions): Promise<number> {
  const only = list(options.only, Object.keys(SCENARIOS), '--only');
  const contenders = list(options.contenders, CONTENDER_IDS, '--contenders');
  const outDir = resolve(options.out);
  // Checked before the run, not after ten minutes of it.
  try {
    await mkdir(outDir, { recursive: true });
    await access(outDir, constants.W_OK);
  } catch (err) {
    throw new CliError(`--out: cannot write results to ${JSON.stringify(outDir)}: ${(err as Error).message}`);
  }
  const db = await openDatabase(options, 1);
  try {
    const { report, json, markdown } = await runBench({
      url: db.url,
      quick: options.quick ?? false,
      only,
      contenders,
      outDir,
      command: `npx tidemark bench ${process.argv.slice(3).join(' ')}`.trim(),
      progress: options.progress,
    });
    for (const c of report.contenders.filter((x) => x.unavailable)) console.log(`${c.title} could not run: ${c.unavailable}`);
    for (const s of report.scenarios) {
      console.log(`\n## ${s.title}\n\n${markdownTable(s.columns, s.rows)}`);
      for (const note of s.notes) console.log(note);
    }
    console.log(`\n## Goals\n\n${goalsTable(report.scenarios.flatMap((s) => s.goals))}\n`);
    console.log(`Results: ${json}\n         ${markdown}`);
    return 0;
  } finally {
    await db.close();
  }
}
