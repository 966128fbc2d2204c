import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { readFile } from 'node:fs/promises';
import { after, test } from 'node:test';
import { promisify } from 'node:util';
import { closeAdmin, testDb } from './support/db.js';
import { root, runExample } from './support/examples.js';
import { Watermarker } from '../src/index.js';

// The README's commands and examples that need no broker; the relay's are
// in test/readme-relay.test.ts.

after(closeAdmin);

test('the README shows examples/outbox.ts verbatim, and it runs as shown', async (t) => {
  const readme = await readFile(new URL('README.md', root), 'utf8');
  const example = await readFile(new URL('examples/outbox.ts', root), 'utf8');
  assert.ok(readme.includes(example.trim()), 'README.md embeds examples/outbox.ts');

  const db = await testDb(t);
  await db.observer.query('DROP SCHEMA tidemark CASCADE'); // the example migrates by itself
  const stdout = await runExample('outbox.ts', { DATABASE_URL: db.url });
  assert.equal(stdout, 'appended seq 1\nadvanced: safe_seq = 1\n');
});

test('the README shows examples/consumer.ts verbatim, and it runs as shown', async (t) => {
  const readme = await readFile(new URL('README.md', root), 'utf8');
  const example = await readFile(new URL('examples/consumer.ts', root), 'utf8');
  assert.ok(readme.includes(example.trim()), 'README.md embeds examples/consumer.ts');

  const db = await testDb(t);
  await db.observer.query('DROP SCHEMA tidemark CASCADE'); // the example migrates by itself
  const run = () => runExample('consumer.ts', { DATABASE_URL: db.url });
  assert.equal(await run(), 'seq 1: order.placed ada\nseq 2: order.placed bob\nseq 3: order.placed ada\nada: 35\nbob: 12\n');
  // Run again: the durable cursor resumes after seq 3, so only the new events apply.
  assert.equal(await run(), 'seq 4: order.placed ada\nseq 5: order.placed bob\nseq 6: order.placed ada\nada: 70\nbob: 24\n');

  // The bootstrap example rebuilds the same projection and finds nothing left to deliver.
  const example2 = await readFile(new URL('examples/bootstrap.ts', root), 'utf8');
  assert.ok(readme.includes(example2.trim()), 'README.md embeds examples/bootstrap.ts');
  await db.observer.query('UPDATE order_totals SET total = 0'); // damage it: the rebuild must repair it
  const rebuilt = await runExample('bootstrap.ts', { DATABASE_URL: db.url });
  assert.equal(rebuilt, 'rebuilt through seq 6 (cursor was 6)\nthen delivered 0\n');
  const totals = await db.observer.query('SELECT customer, total::int AS total FROM order_totals ORDER BY customer');
  assert.deepEqual(totals.rows, [{ customer: 'ada', total: 70 }, { customer: 'bob', total: 24 }]);
});

test('the README shows examples/dead-letters.ts verbatim, and it prints what the README says', async (t) => {
  const readme = await readFile(new URL('README.md', root), 'utf8');
  const example = await readFile(new URL('examples/dead-letters.ts', root), 'utf8');
  assert.ok(readme.includes(example.trim()), 'README.md embeds examples/dead-letters.ts');
  const printed = /Prints, on a fresh database:\n\n```\n([^`]*)```/.exec(readme.slice(readme.indexOf('examples/dead-letters.ts')))?.[1];
  assert.ok(printed, 'the README shows what it prints');

  const db = await testDb(t);
  await db.observer.query('DROP SCHEMA tidemark CASCADE'); // the example migrates by itself
  assert.equal(await runExample('dead-letters.ts', { DATABASE_URL: db.url }), printed);
});

test('the README shows examples/tracing.ts verbatim, and it prints what the README says: the handler span is in the request\'s trace', async (t) => {
  const readme = await readFile(new URL('README.md', root), 'utf8');
  const example = await readFile(new URL('examples/tracing.ts', root), 'utf8');
  assert.ok(readme.includes(example.trim()), 'README.md embeds examples/tracing.ts');
  const printed = /Prints, on a fresh database:\n\n```\n([^`]*)```/.exec(readme.slice(readme.indexOf('examples/tracing.ts')))?.[1];
  assert.ok(printed, 'the README shows what it prints');

  const db = await testDb(t);
  await db.observer.query('DROP SCHEMA tidemark CASCADE'); // the example migrates by itself
  assert.equal(await runExample('tracing.ts', { DATABASE_URL: db.url }), printed);
  assert.equal(await runExample('tracing.ts', { DATABASE_URL: db.url }), printed, 'and again');
});

