/**
 * tidemark: a gap-free transactional outbox and change stream for PostgreSQL.
 * Explicit named exports only; test/api.test.ts snapshots this list.
 */
export { migrate, loadMigrations } from './schema/migrate.js';
export type { MigrateOptions, MigrateResult, Migration } from './schema/migrate.js';
export { append, appendMany, DEFAULT_MAX_EVENT_BYTES } from './outbox/append.js';
export type { AppendOptions, NewEvent, JsonObject } from './outbox/append.js';
export { Watermarker } from './watermark/watermarker.js';
export type { StepOptions } from './watermark/watermarker.js';
export type { WatermarkerOptions, ResolvedWatermarkerOptions } from './watermark/options.js';
export type { WatermarkProgress, StepOutcome, HeartbeatOutcome } from './watermark/progress.js';
export { createPool } from './db/pool.js';
export type { CreatePoolOptions } from './db/pool.js';
export { DEFAULT_SCHEMA, fenceKey, notifyChannel } from './db/queryable.js';
export type { Queryable } from './db/queryable.js';
export { TidemarkError, InvalidOptionsError, InvalidEventError, ClosedError } from './errors.js';
export type { TidemarkErrorCode } from './errors.js';
