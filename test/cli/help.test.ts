/**
 * --version, and what every command's --help shows: read in-process from
 * the command tree (src/cli/program.ts), and once from a real process.
 */
import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import { test } from 'node:test';
import type { Command } from 'commander';
import { program } from '../../src/cli/program.js';
import { cli } from '../support/cli.js';

/** The help `tidemark <name> --help` prints, texts added before and after included. */
function helpOf(name: string): string {
  const command = program().commands.find((c) => c.name() === name) as Command;
  let text = '';
  command.configureOutput({ writeOut: (s) => (text += s) });
  command.outputHelp();
  return text;
}

test('--version prints the version of package.json', async () => {
  const { version } = JSON.parse(await readFile(new URL('../../package.json', import.meta.url), 'utf8')) as { version: string };
  assert.equal(program().version(), version);
  for (const r of await Promise.all([cli(['--version']), cli(['-V'])])) {
    assert.equal(r.code, 0, r.stderr);
    assert.equal(r.stdout, `${version}\n`);
  }
});

test("every command's --help lists the global options", async () => {
  const names = program().commands.map((c) => c.name());
  assert.deepEqual(names, ['migrate', 'serve', 'relay', 'append', 'watermark', 'tail', 'prune', 'status', 'cursor', 'group', 'dead-letters', 'demo']);
  for (const name of names) {
    const help = helpOf(name);
    assert.match(help, /^Global Options:$/m, name);
    for (const flag of ['--database-url <url>', '--schema <name>', '--ephemeral', '--verbose', '--version']) assert.ok(help.includes(flag), `${name} --help shows ${flag}`);
  }
  const r = await cli(['tail', '--help']);
  assert.equal(r.code, 0, r.stderr);
  assert.match(r.stdout, /Global Options:\n(.*\n)*\s+--database-url <url>/);
});

test('the help of every command with durations says a number needs its unit', () => {
  for (const name of ['serve', 'relay', 'tail', 'prune', 'demo']) {
    assert.match(helpOf(name), /<duration>/, name);
    assert.match(helpOf(name), /A <duration> is a number and its unit: 500ms, 10s, 1\.5m, 2h, 7d\. A bare number \(other than 0\) is refused\./, name);
  }
});

test("the README's command line block shows every command the CLI has, and no other", async () => {
  const readme = await readFile(new URL('../../README.md', import.meta.url), 'utf8');
  const block = readme.slice(readme.indexOf('```\nnpx tidemark migrate'));
  const shown = new Set([...block.slice(0, block.indexOf('```', 3)).matchAll(/^npx tidemark ([\w-]+)/gm)].map((m) => m[1]));
  const commands = new Set(program().commands.map((c) => c.name()));
  assert.deepEqual([...shown].sort(), [...commands].sort());
});
