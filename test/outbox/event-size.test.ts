/**
 * The size bound eventFromValue trusts for a payload or headers written by
 * JSON.stringify with no escape (src/outbox/event.ts): at most
 * MAX_RENDERED_BYTES_PER_UNIT bytes of PostgreSQL's rendering per UTF-16
 * unit. scanJson measures the rendering exactly (test/outbox/json.test.ts
 * holds it to PostgreSQL's octet_length(text::jsonb::text)); here the bound
 * is held to scanJson, and the limits to the exact size either side of it.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import fc from 'fast-check';
import { InvalidEventError } from '../../src/errors.js';
import { eventFromValue, MAX_RENDERED_BYTES_PER_UNIT } from '../../src/outbox/event.js';
import { scanJson } from '../../src/outbox/json.js';

/** Doubles numeric renders longest: subnormals, the extremes, and everything between. */
const number = fc.oneof(
  fc.double({ noNaN: true, noDefaultInfinity: true }),
  fc.constantFrom(5e-324, -5e-324, 1e-323, 2.2250738585072014e-308, 1e308, -1.7976931348623157e308, 1e21, 1e-7, 0.1, -0),
  fc.integer(),
);
const text = fc.oneof(fc.string({ unit: 'grapheme', maxLength: 8 }), fc.string({ unit: 'binary', maxLength: 8 }));
const value = fc.letrec((tie) => ({
  leaf: fc.oneof(number, text, fc.boolean(), fc.constant(null)),
  node: fc.oneof({ depthSize: 'small' }, tie('leaf'), fc.array(tie('node'), { maxLength: 4 }), fc.dictionary(text, tie('node'), { maxKeys: 4 })),
})).node;
const object = fc.oneof(
  fc.dictionary(text, value, { maxKeys: 6 }),
  // Numbers side by side, the densest rendering there is.
  fc.array(fc.constantFrom(5e-324, -5e-324, 1e-323, 1e308), { minLength: 1, maxLength: 300 }).map((n) => ({ n })),
);

test('JSON.stringify text with no escape renders at most MAX_RENDERED_BYTES_PER_UNIT bytes a unit', () => {
  fc.assert(
    fc.property(object, (o) => {
      const json = JSON.stringify(o);
      fc.pre(!json.includes('\\'));
      assert.ok(scanJson(json).size <= json.length * MAX_RENDERED_BYTES_PER_UNIT, json);
    }),
    { numRuns: 5000 },
  );
  // The worst a unit gets: a subnormal's digits.
  for (const n of [5e-324, -5e-324, 1e308]) {
    const json = JSON.stringify({ n });
    assert.ok(scanJson(json).size <= json.length * MAX_RENDERED_BYTES_PER_UNIT);
  }
  const worst = scanJson('5e-324').size / '5e-324'.length;
  assert.ok(worst > 54 && MAX_RENDERED_BYTES_PER_UNIT < 2 * worst, 'the bound is within twice the worst');
});

test('a bound over the limit is measured: an event within the limit is taken, one over it refused with its exact size', () => {
  // 1,000 numbers 5e-324: the bound is far over 64 kB; the exact size is 1,000 x 326 bytes and separators.
  const payload = { n: Array.from({ length: 1000 }, () => 5e-324) };
  const exact = scanJson(JSON.stringify(payload)).size;
  assert.ok(JSON.stringify(payload).length * MAX_RENDERED_BYTES_PER_UNIT > exact);
  assert.equal(eventFromValue({ stream: 's', kind: 'k', key: 'a', payload }, 0, exact + 2).payload, JSON.stringify(payload));
  assert.throws(
    () => eventFromValue({ stream: 's', kind: 'k', key: 'a', payload }, 3, exact + 1),
    (err: unknown) => err instanceof InvalidEventError && err.message.includes(`payload and headers are ${exact + 2} bytes as stored, over the limit of ${exact + 1}`),
  );
  // Small enough that the bound alone shows it within the limit: taken without measuring.
  assert.equal(eventFromValue({ stream: 's', kind: 'k', key: 'a', payload: { id: 1 } }, 0, 1024).payload, '{"id":1}');
});
