import type pg from 'pg';
import { backoffMs } from '../backoff.js';
import { ClosedError, ConnectionLostError, CursorContentionError, HandlerError, InvalidOptionsError, isRetryable, SQLSTATE, sqlState } from '../errors.js';
import { acquire, sleep } from '../db/acquire.js';
import { notifyChannel } from '../db/queryable.js';
import { checkKnownOptions, nameOption, poolOption } from '../options.js';
import { openBootstrap, type BootstrapSnapshot } from './bootstrap.js';
import { CursorHold, transaction } from './cursor-hold.js';
import type { ConsumerEvent, Handler, WakeReason } from './events.js';
import { Listener, type LostSource } from './listener.js';
import { resolveStreamClientOptions, type ResolvedStreamClientOptions, type StreamClientOptions } from './options.js';
import { eventOf, pageSql, runPage, type EventRow, type PageResult, type PageSql, type Prefetch } from './page.js';
import { handledBefore, noTries, REPLAY_WITH, resolveFailurePolicy, type ReplayWith, type FailurePolicy, type ResolvedFailurePolicy, type Tries } from './failures.js';
import { boundedQuery } from '../db/deadline.js';
import { buildPartitionIndex, GROUP_OPTION_NAMES, groupSql, partitionPageSql, resolveGroupOptions, Semaphore, type GroupOptions, type ResolvedGroupOptions } from './group.js';
import { setMaxListeners } from 'node:events';
import { withDeadline } from '../db/deadline.js';
import { notifyObserver, reportError } from '../callbacks.js';
import { loadOtel } from '../tracing.js';
import { handlerInSpans } from './handler-span.js';
import { EVENT_TYPES } from '../db/types.js';

/** What a page handed to its handlers, as {@link TailOptions.beforeCommit} sees it. */
export interface PageInfo {
  consumer: string;
  stream: string;
  /** Events handled in this page. */
  delivered: number;
  /** The cursor the page will commit: the seq of its last handled event. */
  cursor: bigint;
  /** The group partition of the page (`tailGroup` only). */
  partition?: number;
}

/** Options for {@link StreamClient.tail}. */
/** A call's options: an object, of known names only. */
function checkCallOptions(options: unknown, known: object, method: string): void {
  if (typeof options !== 'object' || options === null) throw new InvalidOptionsError('options', `expected an object, got ${String(options)}`);
  checkKnownOptions(options, known, `StreamClient.${method}`);
}

export interface TailOptions {
  /** Ends the tail: it rejects with `signal.reason` once the current handler returns. */
  signal?: AbortSignal;
  /**
   * Runs after the last handler of each page that handled events, before
   * the cursor advance and COMMIT. Throwing (or rejecting) rolls the page
   * back, like a handler's error (`HandlerError`, with this error as
   * `cause`; the page is delivered again later). For effects outside the
   * database that must be accepted before the cursor moves: `tidemark tail`
   * writes a page's lines to stdout here and commits only once they are
   * written.
   */
  beforeCommit?: (page: PageInfo) => unknown;
  /**
   * What a handler's failure does: by default it ends the call with the
   * `HandlerError` (the page rolled back). With `maxAttempts` above 1 the
   * events before the failing one are delivered again and committed, and it
   * is tried again alone after a back-off (each try again is an observer
   * event `{ type: 'handler:retry' }`); after the last try `onExhausted`
   * stops, or records a dead letter and goes on. See {@link FailurePolicy}.
   */
  failures?: FailurePolicy;
}

/** Options for {@link StreamClient.drain}. */
export interface DrainOptions extends TailOptions {
  /** Deliver at most this many events. Default: no limit. */
  maxEvents?: number;
}

/** What {@link StreamClient.drain} delivered. */
export interface DrainResult {
  /** Events whose handlers ran and committed. */
  delivered: number;
  /** The cursor after the drain. */
  cursor: bigint;
  /** The safe_seq the last page read. */
  safeSeq: bigint;
}

/** How often a page may find a resync that is gone by the time it is counted before giving up. */
const RESYNC_ATTEMPTS = 3;

/**
 * Follows streams below safe_seq with durable cursors: ordered, exactly once
 * per (consumer, stream), never a gap that later fills.
 *
 * Each page is one REPEATABLE READ transaction that locks the cursor row,
 * checks the stream's retention horizon, reads safe_seq, pages
 * `cursor < seq <= safe_seq` in seq order, runs the handler with that
 * transaction for each event, advances the cursor and commits. Exactly one
 * tailer (or bootstrap) runs per (consumer, stream) at a time: each holds
 * an advisory lock on its own pooled connection; a second one gets
 * `CursorContentionError`. A tailer therefore uses one connection, plus one
 * LISTEN connection shared by the client's tailers.
 *
 * @example
 * const client = new StreamClient(pool);
 * const stop = new AbortController();
 * await client.tail('billing', 'orders', async (event, tx) => {
 *   await tx.query('INSERT INTO invoices (order_id) VALUES ($1)', [event.key]);
 * }, { signal: stop.signal });
 */
export class StreamClient {
  /** The validated, frozen options in force. */
  readonly options: ResolvedStreamClientOptions;
  private readonly pool: pg.Pool;
  private readonly sql: PageSql;
  private readonly listener: Listener | undefined;
  private readonly running = new Set<{ stop: AbortController; done: Promise<unknown> }>();
  private readonly snapshots = new Set<BootstrapSnapshot>();
  private closed = false;

