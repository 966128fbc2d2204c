/** `tidemark watermark --once` beside an active watermarker. */
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { Watermarker } from '../../src/watermark/watermarker.js';
import { cli } from '../support/cli.js';
import { closeAdmin, testDb } from '../support/db.js';

after(closeAdmin);

test('watermark --once while another process holds the lease prints the real safe_seq and who holds it', async (t) => {
  const db = await testDb(t);
  const env = { DATABASE_URL: db.url };
  await cli(['append', '--ndjson'], { env, input: '{"stream":"s","kind":"k","key":"1"}\n{"stream":"s","kind":"k","key":"2"}\n{"stream":"s","kind":"k","key":"3"}\n' });
  // The active watermarker (as `serve` runs it): it holds the lease and published seq 3.
  const active = new Watermarker(db.pool(), { owner: 'node-a', leaseTtlMs: 600_000 });
  db.defer(() => active.close());
  assert.deepEqual([(await active.step()).safeSeq, active.isLeader], [3n, true]);

  const step = await cli(['watermark', '--once'], { env });
  assert.equal(step.code, 0, step.stderr);
  assert.match(step.stdout, /^not_leader: safe_seq 3 \(the lease is held by node-a until \S+; this step published nothing\)$/m);
  const json = JSON.parse((await cli(['watermark', '--once', '--json'], { env })).stdout);
  assert.deepEqual([json.outcome, json.safeSeq, json.leaseOwner], ['not_leader', '3', 'node-a']);
});
