/** --version, and what every command's --help shows. */
import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import { test } from 'node:test';
import { cli as tidemark } from '../support/cli.js';

test('--version prints the version of package.json', async () => {
  const { version } = JSON.parse(await readFile(new URL('../../package.json', import.meta.url), 'utf8')) as { version: string };
  for (const r of await Promise.all(['--version', '-V'].map((flag) => tidemark([flag])))) {
    assert.equal(r.code, 0, r.stderr);
    assert.equal(r.stdout, `${version}\n`);
  }
});

test('every command\'s --help lists the global options', async () => {
  const commands = ['migrate', 'serve', 'append', 'watermark', 'tail', 'prune', 'status', 'demo', 'bench'];
  const helps = await Promise.all(commands.map((command) => tidemark([command, '--help'])));
  for (const [i, command] of commands.entries()) {
    const r = helps[i]!;
    assert.equal(r.code, 0, r.stderr);
    for (const flag of ['--database-url <url>', '--schema <name>', '--ephemeral', '--verbose']) assert.ok(r.stdout.includes(flag), `${command} --help shows ${flag}`);
  }
});
