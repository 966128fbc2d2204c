import assert from 'node:assert/strict';
import { test } from 'node:test';
import * as api from '../src/index.js';

test('the public exports change only on purpose', () => {
  assert.deepEqual(Object.keys(api).sort(), [
    'CONNECTION_DEFAULTS',
    'ClosedError',
    'ConnectionLostError',
    'CursorContentionError',
    'DEFAULT_MAX_EVENT_BYTES',
    'DEFAULT_RETENTION_MS',
    'DEFAULT_SCHEMA',
    'EVENT_LIMITS',
    'FenceBusyError',
    'HandlerError',
    'HttpSink',
    'InexactNumberError',
    'InvalidEventError',
    'InvalidOptionsError',
    'MIN_RETENTION_MS',
    'MissingPackageError',
    'NatsSink',
    'NoResponseError',
    'OwnerInUseError',
    'Pruner',
    'RabbitMqSink',
    'RedisSink',
    'Relay',
    'ResyncRequiredError',
    'SinkError',
    'StreamClient',
    'TidemarkError',
    'Watermarker',
    'append',
    'appendMany',
    'createMetrics',
    'createPool',
    'discardDeadLetters',
    'fenceKey',
    'isRetryable',
    'listDeadLetters',
    'loadMigrations',
    'migrate',
    'notifyChannel',
    'readStatus',
    'repartitionGroup',
    'replayDeadLetters',
    'stepBucketMs',
    'wakeChannel',
  ]);
});

test('tidemark/embedded exports the throwaway server, and only that', async () => {
  const embedded = await import('tidemark/embedded');
  assert.deepEqual(Object.keys(embedded).sort(), ['freePort', 'startEmbeddedPostgres']);
});