test('the README shows examples/groups.ts verbatim, and it prints what the README says', async (t) => {
  const readme = await readFile(new URL('README.md', root), 'utf8');
  const example = await readFile(new URL('examples/groups.ts', root), 'utf8');
  assert.ok(readme.includes(example.trim()), 'README.md embeds examples/groups.ts');
  const printed = /Prints, on a fresh database:\n\n```\n([^`]*)```/.exec(readme.slice(readme.indexOf('examples/groups.ts')))?.[1];
  assert.ok(printed, 'the README shows what it prints');

  const db = await testDb(t);
  await db.observer.query('DROP SCHEMA tidemark CASCADE'); // the example migrates by itself
  assert.equal(await runExample('groups.ts', { DATABASE_URL: db.url }), printed);
});

test('the README shows examples/consumer.sql verbatim, and psql runs it as shown, on the cursor consumer.ts left', async (t) => {
  const readme = await readFile(new URL('README.md', root), 'utf8');
  const example = await readFile(new URL('examples/consumer.sql', root), 'utf8');
  assert.ok(readme.includes(example.trim()), 'README.md embeds examples/consumer.sql');
  const command = 'psql "$DATABASE_URL" -v ON_ERROR_STOP=1 -f examples/consumer.sql';
  assert.ok(readme.includes(command) && example.includes(`-- Run: ${command}`), 'the README and the file show the command the test runs');

  const db = await testDb(t);
  await db.observer.query('DROP SCHEMA tidemark CASCADE'); // consumer.ts migrates, and leaves the cursor after seq 3
  const env = { ...process.env, DATABASE_URL: db.url };
  const cwd = new URL('.', root).pathname;
  await runExample('consumer.ts', { DATABASE_URL: db.url });
  await db.observer.query(
    `INSERT INTO tidemark.events (stream, kind, key, payload) VALUES ('orders', 'order.placed', 'ada', '{"total": 7}'), ('orders', 'order.placed', 'cy', '{"total": 1}')`,
  );
  const wm = new Watermarker(db.pool({ max: 1 }));
  assert.equal((await wm.step()).safeSeq, 5n);
  await wm.close();

  const run = () => promisify(execFile)('sh', ['-c', command], { env, cwd, timeout: 30_000 });
  const first = await run();
  assert.equal(first.stdout, 'BEGIN\n events | cursor \n--------+--------\n      2 |      5\n(1 row)\n\nCOMMIT\n');
  const second = await run();
  assert.match(second.stdout, /\n {6}0 \| {6}5\n/, 'the next page is empty: the cursor stays at 5');
  const totals = await db.observer.query('SELECT customer, total::int AS total FROM order_totals ORDER BY customer');
  assert.deepEqual(totals.rows, [{ customer: 'ada', total: 42 }, { customer: 'bob', total: 12 }, { customer: 'cy', total: 1 }]);
});

test('every example can be run again: outbox.ts twice, consumer.ts twice, bootstrap.ts twice', async (t) => {
  const db = await testDb(t);
  await db.observer.query('DROP SCHEMA tidemark CASCADE'); // the examples migrate by themselves
  const run = (name: string) => runExample(name, { DATABASE_URL: db.url });
  assert.equal(await run('outbox.ts'), 'appended seq 1\nadvanced: safe_seq = 1\n');
  assert.equal(await run('outbox.ts'), 'appended seq 2\nadvanced: safe_seq = 2\n', 'a second run places another order');
  const orders = await db.observer.query('SELECT count(DISTINCT id)::int AS n FROM orders');
  assert.equal(orders.rows[0].n, 2);
  for (const pass of [1, 2]) assert.match(await run('consumer.ts'), /^ada: \d+\nbob: \d+\n/m, `consumer.ts, run ${pass}`);
  for (const pass of [1, 2]) assert.match(await run('bootstrap.ts'), /^rebuilt through seq \d+ \(cursor was \d+\)\nthen delivered 0\n$/, `bootstrap.ts, run ${pass}`);
});

