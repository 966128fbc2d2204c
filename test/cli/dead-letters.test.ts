/**
 * `tidemark dead-letters list|replay|discard`: what a consumer set aside,
 * administered from the command line; a replay is delivered by the
 * consumer's own tail, a discard leaves the event skipped.
 */
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { StreamClient, Watermarker, type ConsumerEvent } from '../../src/index.js';
import { cli } from '../support/cli.js';
import { closeAdmin, testDb, type TestDb } from '../support/db.js';
import { Recorder } from '../support/latch.js';

after(closeAdmin);

/** Four events on stream s; a consumer whose handler refuses those with "poison" sets them (2 and 4) aside. */
async function seed(db: TestDb, client: StreamClient): Promise<void> {
  await db.observer.query(
    `INSERT INTO tidemark.events (stream, kind, key, payload) VALUES
       ('s', 'order.placed', 'o-1', '{}'), ('s', 'order.placed', 'o-2', '{"poison": 1}'),
       ('s', 'order.placed', 'o-3', '{}'), ('s', 'order.paid', 'o-2', '{"poison": 2}')`,
  );
  const watermarker = new Watermarker(db.pool());
  assert.equal((await watermarker.step()).outcome, 'advanced');
  await watermarker.close();
  await client.drain(
    'billing',
    's',
    async (e) => {
      if (e.payloadText.includes('poison')) throw new Error(`cannot bill ${e.key}`);
    },
    { failures: { onExhausted: 'dead-letter' } },
  );
}

test('dead-letters list shows what a consumer set aside; replay asks its tail to deliver them again; discard deletes them', async (t) => {
  const db = await testDb(t);
  const env = { DATABASE_URL: db.url };
  const events = new Recorder<ConsumerEvent>();
  const client = new StreamClient(db.pool(), { listen: false, observer: events.push });
  db.defer(() => client.close());
  await seed(db, client);

  const list = await cli(['dead-letters', 'list', '--json'], { env });
  assert.equal(list.code, 0, list.stderr);
  const letters = JSON.parse(list.stdout) as Record<string, unknown>[];
  assert.deepEqual(
    letters.map((d) => [d.consumer, d.stream, d.seq, d.key, d.kind, d.payloadText, d.attempts, d.lastError, d.replayRequestedAt]),
    [
      ['billing', 's', '2', 'o-2', 'order.placed', '{"poison": 1}', 1, 'Error: cannot bill o-2', null],
      ['billing', 's', '4', 'o-2', 'order.paid', '{"poison": 2}', 1, 'Error: cannot bill o-2', null],
    ],
  );
  const [first, second] = letters.map((d) => d.id as string);
  const text = await cli(['dead-letters', 'list', '--consumer', 'billing'], { env });
  assert.equal(text.code, 0, text.stderr);
  assert.match(text.stdout, /^id +consumer +stream +seq +key +kind +tries +dead since +replay +last error\n/);
  assert.match(text.stdout, new RegExp(`\\n${first} +billing +s +2 +o-2 +order\\.placed +1 +\\S+ +- +Error: cannot bill o-2\\n`));
  const none = await cli(['dead-letters', 'list', '--consumer', 'audit'], { env });
  assert.equal(none.stdout, '(no dead letters)\n');

  // Refused before anything connects.
  const offline = { DATABASE_URL: 'postgres://nobody@127.0.0.1:1/none' };
  for (const [args, message] of [
    [['replay'], 'name the dead letters: their ids (see `tidemark dead-letters list`), or --all with --consumer'],
    [['replay', '--all'], '--all: give --consumer (and --stream) too'],
    [['replay', 'x1'], 'expected dead letter ids (positive integers, as list shows them), got "x1"'],
    [['discard', '1', '--all', '--consumer', 'billing'], '--all: give ids or --all, not both'],
    [['list', '--stream', 's'], '--stream: give --consumer too'],
  ] as const) {
    const r = await cli(['dead-letters', ...args], { env: offline });
    assert.equal(r.code, 2, args.join(' '));
    assert.equal(r.stderr, `tidemark: ${message}\n`);
  }

  const replay = await cli(['dead-letters', 'replay', first!], { env });
  assert.equal(replay.code, 0, replay.stderr);
  assert.equal(replay.stdout, "asked to replay 1 dead letter: each consumer's tail with the dead-letter policy delivers them again, oldest first\n");
  const asked = JSON.parse((await cli(['dead-letters', 'list', '--json'], { env })).stdout) as Record<string, unknown>[];
  assert.ok(asked[0]!.replayRequestedAt !== null && asked[1]!.replayRequestedAt === null);

  // The consumer's next drain delivers the replay (its handler now bills o-2), then nothing new.
  const handled: string[] = [];
  await client.drain('billing', 's', async (e) => void handled.push(`${e.seq}:${e.payloadText}`), { failures: { onExhausted: 'dead-letter' } });
  assert.deepEqual(handled, ['2:{"poison": 1}']);

  const discard = await cli(['dead-letters', 'discard', '--all', '--consumer', 'billing', '--stream', 's', '--json'], { env });
  assert.equal(discard.code, 0, discard.stderr);
  assert.deepEqual((JSON.parse(discard.stdout) as { id: string }[]).map((d) => d.id), [second]);
  assert.equal((await cli(['dead-letters', 'list'], { env })).stdout, '(no dead letters)\n');
  const again = await cli(['dead-letters', 'discard', second!], { env });
  assert.equal(again.stdout, 'no such dead letters; nothing discarded\n');
});