  constructor(pool: pg.Pool, options: StreamClientOptions = {}) {
    this.pool = poolOption(pool);
    this.options = resolveStreamClientOptions(options);
    this.sql = pageSql(this.options.schema);
    // Look for @opentelemetry/api now, not when the first tail starts: its
    // import (~40 ms here) would otherwise delay that tail's first events.
    void loadOtel();
    const o = this.options;
    if (o.listen) {
      this.listener = new Listener(pool, {
        channel: notifyChannel(o.schema),
        backoffMinMs: o.listenerBackoffMinMs,
        backoffMaxMs: o.listenerBackoffMaxMs,
        acquireTimeoutMs: o.listenerAcquireTimeoutMs,
        responseTimeoutMs: o.responseTimeoutMs,
        emit: (event) => this.emit(event),
      });
    }
  }

  /**
   * Delivers `stream` to `handler` as `consumer`, page after page, and keeps
   * following it: a full page pages again at once, a short one waits for a
   * watermark notification or `pollIntervalMs`. Never resolves; rejects with
   * the abort reason when `signal` aborts (after committing the events
   * already handled in the current page), or with the error that ended it:
   * `HandlerError` (page rolled back), `ResyncRequiredError`,
   * `CursorContentionError` (another tailer holds the cursor), or a database
   * error that is not retryable.
   *
   * Retryable failures (`isRetryable`: a lost or dead connection, a server
   * restart, too many connections, a serialization failure or deadlock in
   * the page) do not end it while the `retry` option is on (the default):
   * it reports a `retry` event, backs off (`retryMinMs` doubling to
   * `retryMaxMs`, with jitter), takes the cursor again and goes on from the
   * durable cursor. A page whose COMMIT was lost is therefore delivered
   * again only if it did not commit.
   */
  async tail(consumer: string, stream: string, handler: Handler, options: TailOptions = {}): Promise<never> {
    checkCallOptions(options, { signal: true, beforeCommit: true, failures: true } satisfies Record<keyof TailOptions, true>, 'tail');
    const standIn = (options as ReplayWith)[REPLAY_WITH]; // the relay's replays
    const policy = failurePolicy(options, standIn !== undefined);
    handler = await this.traced(consumer, stream, handler);
    const tries = noTries();
    const o = this.options;
    let attempt = 0; // failures since the last page that committed
    let held = false; // the cursor was held once: contention since is likely our own lingering session
    let wake: WakeReason = 'start';
    return this.session(consumer, stream, handler, options.signal, async (signal) => {
      for (;;) {
        try {
          await this.holding(consumer, stream, signal, async (hold) => {
            held = true;
            let ahead: Prefetch | undefined;
            let replaysAt = -Infinity;
            for (;;) {
              // Dead letters asked to be replayed: looked for at most every
              // pollIntervalMs (a short page waits no longer than that).
              if (policy.onExhausted === 'dead-letter' && performance.now() - replaysAt >= o.pollIntervalMs) {
                replaysAt = performance.now();
                await this.replays(hold, standIn ?? handler, signal);
              }
              const generation = this.listener?.generation ?? 0;
              const page = (await this.deliver(hold, handler, o.batchSize, signal, wake, options.beforeCommit, ahead, policy, tries))!; // waits its back-offs
              ahead = page.prefetch;
              attempt = 0;
              if (page.full) {
                wake = 'full';
                continue;
              }
              wake = this.listener
                ? await this.listener.wait(page.safeSeq, generation, o.pollIntervalMs, signal, hold)
                : await pollOnly(o.pollIntervalMs, signal, hold);
            }
          });
        } catch (err) {
          // A connection lost on the way to the cursor may have left a session holding it.
          if (err instanceof ConnectionLostError) held = true;
          if (!o.retry || signal.aborted || !(err instanceof CursorContentionError ? held : isRetryable(err))) throw err;
          attempt += 1;
          const delayMs = backoffMs(attempt, o.retryMinMs, o.retryMaxMs);
          this.emit({ type: 'retry', consumer, stream, error: err, attempt, delayMs });
          await sleep(delayMs, signal);
          wake = 'retry';
        }
      }
    });
  }

  /**
   * Delivers what is visible now (up to safe_seq, at most `maxEvents`) and
   * returns: the same pages as {@link tail}, without waiting for more.
   */
  async drain(consumer: string, stream: string, handler: Handler, options: DrainOptions = {}): Promise<DrainResult> {
    checkCallOptions(options, { signal: true, beforeCommit: true, failures: true, maxEvents: true } satisfies Record<keyof DrainOptions, true>, 'drain');
    const policy = failurePolicy(options);
    handler = await this.traced(consumer, stream, handler);
    const tries = noTries();
    const max = options.maxEvents ?? Number.MAX_SAFE_INTEGER;
    if (!Number.isSafeInteger(max) || max < 1) {
      throw new InvalidOptionsError('maxEvents', `expected a positive integer, got ${String(options.maxEvents)}`);
    }
    return this.session(consumer, stream, handler, options.signal, (signal) =>
      this.holding(consumer, stream, signal, async (hold) => {
      const result: DrainResult = { delivered: 0, cursor: 0n, safeSeq: 0n };
      if (policy.onExhausted === 'dead-letter') await this.replays(hold, handler, signal);
      let wake: WakeReason = 'start';
      let ahead: Prefetch | undefined;
      do {
        const limit = Math.min(this.options.batchSize, max - result.delivered);
        const page = (await this.deliver(hold, handler, limit, signal, wake, options.beforeCommit, ahead, policy, tries))!; // waits its back-offs
        ahead = page.prefetch;
        result.delivered += page.delivered;
        result.cursor = page.cursor;
        result.safeSeq = page.safeSeq;
        if (!page.full) break;
        wake = 'full';
      } while (result.delivered < max);
      return result;
    }));
  }

