/**
 * A prepared writer across a crash-restart, on a private embedded server
 * (never the shared one): the restart renames the prepared transaction in
 * pg_locks (from its backend's virtualtransaction to -1/<xid>), and
 * pg_postmaster_start_time() stays the same, so an observation taken before
 * the crash could look cleared. A holder without a backend must block
 * every observation.
 */
import assert from 'node:assert/strict';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import pg from 'pg';
import { createPool, migrate, Watermarker } from '../../src/index.js';
import { startEmbeddedPostgres } from '../../src/db/embedded.js';
import { waitFor } from '../support/db.js';

test('a prepared writer observed before a crash-restart still holds safe_seq back after it, until COMMIT PREPARED', async (t) => {
  const dataDir = await mkdtemp(join(tmpdir(), 'tidemark-fault-pg-'));
  const server = await startEmbeddedPostgres({
    dataDir,
    ephemeral: true,
    settings: { max_prepared_transactions: 4, fsync: 'off', restart_after_crash: 'on' },
  });
  t.after(async () => {
    await server.stop();
    await rm(dataDir, { recursive: true, force: true });
  });
  const connect = async (name: string) => {
    const c = new pg.Client({ connectionString: server.url, application_name: name });
    c.on('error', () => undefined);
    await c.connect();
    return c;
  };
  const setup = new pg.Pool({ connectionString: server.url, max: 1 });
  await migrate(setup);
  await setup.end();

  const insert = (c: pg.Client) => c.query(`INSERT INTO tidemark.events (stream, kind, key) VALUES ('s', 'k', 'x') RETURNING seq`);
  const preparer = await connect('preparer');
  await preparer.query('BEGIN');
  assert.equal((await insert(preparer)).rows[0].seq, '1');
  const writer = await connect('writer');
  assert.equal((await insert(writer)).rows[0].seq, '2');
  await writer.end();

  // An observation (seq 2, held back by the preparer's virtualtransaction) is stored...
  const before = createPool({ connectionString: server.url, max: 2 }); // its idle connections die in the crash
  const wm1 = new Watermarker(before, { owner: 'wm', leaseTtlMs: 600_000 });
  const p1 = await wm1.step();
  assert.deepEqual([p1.outcome, p1.safeSeq, p1.pending], ['pending', 0n, 1]);
  const vxid = (await before.query(`SELECT (candidates[1]).holders[1] AS h FROM tidemark.watermark`)).rows[0].h;
  await preparer.query(`PREPARE TRANSACTION 'held-across-crash'`);
  await preparer.end();
  const epoch = (await before.query('SELECT pg_postmaster_start_time() AS t')).rows[0].t;

  // ...then a backend crashes, and the postmaster ends every other backend
  // (the sentinel's too) and reinitialises shared memory.
  const sentinel = await connect('sentinel');
  const sentinelEnded = new Promise((resolve) => sentinel.once('end', resolve));
  const victim = await connect('victim');
  const pid = (await victim.query('SELECT pg_backend_pid() AS pid')).rows[0].pid as number;
  process.kill(pid, 'SIGKILL');
  await sentinelEnded;
  await before.end().catch(() => undefined);
  const observer = await waitFor('the server to accept connections after crash recovery', async () => connect('observer').catch(() => undefined), 60_000);
  t.after(() => observer.end());
  const lock = (await observer.query(`SELECT virtualtransaction, pid FROM pg_locks WHERE locktype = 'advisory'`)).rows;
  assert.equal(lock.length, 1);
  assert.equal(lock[0].pid, null);
  assert.notEqual(lock[0].virtualtransaction, vxid, 'the recovered prepared transaction has another name in pg_locks');
  assert.deepEqual((await observer.query('SELECT pg_postmaster_start_time() AS t')).rows[0].t, epoch, 'and the epoch tag did not change');

  const after = createPool({ connectionString: server.url, max: 2 });
  t.after(() => after.end());
  const wm2 = new Watermarker(after, { owner: 'wm', leaseTtlMs: 600_000 });
  for (let i = 0; i < 3; i += 1) {
    const p = await wm2.step();
    assert.deepEqual([p.outcome, p.safeSeq], ['pending', 0n], 'the recovered prepared seq 1 still holds safe_seq back');
  }
  await observer.query(`COMMIT PREPARED 'held-across-crash'`);
  const done = await wm2.step();
  // Crash recovery moved the sequence to the value its WAL had logged ahead
  // (up to 32 past the last number drawn): numbers that will never exist.
  const last = (await observer.query(`SELECT pg_sequence_last_value('tidemark.events_seq_seq') AS s`)).rows[0].s;
  assert.deepEqual([done.outcome, done.safeSeq], ['advanced', BigInt(last)]);
  assert.ok(done.safeSeq >= 2n);
  const visible = (await observer.query('SELECT array_agg(seq::int ORDER BY seq) AS s FROM tidemark.events')).rows[0].s;
  assert.deepEqual(visible, [1, 2], 'the prepared seq 1 is visible now, with seq 2');
  await wm2.close();
});
