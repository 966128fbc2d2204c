/**
 * The README's examples, run as the README says (test/readme.test.ts,
 * test/readme-relay.test.ts). The examples import 'tidemark' as users do,
 * i.e. the built dist/, which test/support/run.ts builds before any test starts.
 */
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';

export const root = new URL('../../', import.meta.url);

/** Runs examples/<name> as the README says (`npx tsx examples/<name>`, through tsx here), from the checkout, with `env` added; resolves with its stdout. */
export async function runExample(name: string, env: NodeJS.ProcessEnv): Promise<string> {
  const { stdout } = await promisify(execFile)(process.execPath, ['--import', 'tsx', new URL(`examples/${name}`, root).pathname], {
    env: { ...process.env, ...env },
    cwd: new URL('.', root).pathname,
    timeout: 60_000,
  });
  return stdout;
}
