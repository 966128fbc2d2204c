/**
 * A full notification queue, on a private embedded server (PostgreSQL 17+
 * lets it be small): one listener stuck in a transaction anywhere in the
 * cluster stops the queue from draining, and a NOTIFY then makes its
 * transaction's commit fail. The NOTIFY is only a hint, so the
 * publication must go on without it.
 */
import assert from 'node:assert/strict';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import pg from 'pg';
import { createPool, migrate, Watermarker } from '../../src/index.js';
import { startEmbeddedPostgres } from '../../src/db/embedded.js';

test('a full notification queue does not stop publication: the NOTIFY is skipped', async (t) => {
  const dataDir = await mkdtemp(join(tmpdir(), 'tidemark-fault-pg-'));
  const server = await startEmbeddedPostgres({ dataDir, ephemeral: true, settings: { max_notify_queue_pages: 64, fsync: 'off' } });
  t.after(async () => {
    await server.stop();
    await rm(dataDir, { recursive: true, force: true });
  });
  const pool = createPool({ connectionString: server.url, max: 3 });
  t.after(() => pool.end());
  await migrate(pool);

  // A listener that sits in a transaction: the queue cannot drain past it.
  const stuck = new pg.Client({ connectionString: server.url });
  stuck.on('error', () => undefined);
  await stuck.connect();
  t.after(() => stuck.end());
  await stuck.query('LISTEN tidemark_watermark');
  await stuck.query('BEGIN');
  await stuck.query('SELECT 1');

  // Fill the queue until a NOTIFY is refused.
  const filler = await pool.connect();
  try {
    for (;;) {
      const refused = await filler.query(`SELECT pg_notify('filler', repeat('x', 7000))`).then(
        () => false,
        (err: { code?: string }) => err.code === '54000',
      );
      if (refused) break;
    }
  } finally {
    filler.release();
  }
  assert.ok(Number((await pool.query('SELECT pg_notification_queue_usage() AS u')).rows[0].u) > 0.9);

  await pool.query(`INSERT INTO tidemark.events (stream, kind, key) VALUES ('s', 'k', 'x')`);
  const wm = new Watermarker(pool);
  const p = await wm.step();
  assert.deepEqual([p.outcome, p.safeSeq], ['advanced', 1n]);
  await wm.close();
});
