import assert from 'node:assert/strict';
import { test } from 'node:test';
import * as api from '../src/index.js';

test('the public exports change only on purpose', () => {
  assert.deepEqual(Object.keys(api).sort(), [
    'ClosedError',
    'DEFAULT_MAX_EVENT_BYTES',
    'DEFAULT_SCHEMA',
    'InvalidEventError',
    'InvalidOptionsError',
    'TidemarkError',
    'Watermarker',
    'append',
    'appendMany',
    'createPool',
    'fenceKey',
    'loadMigrations',
    'migrate',
    'notifyChannel',
  ]);
});
