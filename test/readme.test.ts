import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { readdir, readFile, stat } from 'node:fs/promises';
import { after, before, test } from 'node:test';
import { promisify } from 'node:util';
import { closeAdmin, testDb } from './support/db.js';

after(closeAdmin);

const root = new URL('../', import.meta.url);

// The examples import 'tidemark' as users do, i.e. the built dist/. Rebuild
// it when a source file is newer, so a stale build cannot fail (or pass)
// them; an up-to-date dist/ is never rewritten, so concurrent test runs in
// one checkout do not read each other's half-written build.
before(async () => {
  const built = await stat(new URL('dist/index.js', root)).then((s) => s.mtimeMs, () => 0);
  const sources = await readdir(new URL('src/', root), { recursive: true });
  const newest = Math.max(...(await Promise.all(sources.map((f) => stat(new URL(`src/${f}`, root)).then((s) => s.mtimeMs)))));
  if (newest <= built) return;
  await promisify(execFile)(process.execPath, [new URL('node_modules/typescript/bin/tsc', root).pathname, '-p', 'tsconfig.build.json'], {
    cwd: new URL('.', root).pathname,
  });
});

test('the README shows examples/outbox.ts verbatim, and it runs as shown', async (t) => {
  const readme = await readFile(new URL('README.md', root), 'utf8');
  const example = await readFile(new URL('examples/outbox.ts', root), 'utf8');
  assert.ok(readme.includes(example.trim()), 'README.md embeds examples/outbox.ts');

  const db = await testDb(t);
  await db.observer.query('DROP SCHEMA tidemark CASCADE'); // the example migrates by itself
  const { stdout } = await promisify(execFile)(process.execPath, ['--import', 'tsx', new URL('examples/outbox.ts', root).pathname], {
    env: { ...process.env, DATABASE_URL: db.url },
    cwd: new URL('.', root).pathname,
    timeout: 60_000,
  });
  assert.equal(stdout, 'appended seq 1\nadvanced: safe_seq = 1\n');
});

test('the README shows examples/consumer.ts verbatim, and it runs as shown', async (t) => {
  const readme = await readFile(new URL('README.md', root), 'utf8');
  const example = await readFile(new URL('examples/consumer.ts', root), 'utf8');
  assert.ok(readme.includes(example.trim()), 'README.md embeds examples/consumer.ts');

  const db = await testDb(t);
  await db.observer.query('DROP SCHEMA tidemark CASCADE'); // the example migrates by itself
  const run = () =>
    promisify(execFile)(process.execPath, ['--import', 'tsx', new URL('examples/consumer.ts', root).pathname], {
      env: { ...process.env, DATABASE_URL: db.url },
      cwd: new URL('.', root).pathname,
      timeout: 60_000,
    });
  const first = await run();
  assert.equal(first.stdout, 'seq 1: order.placed ada\nseq 2: order.placed bob\nseq 3: order.placed ada\nada: 35\nbob: 12\n');
  // Run again: the durable cursor resumes after seq 3, so only the new events apply.
  const second = await run();
  assert.equal(second.stdout, 'seq 4: order.placed ada\nseq 5: order.placed bob\nseq 6: order.placed ada\nada: 70\nbob: 24\n');

  // The bootstrap example rebuilds the same projection and finds nothing left to deliver.
  const example2 = await readFile(new URL('examples/bootstrap.ts', root), 'utf8');
  assert.ok(readme.includes(example2.trim()), 'README.md embeds examples/bootstrap.ts');
  await db.observer.query('UPDATE order_totals SET total = 0'); // damage it: the rebuild must repair it
  const rebuilt = await promisify(execFile)(process.execPath, ['--import', 'tsx', new URL('examples/bootstrap.ts', root).pathname], {
    env: { ...process.env, DATABASE_URL: db.url },
    cwd: new URL('.', root).pathname,
    timeout: 60_000,
  });
  assert.equal(rebuilt.stdout, 'rebuilt through seq 6 (cursor was 6)\nthen delivered 0\n');
  const totals = await db.observer.query('SELECT customer, total::int AS total FROM order_totals ORDER BY customer');
  assert.deepEqual(totals.rows, [{ customer: 'ada', total: 70 }, { customer: 'bob', total: 24 }]);
});

test('every example can be run again: outbox.ts twice, consumer.ts twice, bootstrap.ts twice', async (t) => {
  const db = await testDb(t);
  await db.observer.query('DROP SCHEMA tidemark CASCADE'); // the examples migrate by themselves
  const run = async (name: string) =>
    (
      await promisify(execFile)(process.execPath, ['--import', 'tsx', new URL(`examples/${name}`, root).pathname], {
        env: { ...process.env, DATABASE_URL: db.url },
        cwd: new URL('.', root).pathname,
        timeout: 60_000,
      })
    ).stdout;
  assert.equal(await run('outbox.ts'), 'appended seq 1\nadvanced: safe_seq = 1\n');
  assert.equal(await run('outbox.ts'), 'appended seq 2\nadvanced: safe_seq = 2\n', 'a second run places another order');
  const orders = await db.observer.query('SELECT count(DISTINCT id)::int AS n FROM orders');
  assert.equal(orders.rows[0].n, 2);
  for (const pass of [1, 2]) assert.match(await run('consumer.ts'), /^ada: \d+\nbob: \d+\n/m, `consumer.ts, run ${pass}`);
  for (const pass of [1, 2]) assert.match(await run('bootstrap.ts'), /^rebuilt through seq \d+ \(cursor was \d+\)\nthen delivered 0\n$/, `bootstrap.ts, run ${pass}`);
});
