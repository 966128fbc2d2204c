/**
 * The client-side JSON check (src/outbox/json.ts) against PostgreSQL itself:
 * for any text, both accept it or both refuse it, and the size the client
 * computes is the size PostgreSQL stores (octet_length(text::jsonb::text)),
 * which is what the limits of migration 0005 measure.
 */
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import fc from 'fast-check';
import { JsonProblem, scanJson } from '../../src/outbox/json.js';
import { stringify } from '../../src/outbox/stringify.js';
import { closeAdmin, testDb, type Session } from '../support/db.js';

after(closeAdmin);

const whitespace = fc.constantFrom('', '', ' ', '\n', '\t ', '\r\n  ');
const digits = (max: number) => fc.string({ unit: fc.constantFrom(...'0123456789'), minLength: 1, maxLength: max });
const exponent = fc.oneof(
  fc.integer({ min: 0, max: 400 }),
  fc.integer({ min: 16370, max: 16400 }),
  fc.integer({ min: 131060, max: 131080 }),
  fc.constant(1073741822),
  fc.constant(1073741824),
);
/** Numbers around numeric's limits as well as ordinary ones; a few are not JSON at all (`01`, `1.`). */
const number = fc
  .tuple(
    fc.constantFrom('', '-'),
    fc.oneof(fc.constant('0'), digits(25).map((d) => `1${d}`), digits(3).map((d) => `0${d}`)),
    fc.option(fc.oneof(digits(30), fc.constant('')), { nil: undefined }),
    fc.option(fc.tuple(fc.constantFrom('e', 'E'), fc.constantFrom('', '+', '-'), exponent), { nil: undefined }),
  )
  .map(([sign, int, frac, exp]) => `${sign}${int}${frac === undefined ? '' : `.${frac}`}${exp ? `${exp[0]}${exp[1]}${exp[2]}` : ''}`);

/** String bodies: plain characters (no raw surrogate halves: no UTF-8 text has them), every escape, and what PostgreSQL refuses. */
const plainChar = fc
  .oneof(fc.integer({ min: 0x20, max: 0x7f }), fc.integer({ min: 0x80, max: 0xd7ff }), fc.integer({ min: 0xe000, max: 0x10ffff }))
  .filter((c) => c !== 0x22 && c !== 0x5c)
  .map((c) => String.fromCodePoint(c));
const escape = fc.constantFrom('\\n', '\\"', '\\\\', '\\/', '\\b', '\\f', '\\r', '\\t', '\\u00e9', '\\u20AC', '\\ud83d\\ude00', '\\u0001', '\\u001f', '\\u007f');
const refused = fc.constantFrom('\\u0000', '\\ud800', '\\udc00x', '\u0001', '\\x', '\\u12');
const string = fc
  .array(fc.oneof({ weight: 8, arbitrary: plainChar }, { weight: 3, arbitrary: escape }, { weight: 1, arbitrary: refused }), { maxLength: 12 })
  .map((parts) => `"${parts.join('')}"`);
const key = fc.oneof(fc.constantFrom('"a"', '"b"', '"\\u0061"', '"k\\n"'), string);

const { value } = fc.letrec((tie) => ({
  value: fc.oneof(
    { depthSize: 'small', withCrossShrink: true },
    number,
    string,
    fc.constantFrom('true', 'false', 'null'),
    tie('array'),
    tie('object'),
  ),
  array: fc.array(fc.tuple(whitespace, tie('value'), whitespace), { maxLength: 5 }).map((items) => `[${items.map((i) => i.join('')).join(',')}]`),
  // Duplicate keys are likely: jsonb keeps the last one.
  object: fc
    .array(fc.tuple(whitespace, key, whitespace, tie('value')), { maxLength: 5 })
    .map((members) => `{${members.map(([w1, k, w2, v]) => `${w1}${k}${w2}:${v}`).join(',')}}`),
}));
const text = fc.oneof(
  { weight: 6, arbitrary: value as fc.Arbitrary<string> },
  // What the library sends: JSON.stringify of JavaScript values.
  { weight: 2, arbitrary: fc.jsonValue().map((v) => JSON.stringify(v)) },
  // Broken text: truncated, or with a stray character.
  { weight: 1, arbitrary: fc.tuple(value as fc.Arbitrary<string>, fc.nat()).map(([t, n]) => t.slice(0, n % (t.length + 1))) },
  { weight: 1, arbitrary: fc.tuple(value as fc.Arbitrary<string>, fc.constantFrom('x', ',', '}', ']', '"', ' 1')).map(([t, c]) => t + c) },
);

/** PostgreSQL's answer: the stored size, or the error's SQLSTATE. */
async function stored(session: Session, json: string): Promise<number | string> {
  try {
    const r = await session.query<{ n: number }>('SELECT octet_length($1::jsonb::text) AS n', [json]);
    return r.rows[0]!.n;
  } catch (err) {
    return (err as { code: string }).code;
  }
}

function client(json: string): number | string {
  try {
    return scanJson(json).size;
  } catch (err) {
    if (err instanceof JsonProblem) return 'refused';
    throw err;
  }
}

test('the client accepts exactly the JSON text PostgreSQL accepts, and measures it as PostgreSQL stores it (fast-check)', async (t) => {
  const db = await testDb(t);
  await fc.assert(
    fc.asyncProperty(text, async (json) => {
      const server = await stored(db.observer, json);
      const mine = client(json);
      if (typeof server === 'number') assert.equal(mine, server, `size of ${JSON.stringify(json)}`);
      else assert.equal(mine, 'refused', `PostgreSQL refused ${JSON.stringify(json)} (${server})`);
    }),
    { numRuns: 1500 },
  );
});

test('numbers are measured as numeric prints them, up to numeric\'s limits', async (t) => {
  const db = await testDb(t);
  for (const json of ['1e400', '12345678901234567890', '1.50', '-0', '-0.0', '1.5e-7', '1e131071', '1e131072', '1e-16383', '1e-16384', '0e-16383', '0.0e-16383', '0e1073741822', '9.99e131070']) {
    assert.equal(client(json), await stored(db.observer, json) === '22003' ? 'refused' : await stored(db.observer, json), json);
  }
});

test('stringify refuses NaN, Infinity and BigInt at their path, and leaves the rest to JSON.stringify', () => {
  assert.throws(() => stringify({ a: [1, { b: NaN }] }), (err: unknown) => err instanceof JsonProblem && err.path === '$.a[1].b');
  assert.throws(() => stringify({ 'odd key': Infinity }), (err: unknown) => err instanceof JsonProblem && err.path === '$["odd key"]');
  assert.throws(() => stringify({ n: 1n }), (err: unknown) => err instanceof JsonProblem && err.path === '$.n');
  assert.equal(stringify({ a: null, b: undefined, d: new Date(0) }), '{"a":null,"d":"1970-01-01T00:00:00.000Z"}');
  assert.equal(stringify(undefined), undefined);
});