  /**
   * Delivers `stream` to `handler` as one member of `consumer`'s group: the
   * stream split into `partitions` by key (`key_partition`), a durable
   * cursor per partition, and the partitions spread evenly over the live
   * members, which hold them by lease (PROTOCOL §6.4). Events of one key
   * are delivered in order, exactly once per group; pages of different
   * partitions run at once, up to `concurrency` in this member. Start the
   * same call in other processes (or with another `member` name) to add
   * members: the partitions rebalance at their beats, and those of a
   * member that stops move to the others once its lease ends.
   *
   * The handler's context and the observer's `page` events carry the
   * partition. Never resolves; rejects like {@link tail} (a handler's
   * failure under the `stop` policy, a database error that is not
   * retryable, the abort reason), after this member's pages ended and it
   * left the group. A member that joins with a count other than the
   * group's (or a pending re-partition's) is refused (SQLSTATE TM007); a
   * running member follows a re-partition (`repartitionGroup`). Under the `dead-letter` policy an event set
   * aside is its partition's (`DeadLetter.partition`), and the member that
   * holds the partition replays it.
   */
  async tailGroup(consumer: string, stream: string, handler: Handler, options: GroupOptions = {}): Promise<never> {
    checkCallOptions(options, { signal: true, beforeCommit: true, failures: true, ...GROUP_OPTION_NAMES } satisfies Record<keyof GroupOptions, true>, 'tailGroup');
    const policy = failurePolicy(options);
    const group = resolveGroupOptions(options);
    handler = await this.traced(consumer, stream, handler);
    return this.session(consumer, stream, handler, options.signal, (signal) => this.member(consumer, stream, handler, options.beforeCommit, policy, group, signal));
  }

  /** One member's run: beats every third of the lease, a page loop per partition held, then leaves the group. */
  private async member(
    consumer: string,
    stream: string,
    handler: Handler,
    beforeCommit: TailOptions['beforeCommit'],
    policy: ResolvedFailurePolicy,
    group: ResolvedGroupOptions,
    outer: AbortSignal,
  ): Promise<never> {
    const o = this.options;
    const sql = groupSql(o.schema);
    const bound = o.lockTimeoutMs + o.responseTimeoutMs;
    // Aborted by the caller, or by the first partition loop that fails.
    const stop = new AbortController();
    setMaxListeners(0, stop.signal); // one listener per partition loop
    const forward = () => stop.abort(outer.reason);
    outer.addEventListener('abort', forward, { once: true });
    if (outer.aborted) forward();
    const slots = new Semaphore(group.concurrency);
    const loops = new Map<number, AbortController>();
    const running = new Set<Promise<void>>();
    const unsubscribe = this.listener?.subscribe();
    const beatMs = Math.max(30, Math.floor(group.leaseTtlMs / 3));
    // The beats have a connection of their own: a beat queued behind the
    // pages for a pooled one would let the lease lapse under them.
    let beatClient: pg.PoolClient | undefined;
    const onBeatClient = async <T>(what: string, run: (c: pg.PoolClient) => Promise<T>): Promise<T> => {
      beatClient ??= await acquire(this.pool, stop.signal);
      const c = beatClient;
      try {
        return await withDeadline(c, bound, what, () => run(c));
      } catch (err) {
        beatClient = undefined;
        c.release(true); // its state is unknown: destroyed
        throw err;
      }
    };
    let index: Promise<void> | undefined;
    let indexed: number | undefined;
    let count = group.partitions;
    let held: number[] = [];
    let heldOf = group.partitions;
    let attempt = 0;
    try {
      for (;;) {
        stop.signal.throwIfAborted();
        let now: number[];
        let nextBeatMs = beatMs;
        try {
          const r = await onBeatClient(`the beat of ${JSON.stringify(group.member)}`, (c) =>
            c.query<{ partitions: number[]; others_end_ms: number | null; count: number }>(sql.beat, [consumer, stream, group.partitions, group.member, group.leaseTtlMs]),
          );
          now = r.rows[0]!.partitions;
          count = r.rows[0]!.count;
          // Beat again just after the first other lease ends, if that is
          // sooner: a dead member's partitions move then (PROTOCOL §6.4).
          const othersEnd = r.rows[0]!.others_end_ms;
          if (othersEnd !== null) nextBeatMs = Math.min(beatMs, Math.max(30, Math.ceil(othersEnd) + 25));
          attempt = 0;
        } catch (err) {
          if (stop.signal.aborted) throw stop.signal.reason;
          if (!o.retry || !isRetryable(err)) throw err;
          attempt += 1;
          const delayMs = Math.min(backoffMs(attempt, o.retryMinMs, o.retryMaxMs), beatMs);
          this.emit({ type: 'retry', consumer, stream, error: err, attempt, delayMs });
          await sleep(delayMs, stop.signal);
          continue;
        }
        // Stopped while the beat ran: start nothing.
        stop.signal.throwIfAborted();
        // The index once the member is in (its build may wait for old
        // transactions; it must not hold the first beat back).
        // A re-partition changed the count: the index of the new one (the
        // re-partition builds it first, unless told not to).
        if (group.partitionIndex && count !== indexed) {
          const previous = index;
          const of = count;
          indexed = count;
          index = (async () => {
            await previous;
            await this.partitionIndex(consumer, stream, of, stop.signal);
          })();
        }
        // Partitions given up stop after their page; new ones start.
        for (const [p, loopStop] of loops) {
          if (!now.includes(p)) {
            loopStop.abort(new Error('partition given up'));
            loops.delete(p);
          }
        }
        for (const p of now) {
          if (loops.has(p)) continue;
          const loopStop = new AbortController();
          const onStop = () => loopStop.abort(stop.signal.reason);
          stop.signal.addEventListener('abort', onStop, { once: true });
          loops.set(p, loopStop);
          const done: Promise<void> = this.partitionLoop(consumer, stream, p, group, handler, beforeCommit, policy, slots, loopStop.signal)
            .catch((err: unknown) => void stop.abort(err))
            .finally(() => {
              stop.signal.removeEventListener('abort', onStop);
              if (loops.get(p) === loopStop) loops.delete(p);
              running.delete(done);
            });
          running.add(done);
        }
        if (now.join() !== held.join() || count !== heldOf) {
          held = now;
          heldOf = count;
          this.emit({ type: 'group:assignment', consumer, stream, member: group.member, partitions: now, count });
        }
        await sleep(nextBeatMs, stop.signal);
      }
    } finally {
      outer.removeEventListener('abort', forward);
      stop.abort(stop.signal.reason ?? new Error('member stopped'));
      await Promise.allSettled([...running]);
      await index;
      await unsubscribe?.();
      // Leave, so that the others take the partitions at their next beat
      // rather than when the lease ends. Best effort: the lease ends anyway.
      try {
        await onBeatClient(`${JSON.stringify(group.member)} leaving`, (c) => c.query(sql.leave, [consumer, stream, group.member]));
      } catch {
        // the lease ends by itself
      }
      beatClient?.release();
    }
  }

