import assert from 'node:assert/strict';
import { test } from 'node:test';
import { RetryLines } from '../../src/cli/retry-lines.js';

test('a retrying command writes a line when a failure begins or changes, then at attempts 2, 4, 8, ..., and one when it goes on', () => {
  const lines: string[] = [];
  const retries = new RetryLines((line) => lines.push(line));
  for (let attempt = 1; attempt <= 20; attempt += 1) retries.failed('the database is down', attempt);
  retries.failed('too many connections', 21);
  retries.failed('too many connections', 22);
  retries.succeeded();
  retries.succeeded();
  retries.failed('the database is down', 1);
  assert.deepEqual(lines, [
    'the database is down; retrying (attempt 1)',
    'the database is down; retrying (attempt 2)',
    'the database is down; retrying (attempt 4)',
    'the database is down; retrying (attempt 8)',
    'the database is down; retrying (attempt 16)',
    'too many connections; retrying (attempt 21)',
    'going on after 22 failed attempts',
    'the database is down; retrying (attempt 1)',
  ]);
});
