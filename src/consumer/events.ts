import type pg from 'pg';
import type { JsonObject } from '../outbox/append.js';

/** One event as delivered to a handler. */
export interface StreamEvent {
  /** Global, gap-free delivery order. */
  seq: bigint;
  /** The stream followed. */
  stream: string;
  /** Event type, e.g. `order.placed`. */
  kind: string;
  /** Entity reference, e.g. the order id. */
  key: string;
  /**
   * Event body, parsed from `payloadText`. A number that a JavaScript
   * number cannot hold exactly (an integer beyond 2^53 such as
   * `12345678901234567890`, `1e400`, `1e-400`) is never changed: reading
   * `payload` of such an event throws `InexactNumberError`; use
   * `payloadText`.
   */
  readonly payload: JsonObject;
  /** The payload as PostgreSQL's own text (`payload::text`), byte for byte. */
  readonly payloadText: string;
  /** Metadata such as trace ids, parsed from `headersText` as `payload` is from its text. */
  readonly headers: JsonObject;
  /** The headers as PostgreSQL's own text (`headers::text`), byte for byte. */
  readonly headersText: string;
  /** When the writer's transaction started (`now()` at insert). */
  occurredAt: Date;
}

/**
 * The page's open REPEATABLE READ transaction. Write the handler's effects
 * with it so they commit atomically with the cursor. Do not COMMIT or
 * ROLLBACK through it: the stream client ends the transaction.
 */
export interface Transaction {
  /** node-postgres `query`, on the page's connection. */
  query: pg.ClientBase['query'];
}

/** What a handler receives besides the event and the transaction. */
export interface HandlerContext {
  /** The consumer being delivered to. */
  consumer: string;
  /** The stream being delivered. */
  stream: string;
  /** The tail's signal: long handlers should stop when it aborts. */
  signal: AbortSignal;
  /** The group partition being delivered (`tailGroup` only). */
  partition?: number;
}

/**
 * Applies one event. Runs inside the page's transaction; throwing rolls the
 * whole page back and ends the tail with a `HandlerError`.
 */
export type Handler = (event: StreamEvent, tx: Transaction, context: HandlerContext) => unknown;

/** Why a tailer paged: first page, the previous page was full, a notification, the poll interval, the listener (re)connected, or a retry after a failure. */
export type WakeReason = 'start' | 'full' | 'notify' | 'poll' | 'listener' | 'retry';

/** Events a {@link StreamClient} reports to its `observer`. */
export type ConsumerEvent =
  | {
      type: 'page';
      consumer: string;
      stream: string;
      /** Events whose handlers ran and whose effects committed with the cursor. */
      delivered: number;
      /** The cursor after the page. */
      cursor: bigint;
      /** The safe_seq the page read. */
      safeSeq: bigint;
      wake: WakeReason;
      /** The group partition paged (`tailGroup` only). */
      partition?: number;
    }
  | { type: 'resync'; consumer: string; stream: string; cursor: bigint; prunedThrough: bigint }
  /** `tail` failed with a retryable error (`error`) and runs again after `delayMs`; `attempt` counts failures since the last page that committed. */
  | { type: 'retry'; consumer: string; stream: string; error: unknown; attempt: number; delayMs: number; partition?: number }
  /** A group member's beat (`tailGroup`): the partitions it holds now, when they changed. */
  | { type: 'group:assignment'; consumer: string; stream: string; member: string; partitions: number[]; count: number }
  /** A page of `partition` was refused (SQLSTATE TM008, `error`): the partition is another member's now, or the lease the page began under ended; the member stops paging it until a beat returns it. */
  | { type: 'group:fenced'; consumer: string; stream: string; member: string; partition: number; error: unknown }
  /** The group's partition index could not be created (`error`): pages of a partition read past the other partitions' events. */
  | { type: 'group:index'; consumer: string; stream: string; partitions: number; error: unknown }
  /** A handler failed on `seq` (`error`, the handler's) and the event is tried again alone after `delayMs`; `attempt` is that try's number. */
  | { type: 'handler:retry'; consumer: string; stream: string; seq: bigint; attempt: number; delayMs: number; error: unknown; partition?: number }
  /** The event failed its last try and was recorded as dead letter `id`, the cursor moved past it in the same transaction. */
  | { type: 'dead-letter'; consumer: string; stream: string; seq: bigint; key: string | undefined; attempts: number; error: unknown; id: bigint; partition?: number }
  /** Dead letter `id` was replayed: its handler ran and it was deleted in that transaction (`error` undefined), or its handler failed again (it stays, one try more). */
  | { type: 'dead-letter:replay'; consumer: string; stream: string; seq: bigint; id: bigint; error: unknown; partition?: number }
  | { type: 'listener:listening' }
  | { type: 'listener:notification'; safeSeq: bigint }
  | { type: 'listener:error'; error: unknown; attempt: number; retryInMs: number }
  | { type: 'listener:stopped' };