  /** Pages partition `p` while this member holds it: returns when it is given up or lost (TM008), throws what ends the member. */
  private async partitionLoop(
    consumer: string,
    stream: string,
    p: number,
    group: ResolvedGroupOptions,
    handler: Handler,
    beforeCommit: TailOptions['beforeCommit'],
    policy: ResolvedFailurePolicy,
    slots: Semaphore,
    signal: AbortSignal,
  ): Promise<void> {
    const o = this.options;
    const sql = partitionPageSql(this.sql, o.schema, consumer, stream, p, group.member);
    const tries = noTries();
    const never = { onLost: () => () => undefined };
    let wake: WakeReason = 'start';
    let attempt = 0;
    let replaysAt = -Infinity;
    while (!signal.aborted) {
      const generation = this.listener?.generation ?? 0;
      let safeSeq: bigint | undefined;
      try {
        await slots.acquire(signal);
        try {
          // One page a slot: a partition with a backlog takes turns with
          // the others, its next page queued behind theirs.
          const hold = await CursorHold.forPartition(this.pool, consumer, stream, p, signal, o.lockTimeoutMs + o.responseTimeoutMs);
          try {
            // The partition's dead letters asked to be replayed: looked for
            // at most every pollIntervalMs, as a tail does.
            if (policy.onExhausted === 'dead-letter' && performance.now() - replaysAt >= o.pollIntervalMs) {
              replaysAt = performance.now();
              await this.replays(hold, handler, signal, sql);
            }
            const page = await this.deliver(hold, handler, o.batchSize, signal, wake, beforeCommit, undefined, policy, tries, sql, true);
            safeSeq = page === undefined ? undefined : page.full ? -1n : page.safeSeq;
          } finally {
            await hold.release();
          }
        } finally {
          slots.release();
        }
        attempt = 0;
      } catch (err) {
        if (signal.aborted) return;
        // Not this member's any more (a beat gave it away, or the lease
        // the page began under ended): the next beat says what is.
        if (sqlState(err) === SQLSTATE.partitionNotHeld) {
          this.emit({ type: 'group:fenced', consumer, stream, member: group.member, partition: p, error: err });
          return;
        }
        if (!o.retry || !(err instanceof CursorContentionError || isRetryable(err))) throw err;
        attempt += 1;
        const delayMs = backoffMs(attempt, o.retryMinMs, o.retryMaxMs);
        this.emit({ type: 'retry', consumer, stream, error: err, attempt, delayMs, partition: p });
        await sleep(delayMs, signal).catch(() => undefined);
        wake = 'retry';
        continue;
      }
      if (safeSeq === undefined) {
        // A failing event's back-off: waited with neither a slot nor a
        // connection, so that the other partitions go on meanwhile.
        this.emit({ type: 'handler:retry', consumer, stream, seq: tries.seq!, attempt: tries.attempts + 1, delayMs: tries.delayMs, error: tries.last?.cause, partition: p });
        const ok = await sleep(tries.delayMs, signal).then(() => true, () => false);
        if (!ok) return;
        tries.delayMs = 0;
        wake = 'retry';
        continue;
      }
      if (safeSeq < 0n) {
        wake = 'full';
        continue;
      }
      try {
        wake = this.listener ? await this.listener.wait(safeSeq, generation, o.pollIntervalMs, signal, never) : await pollOnly(o.pollIntervalMs, signal, never);
      } catch {
        return; // stopped
      }
    }
  }

