/** A misspelt option is refused by name at every entry point, never ignored. */
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import pg from 'pg';
import { createMetrics, createPool, InvalidOptionsError, MissingPackageError, migrate, StreamClient, Watermarker } from '../src/index.js';
import { importOptional, loadOnce, redactUrl, retryOptions } from '../src/options.js';
import { closeAdmin, testDb } from './support/db.js';

after(closeAdmin);

const refused = (name: string) => (err: unknown) => err instanceof InvalidOptionsError && err.option === name && err.message.includes(`${name}: is not a `);

test('createPool, migrate, createMetrics and StreamClient.tail/drain/bootstrap refuse an unknown option by name', async (t) => {
  assert.throws(() => createPool({ bogus: 1 } as never), refused('bogus'));
  assert.throws(() => createPool({ connectionString: 'postgres://x/y', idleInTransactionTimeoutMS: 5 } as never), refused('idleInTransactionTimeoutMS'));
  createPool({ connectionString: 'postgres://x/y', max: 2, application_name: 'a', keepAlive: true }).end().catch(() => undefined);

  const db = await testDb(t);
  const pool = db.pool();
  await assert.rejects(migrate(pool, { dryrun: true } as never), refused('dryrun'));
  await assert.rejects(migrate(pool, { dryRun: 'yes' } as never), (err: unknown) => err instanceof InvalidOptionsError && err.option === 'dryRun');
  assert.throws(() => createMetrics({ pool, procesMetrics: false } as never), refused('procesMetrics'));

  const client = new StreamClient(pool, { listen: false });
  t.after(() => client.close());
  const handler = () => undefined;
  await assert.rejects(client.tail('c', 's', handler, { singal: AbortSignal.abort() } as never), refused('singal'));
  await assert.rejects(client.drain('c', 's', handler, { max: 1 } as never), refused('max'));
  await assert.rejects(client.bootstrap('c', 's', { timeout: 5 } as never), refused('timeout'));
  assert.deepEqual(await client.drain('c', 's', handler, { maxEvents: 1 }), { delivered: 0, cursor: 0n, safeSeq: 0n }, 'known options still work');
});

test('every entry point that takes a pool refuses something else by name', async () => {
  const { Pruner, Relay, Watermarker } = await import('../src/index.js');
  const { setCursor, deleteCursor } = await import('../src/consumer/cursors.js');
  const notPool = { query: () => undefined } as never;
  for (const make of [() => new Watermarker(notPool), () => new Pruner(notPool), () => new StreamClient(notPool), () => new Relay(notPool, {} as never, { consumer: 'c', streams: ['s'] })]) {
    assert.throws(make, (err: unknown) => err instanceof InvalidOptionsError && err.option === 'pool');
  }
  await assert.rejects(setCursor(notPool, 'c', 's', 'now'), (err: unknown) => err instanceof InvalidOptionsError && err.option === 'pool');
  await assert.rejects(deleteCursor(notPool, 'c', 's'), (err: unknown) => err instanceof InvalidOptionsError && err.option === 'pool');
});


test('redactUrl hides a URL\'s password, or a bare token, whatever characters it holds; a URL without credentials is left as it is', () => {
  assert.equal(redactUrl('amqp://guest:guest@127.0.0.1:5672/vhost'), 'amqp://guest:***@127.0.0.1:5672/vhost');
  assert.equal(redactUrl('amqp://u:p@ss/w:rd@host'), 'amqp://u:***@host', 'a password holding @, / and :');
  assert.equal(redactUrl('nats://s3cret-token@host:4222'), 'nats://***@host:4222');
  assert.equal(redactUrl('nats://127.0.0.1:4222'), 'nats://127.0.0.1:4222');
  assert.equal(redactUrl('amqp//x:y@z'), 'amqp//x:***@z', 'text that does not parse as a URL');
});

test('importOptional: a package that is not installed is a MissingPackageError naming it and how to install it; one that is, loads', async () => {
  await assert.rejects(importOptional('tidemark-no-such-package', 'a feature'), (err: unknown) => {
    assert.ok(err instanceof MissingPackageError);
    assert.equal(err.code, 'MISSING_PACKAGE');
    assert.equal(err.packageName, 'tidemark-no-such-package');
    assert.equal(err.message, 'a feature needs the tidemark-no-such-package package, which is not installed: npm install tidemark-no-such-package');
    return true;
  });
  // A failure inside a package that is there is not mistaken for its absence.
  const inside = Object.assign(new Error("Cannot find package 'something-it-needs'"), { code: 'ERR_MODULE_NOT_FOUND' });
  await assert.rejects(importOptional('fast-check', 'a feature', () => Promise.reject(inside)), (err) => err === inside);
  assert.equal(typeof (await importOptional<{ assert: unknown }>('fast-check', 'a feature')).assert, 'function');
});

test('loadOnce: loads on the first call only, concurrent callers share it, a failure is tried again, and get() needs a load first', async () => {
  let calls = 0;
  let fail = true;
  const once = loadOnce('the thing', async () => {
    calls += 1;
    if (fail) throw new Error('not yet');
    return { n: calls };
  });
  assert.throws(() => once.get(), /^Error: tidemark: the thing used before it was loaded$/);
  await assert.rejects(Promise.all([once.load(), once.load()]), /not yet/);
  assert.equal(calls, 1, 'concurrent callers share one attempt');
  fail = false;
  const [a, b] = await Promise.all([once.load(), once.load()]);
  assert.equal(a, b);
  assert.deepEqual(once.get(), { n: 2 });
  await once.load();
  assert.equal(calls, 2, 'loaded once, kept');
});

test('retryOptions: the defaults, the bounds, and a maximum below the minimum refused by name', () => {
  const defaults = { minMs: 100, maxMs: (min: number) => Math.max(5000, min) };
  assert.deepEqual(retryOptions({}, defaults, 3_600_000), { retryMinMs: 100, retryMaxMs: 5000 });
  assert.deepEqual(retryOptions({ retryMinMs: 9000 }, defaults, 3_600_000), { retryMinMs: 9000, retryMaxMs: 9000 }, 'the default maximum follows a larger minimum');
  assert.throws(() => retryOptions({ retryMinMs: 500, retryMaxMs: 200 }, defaults, 3_600_000), { option: 'retryMaxMs', message: 'retryMaxMs: must be at least retryMinMs (500), got 200' });
  assert.throws(() => retryOptions({ retryMinMs: 0 }, defaults, 3_600_000), { option: 'retryMinMs' });
  assert.throws(() => retryOptions({ retryMaxMs: 3_600_001 }, defaults, 3_600_000), { option: 'retryMaxMs' });
  // The loops that retry check their pair through it. A pool that never connects: options are checked first.
  const pool = new pg.Pool({ connectionString: 'postgres://nobody@127.0.0.1:1/none' });
  for (const make of [() => new Watermarker(pool, { retryMinMs: 500, retryMaxMs: 200 }), () => new StreamClient(pool, { retryMinMs: 500, retryMaxMs: 200 })]) {
    assert.throws(make, { option: 'retryMaxMs' });
  }
});
