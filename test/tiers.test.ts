import assert from 'node:assert/strict';
import { readdir, readFile } from 'node:fs/promises';
import { join, relative } from 'node:path';
import { test } from 'node:test';
import { tierOf } from './support/tiers.js';

const root = new URL('../', import.meta.url).pathname;

test('each test file has one tier, by where it is and what it starts', async () => {
  assert.equal(tierOf('test/backoff.test.ts', "import { backoffMs } from '../src/backoff.js';"), 'unit');
  assert.equal(tierOf('test/watermark/step.test.ts', "import { testDb } from '../support/db.js';"), 'integration');
  assert.equal(tierOf('test/relay/relay.test.ts', "import { testDb } from '../support/db.js';"), 'integration');
  assert.equal(tierOf('test/relay/relay-nats.test.ts', "import { testDb } from '../support/db.js';"), 'e2e');
  assert.equal(tierOf('test/cli/explain.test.ts', "import { explain } from '../../src/cli/explain.js';"), 'e2e');
  assert.equal(tierOf('test/faults/notify-queue.test.ts', ''), 'e2e');
  assert.equal(tierOf('test/readme.test.ts', ''), 'e2e');
  assert.equal(tierOf('test/readme-relay.test.ts', ''), 'e2e');
  assert.equal(tierOf('test/schema/roles.test.ts', "import { testDb } from '../support/db.js';\nimport { cli } from '../support/cli.js';"), 'e2e');
  assert.equal(tierOf('test/package.test.ts', "import { connect } from 'amqplib';"), 'e2e');

  // The suite as it is: every tier holds files, and together they are all of them.
  const files = (await readdir(join(root, 'test'), { recursive: true })).filter((f) => f.endsWith('.test.ts') && !f.startsWith('support'));
  const count = { unit: 0, integration: 0, e2e: 0 };
  for (const f of files) count[tierOf(relative(root, join(root, 'test', f)), await readFile(join(root, 'test', f), 'utf8'))] += 1;
  assert.ok(count.unit > 0 && count.integration > 0 && count.e2e > 0, JSON.stringify(count));
  assert.equal(count.unit + count.integration + count.e2e, files.length);
});