  /**
   * Creates the group's partition index when it is missing (CONCURRENTLY:
   * writers go on), so that a page of a partition is one range scan. A role
   * that may not create it is told once (`group:index`), as is an invalid
   * one (a build that was cancelled); pages are correct without it, only
   * slower. Stopping the member cancels a build in progress.
   */
  private async partitionIndex(consumer: string, stream: string, partitions: number, signal: AbortSignal): Promise<void> {
    try {
      await buildPartitionIndex(this.pool, this.options.schema, partitions, signal, this.options.responseTimeoutMs);
    } catch (err) {
      if (!signal.aborted) this.emit({ type: 'group:index', consumer, stream, partitions, error: err });
    }
  }

  /**
   * Opens a snapshot to rebuild `consumer`'s projection of `stream` from,
   * for a new consumer or after `ResyncRequiredError`. Holds the cursor like
   * a tailer does until closed. See {@link BootstrapSnapshot}.
   *
   * @example
   * await using snap = await client.bootstrap('billing', 'orders');
   * await snap.tx.query('TRUNCATE invoices');
   * await snap.tx.query('INSERT INTO invoices SELECT id FROM orders');
   * await snap.commit(); // cursor = snap.safeSeq
   */
  async bootstrap(consumer: string, stream: string, options: { signal?: AbortSignal } = {}): Promise<BootstrapSnapshot> {
    checkCallOptions(options, { signal: true }, 'bootstrap');
    if (this.closed) throw new ClosedError('StreamClient');
    validateNames(consumer, stream);
    const snapshot = await openBootstrap(this.pool, this.options, this.sql, consumer, stream, options.signal, (closed) => this.snapshots.delete(closed));
    if (this.closed) {
      await snapshot.close();
      throw new ClosedError('StreamClient');
    }
    this.snapshots.add(snapshot);
    return snapshot;
  }

  /**
   * {@link bootstrap} for `consumer`'s group on `stream` (PROTOCOL §7):
   * the same snapshot, and `commit()` moves every partition's cursor to its
   * point. A new group is created with `partitions` (default 16); an
   * existing one must have that count. Refused (`CursorContentionError`)
   * while a member's lease is live or a page of the group is open: stop
   * the members first, rebuild, commit, then start them again.
   */
  async bootstrapGroup(consumer: string, stream: string, options: { partitions?: number; signal?: AbortSignal } = {}): Promise<BootstrapSnapshot> {
    checkCallOptions(options, { partitions: true, signal: true }, 'bootstrapGroup');
    if (this.closed) throw new ClosedError('StreamClient');
    validateNames(consumer, stream);
    const { partitions } = resolveGroupOptions({ partitions: options.partitions, member: 'bootstrap' });
    const snapshot = await openBootstrap(this.pool, this.options, this.sql, consumer, stream, options.signal, (closed) => this.snapshots.delete(closed), { partitions });
    if (this.closed) {
      await snapshot.close();
      throw new ClosedError('StreamClient');
    }
    this.snapshots.add(snapshot);
    return snapshot;
  }

  /**
   * Stops every running tail and drain (they reject with a `ClosedError`),
   * closes open bootstrap snapshots without committing, waits until their
   * connections are back, and stops the listener. Idempotent; does not end
   * the pool.
   */
  async close(): Promise<void> {
    this.closed = true;
    const running = [...this.running];
    for (const r of running) r.stop.abort(new ClosedError('StreamClient'));
    await Promise.allSettled([...running.map((r) => r.done), ...[...this.snapshots].map((snap) => snap.close())]);
  }

  /** Runs `body` with a signal that `outer` or `close()` aborts; `close()` waits for it to end. */
  private async session<T>(
    consumer: string,
    stream: string,
    handler: Handler,
    outer: AbortSignal | undefined,
    body: (signal: AbortSignal) => Promise<T>,
  ): Promise<T> {
    if (this.closed) throw new ClosedError('StreamClient');
    validateNames(consumer, stream);
    if (typeof handler !== 'function') throw new InvalidOptionsError('handler', 'expected a function');
    outer?.throwIfAborted();
    const stop = new AbortController();
    const forward = () => stop.abort(outer!.reason);
    outer?.addEventListener('abort', forward, { once: true });
    const run = body(stop.signal);
    const entry = { stop, done: run.catch(() => undefined) };
    this.running.add(entry);
    try {
      return await run;
    } finally {
      outer?.removeEventListener('abort', forward);
      this.running.delete(entry);
    }
  }

