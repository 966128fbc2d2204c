/**
 * `tidemark` command line: a thin map from argv to the library.
 * Connection: --database-url, else DATABASE_URL, else an embedded PostgreSQL
 * kept under ./.tidemark/ (created on first use, reused after).
 * Every failure prints one line, `tidemark: <what happened; what to do>`
 * (src/cli/explain.ts), and the stack only with --verbose. Exit codes
 * (docs/ERRORS.md, "Command line"): 0 done, 1 failed, 2 bad usage, input or
 * configuration (the failing step wrote nothing), 3 the consumer must resync
 * (bootstrap), 4 the database could not be reached, refused the login, or
 * dropped the connection.
 */
import { inspect } from 'node:util';
import { CommanderError } from 'commander';
import { explain, type ExplainContext } from './explain.js';
import { program } from './program.js';

/**
 * Runs the CLI; resolves with the exit code. Any failure is one line on
 * stderr (src/cli/explain.ts); `--verbose` adds the stack after it.
 */
export async function main(argv: string[]): Promise<number> {
  let code = 0;
  let context: ExplainContext = {};
  const root = program(
    (c) => (code = c),
    (c) => (context = c),
  );
  try {
    if (argv.length === 0) {
      root.outputHelp();
      return 2;
    }
    await root.parseAsync(argv, { from: 'user' });
    return code;
  } catch (err) {
    if (err instanceof CommanderError && ['commander.helpDisplayed', 'commander.version', 'commander.help'].includes(err.code)) return 0;
    const { message, exitCode } = explain(err, context);
    console.error(`tidemark: ${message}`);
    // Before the arguments were parsed (a usage error), look for the flag itself.
    const verbose = (root.opts() as { verbose?: boolean }).verbose ?? argv.includes('--verbose');
    if (verbose && !(err instanceof CommanderError)) console.error(inspect(err, { depth: 4 }));
    return exitCode;
  }
}

main(process.argv.slice(2)).then((code) => process.exit(code));
