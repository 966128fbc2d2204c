import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { readFile } from 'node:fs/promises';
import { after, test } from 'node:test';
import { promisify } from 'node:util';
import { closeAdmin, testDb } from './support/db.js';

after(closeAdmin);

const root = new URL('../', import.meta.url);

test('the README shows examples/outbox.ts verbatim, and it runs as shown', async (t) => {
  const readme = await readFile(new URL('README.md', root), 'utf8');
  const example = await readFile(new URL('examples/outbox.ts', root), 'utf8');
  assert.ok(readme.includes(example.trim()), 'README.md embeds examples/outbox.ts');

  const db = await testDb(t);
  await db.observer.query('DROP SCHEMA tidemark CASCADE'); // the example migrates by itself
  const { stdout } = await promisify(execFile)(process.execPath, ['--import', 'tsx', new URL('examples/outbox.ts', root).pathname], {
    env: { ...process.env, DATABASE_URL: db.url },
    cwd: new URL('.', root).pathname,
  });
  assert.equal(stdout, 'appended seq 1\nadvanced: safe_seq = 1\n');
});
