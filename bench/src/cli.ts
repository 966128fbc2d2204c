/**
 * `npm run bench [-- options]`: tidemark and the alternatives side by side
 * on one server; prints the tables and writes JSON and markdown under
 * --out. The server: --database-url, else DATABASE_URL, else a throwaway
 * embedded PostgreSQL (`tidemark/embedded`), deleted at the end.
 */
import { access, constants, mkdir, mkdtemp } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Command, CommanderError } from 'commander';
import { CONTENDER_IDS, SCENARIOS, runBench } from './run.js';
import { goalsTable, markdownTable } from './report.js';

interface BenchOptions {
  quick?: boolean;
  only?: string;
  contenders?: string;
  out: string;
  progress: boolean;
  databaseUrl?: string;
}

/** A usage error: one line, exit code 2. */
class UsageError extends Error {}

function list(text: string | undefined, known: string[], flag: string): string[] | undefined {
  if (text === undefined) return undefined;
  const items = text.split(',').map((s) => s.trim()).filter(Boolean);
  const unknown = items.filter((s) => !known.includes(s));
  if (items.length === 0 || unknown.length > 0) {
    throw new UsageError(`${flag}: unknown ${unknown.length ? JSON.stringify(unknown.join(',')) : 'empty list'}; expected a comma-separated list of ${known.join(', ')}`);
  }
  return items;
}

/** The server the bench runs on, and how to let it go. */
async function openServer(url: string | undefined): Promise<{ url: string; close: () => Promise<void> }> {
  if (url) return { url, close: async () => undefined };
  const { startEmbeddedPostgres } = await import('tidemark/embedded');
  const dataDir = await mkdtemp(join(tmpdir(), 'tidemark-bench-pg-'));
  const server = await startEmbeddedPostgres({ dataDir, ephemeral: true });
  return { url: server.url, close: server.stop };
}

async function bench(options: BenchOptions, argv: string[]): Promise<void> {
  const only = list(options.only, Object.keys(SCENARIOS), '--only');
  const contenders = list(options.contenders, CONTENDER_IDS, '--contenders');
  // Relative to where `npm run bench` was typed (npm runs the workspace's script in bench/).
  const outDir = resolve(process.env.INIT_CWD ?? process.cwd(), options.out);
  // Checked before the run, not after ten minutes of it.
  try {
    await mkdir(outDir, { recursive: true });
    await access(outDir, constants.W_OK);
  } catch (err) {
    throw new UsageError(`--out: cannot write results to ${JSON.stringify(outDir)}: ${(err as Error).message}`);
  }
  const server = await openServer(options.databaseUrl ?? process.env.DATABASE_URL);
  try {
    const { report, json, markdown } = await runBench({
      url: server.url,
      quick: options.quick ?? false,
      only,
      contenders,
      outDir,
      command: `npm run bench${argv.length ? ` -- ${argv.join(' ')}` : ''}`,
      progress: options.progress,
    });
    for (const c of report.contenders.filter((x) => x.unavailable)) console.log(`${c.title} could not run: ${c.unavailable}`);
    for (const s of report.scenarios) {
      console.log(`\n## ${s.title}\n\n${markdownTable(s.columns, s.rows)}`);
      for (const note of s.notes) console.log(note);
    }
    console.log(`\n## Goals\n\n${goalsTable(report.scenarios.flatMap((s) => s.goals))}\n`);
    console.log(`Results: ${json}\n         ${markdown}`);
  } finally {
    await server.close();
  }
}

/** Runs the bench's command line; resolves with the exit code. */
export async function main(argv: string[]): Promise<number> {
  const resultsDir = fileURLToPath(new URL('../results', import.meta.url));
  const program = new Command('bench')
    .description('benchmark and conformance run: tidemark against the alternatives, side by side on one server')
    .option('--quick', 'smoke run, about a minute (figures not meaningful)')
    .option('--only <scenarios>', `comma-separated: ${Object.keys(SCENARIOS).join(', ')}`)
    .option('--contenders <ids>', `comma-separated: ${CONTENDER_IDS.join(', ')}`)
    .option('--out <dir>', 'where the JSON and markdown results go', resultsDir)
    .option('--no-progress', 'no progress output on stderr')
    .option('--database-url <url>', 'PostgreSQL URL (default: $DATABASE_URL, else a throwaway embedded server)')
    .addHelpText('after', '\nExamples:\n  $ npm run bench\n  $ npm run bench -- --quick\n  $ npm run bench -- --only gap-torture,drain --contenders tidemark,naive\n')
    .exitOverride()
    .action(async (options: BenchOptions) => bench(options, argv));
  try {
    await program.parseAsync(argv, { from: 'user' });
    return 0;
  } catch (err) {
    if (err instanceof CommanderError) return err.code === 'commander.helpDisplayed' || err.code === 'commander.help' ? 0 : 2;
    if (err instanceof UsageError) {
      console.error(`bench: ${err.message}`);
      return 2;
    }
    console.error(`bench: ${(err as Error).stack ?? String(err)}`);
    return 1;
  }
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  main(process.argv.slice(2)).then((code) => process.exit(code));
}