  /** Runs `body` holding the cursor of (consumer, stream), with the listener subscribed; releases both however it ends. */
  private async holding<T>(consumer: string, stream: string, signal: AbortSignal, body: (hold: CursorHold) => Promise<T>): Promise<T> {
    const o = this.options;
    const hold = await CursorHold.open(this.pool, o.schema, consumer, stream, signal, o.lockTimeoutMs + o.responseTimeoutMs);
    const unsubscribe = this.listener?.subscribe();
    try {
      // Create the cursor row on first use in its own READ COMMITTED
      // statement (a concurrent creator makes it wait, then do nothing), so
      // it exists, committed, whatever becomes of the first page. read_page
      // would create it too, inside the page, and lose it with a rollback.
      try {
        await hold.query(this.sql.ensureCursor, [consumer, stream]);
      } catch (err) {
        throw hold.translate(err);
      }
      return await body(hold);
    } finally {
      await unsubscribe?.();
      await hold.release();
    }
  }

  /**
   * The next page under the failure policy: a page as usual, or, while an
   * event is failing, the events before it (committed first), then the
   * event alone after its back-off, then its dead letter. Returns the page
   * that committed; throws what the policy does not absorb.
   */
  private async deliver(
    hold: CursorHold,
    handler: Handler,
    limit: number,
    signal: AbortSignal,
    wake: WakeReason,
    beforeCommit: TailOptions['beforeCommit'],
    ahead: Prefetch | undefined,
    policy: ResolvedFailurePolicy,
    tries: Tries,
    sql: PageSql = this.sql,
    yieldBackoff = false,
  ): Promise<PageResult | undefined> {
    for (;;) {
      const failing = tries.seq;
      if (failing !== undefined && tries.before === 0) {
        // The caller waits the back-off itself (a group member, without
        // its slot and connection): undefined.
        if (tries.delayMs > 0 && yieldBackoff) return undefined;
        if (tries.delayMs > 0) {
          this.emit({ type: 'handler:retry', consumer: hold.consumer, stream: hold.stream, seq: failing, attempt: tries.attempts + 1, delayMs: tries.delayMs, error: tries.last?.cause, ...(hold.partition !== undefined && { partition: hold.partition }) });
          await sleep(tries.delayMs, signal);
          tries.delayMs = 0;
          wake = 'retry';
        }
        if (tries.attempts >= policy.maxAttempts) {
          // onExhausted is 'dead-letter' (a 'stop' threw at the last try).
          // Undefined: the cursor is past the event already (a COMMIT whose
          // answer was lost, a cursor moved): nothing to set aside.
          const page = await this.deadLetter(hold, tries, signal, wake, sql);
          Object.assign(tries, noTries());
          if (page) return page;
          continue;
        }
      }
      const cap = tries.before > 0 ? Math.min(limit, tries.before) : failing !== undefined ? 1 : limit;
      try {
        const page = await this.page(hold, handler, cap, signal, wake, beforeCommit, failing === undefined ? ahead : undefined, true, sql);
        if (failing !== undefined && page.cursor >= failing) {
          // Past the failing event: handled (in this page, or by one whose
          // COMMIT answer was lost), or the cursor was moved.
          Object.assign(tries, noTries());
        } else if (tries.before > 0) {
          // The events before the failing one: all of them by now, unless the page was cut shorter (drain's maxEvents).
          tries.before = page.delivered === 0 ? 0 : Math.max(0, tries.before - page.delivered);
        }
        return page;
      } catch (err) {
        const before = err instanceof HandlerError ? handledBefore.get(err) : undefined;
        // Not the handler's own failure, or a transient one (a deadlock, a
        // serialization failure, a lock wait that timed out in the page's
        // transaction): no try is counted; the tail retries the page.
        if (before === undefined || isRetryable(err)) throw err;
        const failure = err as HandlerError;
        tries.attempts = failure.seq === tries.seq ? tries.attempts + 1 : 1;
        tries.seq = failure.seq;
        tries.before = before;
        tries.last = failure;
        if (tries.attempts >= policy.maxAttempts) {
          if (policy.onExhausted === 'stop') {
            Object.assign(tries, noTries());
            throw failure;
          }
          tries.delayMs = 0;
        } else {
          tries.delayMs = backoffMs(tries.attempts, policy.backoffMinMs, policy.backoffMaxMs);
        }
      }
    }
  }

