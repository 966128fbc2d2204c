/**
 * tidemark: a gap-free transactional outbox and change stream for PostgreSQL.
 * Explicit named exports only; test/api.test.ts snapshots this list.
 */
export { migrate, loadMigrations } from './schema/migrate.js';
export type { MigrateOptions, MigrateResult, Migration } from './schema/migrate.js';
export { append, appendMany, DEFAULT_MAX_EVENT_BYTES } from './outbox/append.js';
export { EVENT_LIMITS } from './outbox/limits.js';
export type { AppendOptions, NewEvent, JsonObject } from './outbox/append.js';
export { Watermarker } from './watermark/watermarker.js';
export type { StepOptions } from './watermark/watermarker.js';
export type { WatermarkerOptions, ResolvedWatermarkerOptions } from './watermark/options.js';
export type {
  WatermarkProgress,
  WatermarkRunSummary,
  WatermarkerEvent,
  StepOutcome,
  HolderPath,
  RunEndReason,
  HeartbeatOutcome,
} from './watermark/progress.js';
export { stepBucketMs } from './watermark/progress.js';
export { StreamClient } from './consumer/stream-client.js';
export type { TailOptions, DrainOptions, DrainResult, PageInfo } from './consumer/stream-client.js';
export type { GroupOptions } from './consumer/group.js';
export { repartitionGroup } from './consumer/repartition.js';
export type { RepartitionOptions, RepartitionResult, RepartitionState } from './consumer/repartition.js';
export type { FailurePolicy } from './consumer/failures.js';
export { listDeadLetters, replayDeadLetters, discardDeadLetters } from './consumer/dead-letters.js';
export type { DeadLetter, DeadLetterFilter } from './consumer/dead-letters.js';
export type { StreamClientOptions, ResolvedStreamClientOptions } from './consumer/options.js';
export type { BootstrapSnapshot } from './consumer/bootstrap.js';
export type { StreamEvent, Transaction, Handler, HandlerContext, WakeReason, ConsumerEvent } from './consumer/events.js';
export { Relay } from './relay/relay.js';
export type { RelayLag } from './relay/relay.js';
export type { RelayOptions, ResolvedRelayOptions } from './relay/options.js';
export type { RelayEvent } from './relay/events.js';
export type { Sink, SinkTarget, SinkRetry, RelayMessage } from './relay/sink.js';
export { NatsSink } from './relay/sinks/nats/sink.js';
export type { NatsSinkOptions } from './relay/sinks/nats/sink.js';
export { RabbitMqSink } from './relay/sinks/rabbitmq/sink.js';
export type { RabbitMqSinkOptions } from './relay/sinks/rabbitmq/sink.js';
export { RedisSink } from './relay/sinks/redis/sink.js';
export type { RedisSinkOptions } from './relay/sinks/redis/sink.js';
export { HttpSink } from './relay/sinks/http/sink.js';
export type { HttpSinkOptions } from './relay/sinks/http/sink.js';
export { Pruner } from './retention/pruner.js';
export type { PruneResult } from './retention/options.js';
export { DEFAULT_RETENTION_MS, MIN_RETENTION_MS } from './retention/options.js';
export type { PrunerOptions, ResolvedPrunerOptions } from './retention/options.js';
export { createMetrics } from './observability/metrics.js';
export type { MetricsOptions, TidemarkMetrics } from './observability/metrics.js';
export { readStatus } from './observability/status.js';
export type { TidemarkStatus, ReadStatusOptions, BlockingWriter } from './observability/status.js';
export { createPool, CONNECTION_DEFAULTS } from './db/pool.js';
export { NoResponseError } from './db/deadline.js';
export type { CreatePoolOptions } from './db/pool.js';
export { DEFAULT_SCHEMA, fenceKey, notifyChannel, wakeChannel } from './db/queryable.js';
export type { Queryable } from './db/queryable.js';
export {
  TidemarkError,
  InvalidOptionsError,
  InvalidEventError,
  ClosedError,
  ResyncRequiredError,
  CursorContentionError,
  HandlerError,
  FenceBusyError,
  ConnectionLostError,
  SinkError,
  InexactNumberError,
  OwnerInUseError,
  MissingPackageError,
  isRetryable,
} from './errors.js';
export type { TidemarkErrorCode } from './errors.js';
