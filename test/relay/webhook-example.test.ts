/**
 * examples/webhook-receiver.ts, run as its comment says (`npx tsx`, here
 * through tsx), behind `tidemark relay --to http://...` with the same
 * secret: each event printed once; a forged request, a stale one and a
 * copy of one already taken are not printed.
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { createHmac } from 'node:crypto';
import { test } from 'node:test';
import { freePort } from '../../src/db/embedded.js';
import { Watermarker } from '../../src/watermark/watermarker.js';
import { startCli, watchStderr } from '../support/cli.js';
import { closeAdmin, testDb, waitFor } from '../support/db.js';
import { root } from '../support/examples.js';

test.after(closeAdmin);

const SECRET = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';

test('examples/webhook-receiver.ts prints each relayed event once and refuses forged, stale and unsigned requests', { timeout: 120_000 }, async (t) => {
  const db = await testDb(t);
  const port = await freePort();
  const receiver = spawn(process.execPath, ['--import', 'tsx', new URL('examples/webhook-receiver.ts', root).pathname], {
    cwd: new URL('.', root).pathname,
    env: { ...process.env, TIDEMARK_WEBHOOK_SECRET: SECRET, PORT: String(port) },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  t.after(() => receiver.kill('SIGKILL'));
  let printed = '';
  receiver.stdout.on('data', (d: Buffer) => (printed += d.toString()));
  await watchStderr(receiver).next(/listening on/);

  const pool = db.pool();
  await pool.query(
    `INSERT INTO tidemark.events (stream, kind, key, payload) SELECT 'orders', 'order.placed', 'o-' || g, pg_catalog.jsonb_build_object('n', g) FROM pg_catalog.generate_series(1, 40) AS g`,
  );
  await new Watermarker(pool, { owner: 'test' }).step();
  const url = `http://127.0.0.1:${port}/hooks`;
  const relay = startCli(['relay', '--to', url, '--consumer', 'webhook', '--stream', 'orders', '--database-url', db.url, '--poll', '50ms'], { env: { TIDEMARK_WEBHOOK_SECRET: SECRET } });
  t.after(() => relay.kill('SIGKILL'));
  await waitFor('40 events printed', async () => printed.trim().split('\n').length === 40 || undefined, 60_000);
  relay.kill('SIGTERM');
  const lines = printed.trim().split('\n');
  assert.deepEqual(lines.map((l) => Number(l.split(' ')[0])).sort((a, b) => a - b), Array.from({ length: 40 }, (_, i) => i + 1), 'each seq once');
  assert.match(lines[0]!, /^\d+ orders order\.placed o-\d+: \{"n": \d+\}$/);

  const send = async (headers: Record<string, string>, body: string) => (await fetch(url, { method: 'POST', headers, body })).status;
  const key = Buffer.from(SECRET.slice(6), 'base64');
  const signed = (id: string, ts: number, body: string) => ({
    'webhook-id': id,
    'webhook-timestamp': String(ts),
    'webhook-signature': `v1,${createHmac('sha256', key).update(`${id}.${ts}.${body}`).digest('base64')}`,
    'tidemark-seq': '999',
    'tidemark-stream': 'orders',
    'tidemark-kind': 'forged',
    'tidemark-key': 'x',
  });
  const now = Math.floor(Date.now() / 1000);
  assert.equal(await send({ ...signed('a:999', now, '{}'), 'webhook-signature': 'v1,AAAA' }, '{}'), 401, 'a wrong signature');
  assert.equal(await send(signed('a:999', now, '{}'), '{"tampered": 1}'), 401, 'a body that is not the signed one');
  assert.equal(await send(signed('a:999', now - 3600, '{}'), '{}'), 401, 'an hour-old timestamp');
  assert.equal(await send({ 'content-type': 'application/json' }, '{}'), 401, 'unsigned');
  assert.equal(await send(signed('a:1000', now, '{}'), '{}'), 204, 'a valid one is taken');
  assert.equal(await send(signed('a:1000', now, '{}'), '{}'), 204, 'and its copy answered 2xx');
  await waitFor('the valid one printed', async () => printed.includes('999 orders forged x: {}') || undefined);
  assert.equal(printed.split('999 orders forged').length - 1, 1, 'a copy is not printed again');
});