  /**
   * Sets aside the event that failed its last try: a page of that one event
   * whose "handler" records it as a dead letter, so the record and the
   * cursor's move past it commit together. Reported as a page that
   * delivered nothing, and as a `dead-letter` event.
   */
  private async deadLetter(hold: CursorHold, tries: Tries, signal: AbortSignal, wake: WakeReason, sql: PageSql) {
    const failure = tries.last!;
    let id: bigint | undefined;
    const record: Handler = async (event, tx) => {
      // Another event above the cursor: the failing one is behind it.
      if (event.seq !== failure.seq) throw NOT_FAILING;
      const r = await tx.query<{ id: string }>(sql.recordDeadLetter, [hold.consumer, hold.stream, event.seq.toString(), tries.attempts, errorText(failure.cause)]);
      id = BigInt(r.rows[0]!.id);
    };
    let page;
    try {
      page = await this.page(hold, record, 1, signal, wake, undefined, undefined, false, sql);
    } catch (err) {
      if (err instanceof HandlerError && err.cause === NOT_FAILING) return undefined;
      // The record statement's own refusal (a group's fence, TM008; a
      // serialization failure): the database's error, as a page's would
      // be, not the handler's.
      if (err instanceof HandlerError && sqlState(err.cause) !== undefined) throw hold.contention(err.cause);
      throw err;
    }
    const partition = hold.partition !== undefined ? { partition: hold.partition } : {};
    this.emit({ type: 'page', consumer: hold.consumer, stream: hold.stream, delivered: 0, cursor: page.cursor, safeSeq: page.safeSeq, wake, ...partition });
    // Undefined: nothing above the cursor any more.
    if (id !== undefined) this.emit({ type: 'dead-letter', consumer: hold.consumer, stream: hold.stream, seq: failure.seq, key: failure.key, attempts: tries.attempts, error: failure.cause, id, ...partition });
    return { ...page, delivered: 0 };
  }

  /**
   * Delivers the dead letters of this cursor that were asked to be
   * replayed, oldest event first, each in a transaction of its own that
   * deletes it: delivered once, or, when its handler fails, its effects
   * rolled back to a savepoint and the row left dead with one try more and
   * its request cleared, in that transaction (a request made meanwhile
   * waits for the row, and stays). The tailer holds the cursor, so
   * no other tailer of this consumer replays them meanwhile; a group
   * member replays those of one partition it holds, each transaction
   * holding the partition as a page does (partition_replay).
   */
  private async replays(hold: CursorHold, handler: Handler, signal: AbortSignal, sql: PageSql = this.sql): Promise<void> {
    // One statement when none is asked for, as is usual.
    try {
      if ((await hold.query(sql.anyReplay, [hold.consumer, hold.stream])).rows.length === 0) return;
    } catch (err) {
      throw hold.translate(err);
    }
    // Each dead letter at most once a pass: one asked for again while its
    // replay failed waits for the next pass, so a handler that keeps
    // failing while requests keep coming does not hold the live pages back.
    const tried: string[] = [];
    while (!signal.aborted) {
      let row: (EventRow & { id: string; attempts: number }) | undefined;
      try {
        await hold.query(this.sql.begin(this.options.lockTimeoutMs));
        row = (await hold.query<EventRow & { id: string; attempts: number }>(sql.nextReplay, [hold.consumer, hold.stream, tried], EVENT_TYPES)).rows[0];
        if (!row) {
          await hold.query('COMMIT');
          return;
        }
        tried.push(row.id);
        await hold.query('SAVEPOINT tidemark_replay');
      } catch (err) {
        const failure = hold.contention(err);
        await hold.rollback();
        throw failure;
      }
      const id = BigInt(row.id);
      const event = eventOf(row, hold.stream, handler);
      const partition = hold.partition !== undefined ? { partition: hold.partition } : {};
      let live = true;
      try {
        await handler(event, transaction(hold, () => live, 'the replay transaction'), { consumer: hold.consumer, stream: hold.stream, signal, ...partition });
      } catch (err) {
        live = false;
        const failure = new HandlerError(hold.consumer, hold.stream, event.seq, err, event.key);
        const lost = (cause: unknown) => new ConnectionLostError(`replay of a dead letter of ${JSON.stringify(hold.consumer)}`, cause);
        // A lost connection; a stop (whatever error the handler ended
        // with); or a transient failure of the transaction, classified as
        // a page's handler failure is (the tail retries it): the replay did
        // not fail, and stays asked for, no try counted.
        if (hold.isBroken || signal.aborted || isRetryable(failure)) {
          await hold.rollback();
          if (hold.isBroken) throw lost(err);
          throw signal.aborted ? err : failure;
        }
        // Failed: undo the handler's effects, and note the try in the same
        // transaction, which still holds the row (a request made meanwhile
        // waits for this commit, and stays).
        let inTransaction = true;
        try {
          await hold.query('ROLLBACK TO SAVEPOINT tidemark_replay');
        } catch (gone) {
          // The handler ended the transaction itself (COMMIT, ROLLBACK) or
          // released the savepoint: end what is left, and note the try in
          // a statement of its own.
          if (hold.isBroken) throw lost(gone);
          await hold.rollback();
          inTransaction = false;
        }
        try {
          await hold.query(sql.replayFailed, [row.id, errorText(err)]);
          if (inTransaction) await hold.query('COMMIT');
        } catch (noteErr) {
          const noted = hold.contention(noteErr);
          await hold.rollback();
          throw noted;
        }
        this.emit({ type: 'dead-letter:replay', consumer: hold.consumer, stream: hold.stream, seq: event.seq, id, error: err, ...partition });
        continue;
      }
      live = false;
      try {
        await hold.query(sql.replayed, [row.id]);
        await hold.query('COMMIT');
      } catch (err) {
        const failure = hold.contention(err);
        await hold.rollback();
        throw failure;
      }
      this.emit({ type: 'dead-letter:replay', consumer: hold.consumer, stream: hold.stream, seq: event.seq, id, error: undefined, ...partition });
    }
  }

