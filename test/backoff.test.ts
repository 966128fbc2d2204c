import assert from 'node:assert/strict';
import { test } from 'node:test';
import { backoffCeilingMs, backoffMs } from '../src/backoff.js';

test('the back-off ceiling doubles from the minimum with each failure in a row, up to the maximum', () => {
  assert.deepEqual([1, 2, 3, 4, 5, 6].map((a) => backoffCeilingMs(a, 100, 1000)), [100, 200, 400, 800, 1000, 1000]);
  assert.equal(backoffCeilingMs(0, 100, 1000), 100, 'before the first retry: the minimum');
  assert.equal(backoffCeilingMs(10_000, 100, 60_000), 60_000, 'a long outage: the maximum, no overflow');
  assert.equal(backoffCeilingMs(3, 100, 50), 50, 'a maximum below the minimum wins');
});

test('the pause is drawn between half the ceiling and the ceiling', () => {
  assert.equal(backoffMs(3, 100, 1000, () => 0), 200);
  assert.equal(backoffMs(3, 100, 1000, () => 0.999999), 400);
  assert.equal(backoffMs(3, 100, 1000, () => 0.5), 300);
  for (let i = 0; i < 1000; i += 1) {
    const attempt = 1 + (i % 8);
    const pause = backoffMs(attempt, 5, 300);
    const ceiling = backoffCeilingMs(attempt, 5, 300);
    assert.ok(pause >= Math.floor(ceiling / 2) && pause <= ceiling, `${pause} within [${ceiling / 2}, ${ceiling}]`);
  }
});
