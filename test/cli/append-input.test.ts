/**
 * `tidemark append` input: invalid events exit 2 (INVALID_EVENT) before
 * anything is written, and JSON text reaches PostgreSQL as written.
 */
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { closeAdmin, testDb } from '../support/db.js';
import { cli } from '../support/cli.js';

after(closeAdmin);

const event = (key: string, extra = '') => `{"stream":"s","kind":"k","key":"${key}"${extra}}`;

async function eventCount(db: Awaited<ReturnType<typeof testDb>>): Promise<number> {
  return (await db.observer.query('SELECT count(*)::int AS n FROM tidemark.events')).rows[0].n;
}

test('invalid events exit 2 (INVALID_EVENT), from flags and from NDJSON, before anything is written', async (t) => {
  const db = await testDb(t);
  const env = { DATABASE_URL: db.url };
  const cases: [string[], string, RegExp][] = [
    [['--stream', 's'.repeat(300), '--kind', 'k', '--key', 'x'], '', /^tidemark: --stream: is 300 characters \(UTF-16 code units\) long, over the limit of 200\n$/],
    [['--stream', 's', '--kind', 'k', '--key', 'k'.repeat(100_000)], '', /^tidemark: --key: is 100000 characters/],
    [['--ndjson'], `${event('k'.repeat(2 * 1024 * 1024))}\n`, /^tidemark: line 1: key: is 2097152 characters .* over the limit of 256; nothing was written\n$/],
    [['--stream', 's', '--kind', 'k', '--key', 'x', '--payload', '{"a":"\\ud800"}'], '', /^tidemark: --payload: \$\.a contains a lone UTF-16 surrogate/],
    [['--stream', 's', '--kind', 'k', '--key', 'x', '--payload', '{"a":'], '', /^tidemark: --payload: is not valid JSON: the text ends/],
    [['--ndjson'], '{"stream":"s","kind":"k","key":"x","payload":{"n":"\\u0000"}}\n', /^tidemark: line 1: payload: \$\.n contains \\u0000/],
    [['--ndjson'], '{"stream":"s","kind":"k","key":"x","payload":{"n":1e200000}}\n', /^tidemark: line 1: payload: \$\.n holds a number PostgreSQL's numeric cannot hold/],
    [['--ndjson'], '{"stream":"s","kind":"k",\n', /^tidemark: line 1: is not valid JSON/],
    [['--ndjson'], `${event('x', ',"headers":[1]')}\n`, /^tidemark: line 1: headers: must be a JSON object; nothing was written\n$/],
  ];
  for (const [args, input, stderr] of cases) {
    const r = await cli(['append', ...args], { env, input });
    assert.equal(r.code, 2, `${args.join(' ').slice(0, 80)}: ${r.stderr}`);
    assert.match(r.stderr, stderr);
    assert.equal(r.stderr.split('\n').length, 2, 'one line');
  }
  assert.equal(await eventCount(db), 0);
});

test('append passes JSON text through: PostgreSQL reads 1e400, 12345678901234567890 and 1.50 itself', async (t) => {
  const db = await testDb(t);
  const env = { DATABASE_URL: db.url };
  const payload = '{"huge":1e400,"big":12345678901234567890,"price":1.50,"tiny":1e-400}';
  const r1 = await cli(['append', '--ndjson'], { env, input: `${event('line', `,"payload":${payload},"headers":{"id":98765432109876543210}`)}\n` });
  const r2 = await cli(['append', '--stream', 's', '--kind', 'k', '--key', 'flags', '--payload', payload], { env });
  assert.deepEqual([r1.code, r2.code, r1.stderr + r2.stderr], [0, 0, '']);
  const rows = await db.observer.query(
    `SELECT key, payload->>'huge' AS huge, payload->>'big' AS big, payload->>'price' AS price, payload->>'tiny' AS tiny, headers->>'id' AS id
       FROM tidemark.events ORDER BY seq`,
  );
  for (const row of rows.rows) {
    assert.equal(row.huge, `1${'0'.repeat(400)}`);
    assert.equal(row.big, '12345678901234567890');
    assert.equal(row.price, '1.50');
    assert.equal(row.tiny, `0.${'0'.repeat(399)}1`);
  }
  assert.equal(rows.rows[0].id, '98765432109876543210');
});