  /** One page (read_page creates the cursor row on first use). */
  private async page(
    hold: CursorHold,
    handler: Handler,
    limit: number,
    signal: AbortSignal,
    wake: WakeReason,
    beforeCommit: TailOptions['beforeCommit'],
    ahead: Prefetch | undefined,
    report = true,
    sql: PageSql = this.sql,
  ) {
    const o = this.options;
    // A partition's page reads no events ahead: its read is filtered.
    const readAhead = o.prefetch && sql === this.sql ? { use: ahead, waitMs: o.responseTimeoutMs, next: (after: bigint) => this.prefetch(hold.stream, after, limit) } : undefined;
    for (let attempt = 1; ; attempt += 1) {
      // Undefined: the page found a resync that a bootstrap resolved before
      // it was counted; page again.
      const page = await runPage(hold, sql, limit, o.lockTimeoutMs, handler, signal, beforeCommit, attempt === 1 ? readAhead : undefined);
      if (page) {
        if (report) {
          this.emit({
            type: 'page', consumer: hold.consumer, stream: hold.stream, delivered: page.delivered, cursor: page.cursor, safeSeq: page.safeSeq, wake,
            ...(hold.partition !== undefined && { partition: hold.partition }),
          });
        }
        return page;
      }
      if (attempt >= RESYNC_ATTEMPTS) {
        throw new Error(
          `tidemark: the cursor of ${JSON.stringify(hold.consumer)} on ${JSON.stringify(hold.stream)} is behind the retention horizon, then not, ${RESYNC_ATTEMPTS} times: ` +
            'is something moving it outside tidemark?',
        );
      }
    }
  }

  /** Starts reading `limit` events of `stream` above `after` on a pooled connection of its own (see the `prefetch` option). */
  private prefetch(stream: string, after: bigint, limit: number): Prefetch | undefined {
    // Only on a connection that is free now: a read ahead queued behind the
    // pool's other borrowers would hold the next page back, not speed it up.
    const pool = this.pool as pg.Pool & { options?: { max?: number } };
    if (pool.idleCount === 0 && pool.totalCount >= (pool.options?.max ?? 10)) return undefined;
    const rows = boundedQuery<EventRow>(this.pool, this.options.responseTimeoutMs, 'reading the next page ahead', this.sql.prefetch, [stream, after.toString(), limit], EVENT_TYPES).then(
      (r) => r.rows, // runPage uses them only when they are a full page
      () => undefined, // the page reads as usual
    );
    return { after, rows };
  }

  /**
   * `handler`, run in a span per event when `@opentelemetry/api` is
   * installed (src/consumer/handler-span.ts); as it is otherwise, so the
   * pages of an application without it run exactly as before.
   */
  private async traced(consumer: string, stream: string, handler: Handler): Promise<Handler> {
    const api = await loadOtel();
    return api ? handlerInSpans(api, handler, { schema: this.options.schema, consumer, stream }) : handler;
  }

  private emit(event: ConsumerEvent): void {
    if (event.type === 'listener:error') reportError(this.options.onError, event.error);
    notifyObserver(this.options.observer, event, this.options.onError);
  }
}

function validateNames(consumer: unknown, stream: unknown): void {
  nameOption(consumer, 'consumer');
  nameOption(stream, 'stream');
}

/** Waits `ms` for the next poll; rejects with the abort reason or when `lost` reports the connection lost. Exported for tests. */
export function pollOnly(ms: number, signal: AbortSignal, lost: LostSource): Promise<WakeReason> {
  return new Promise<WakeReason>((resolve, reject) => {
    let offLost: (() => void) | undefined = undefined; // set below; finish may run first (an aborted signal)
    const finish = (settle: () => void) => {
      clearTimeout(timer);
      signal.removeEventListener('abort', onAbort);
      offLost?.();
      settle();
    };
    const onAbort = () => finish(() => reject(signal.reason));
    const timer = setTimeout(() => finish(() => resolve('poll')), ms);
    if (signal.aborted) return onAbort();
    signal.addEventListener('abort', onAbort, { once: true });
    offLost = lost.onLost((err) => finish(() => reject(err)));
  });
}

/** An error as a dead letter keeps it: its name, SQLSTATE when it has one, and message. */
function errorText(err: unknown): string {
  if (err instanceof Error) return `${err.name}${'code' in err && typeof err.code === 'string' ? ` ${err.code}` : ''}: ${err.message}`;
  return String(err);
}

/** What the dead-letter page's recorder throws when the event above the cursor is not the failing one. */
const NOT_FAILING = new Error('tidemark: the failing event is behind the cursor');

/** The call's failure policy; a replay commits outside a page, where `beforeCommit` has nothing to run for. */
function failurePolicy(options: TailOptions, replayStandIn = false): ResolvedFailurePolicy {
  const policy = resolveFailurePolicy(options.failures);
  // A replay stand-in (the relay's, REPLAY_WITH) has its effect outside the database at replay time itself.
  if (policy.onExhausted === 'dead-letter' && options.beforeCommit !== undefined && !replayStandIn) {
    throw new InvalidOptionsError(
      'failures.onExhausted',
      "'dead-letter' cannot go with beforeCommit: a replayed dead letter commits outside any page, so effects that beforeCommit would release could be lost",
    );
  }
  return policy;
}
