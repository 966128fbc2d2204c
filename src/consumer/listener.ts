import type pg from 'pg';
import { backoffCeilingMs } from '../backoff.js';
import { ConnectionLostError } from '../errors.js';
import { sleep } from '../db/acquire.js';
import { withDeadline } from '../db/deadline.js';
import { quoteIdent } from '../db/queryable.js';
import type { ConsumerEvent, WakeReason } from './events.js';

/** A connection that stayed up this long resets the reconnect back-off. */
const STABLE_MS = 30_000;

export interface ListenerOptions {
  channel: string;
  backoffMinMs: number;
  backoffMaxMs: number;
  acquireTimeoutMs: number;
  /** While listening, a `SELECT 1` this often, each answered within this long, or the connection is dropped and the listener reconnects. */
  responseTimeoutMs: number;
  emit: (event: ConsumerEvent) => void;
}

interface Waiter {
  afterSeq: bigint;
  wake: (reason: WakeReason) => void;
}

/**
 * LISTENs for the watermarker's notifications on one pooled connection
 * shared by all of a client's tailers. A latency hint only: tailers poll
 * anyway, so nothing here ever fails a tail. When the connection cannot be
 * had (pool exhausted) or dies, the listener backs off exponentially up to
 * `backoffMaxMs` and tries again. Its connection goes back to the pool only
 * after a successful UNLISTEN; otherwise it is destroyed.
 */
/** What tells a wait that its page's connection was lost (a CursorHold). */
export interface LostSource {
  onLost(listener: (err: Error) => void): () => void;
}

export class Listener {
  /** Bumped on every notification; tailers compare it to skip a wait they would have missed. */
  generation = 0;
  /** The safe_seq of the latest notification. */
  lastNotified = 0n;
  private readonly waiters = new Set<Waiter>();
  private subscribers = 0;
  private stop: AbortController | undefined;
  private loop: Promise<void> | undefined;
  /** At most one outstanding pool checkout, reused across attempts. */
  private pending: Promise<pg.PoolClient> | undefined;

  constructor(
    private readonly pool: pg.Pool,
    private readonly options: ListenerOptions,
  ) {}

  /** Registers a tailer; the first one starts the connection loop. Returns the unsubscribe function. */
  subscribe(): () => Promise<void> {
    this.subscribers += 1;
    if (this.subscribers === 1) {
      this.stop = new AbortController();
      this.loop = this.run(this.stop.signal);
    }
    let done = false;
    return async () => {
      if (done) return;
      done = true;
      this.subscribers -= 1;
      if (this.subscribers === 0) await this.shutdown();
    };
  }

  /**
   * Waits until a notification announces a safe_seq above `afterSeq`, the
   * listener (re)connects, or `timeoutMs` passes. If a notification arrived
   * since `sinceGeneration` (read before the page), returns at once.
   * Rejects with the abort reason, or when `lost` reports the connection lost.
   */
  wait(afterSeq: bigint, sinceGeneration: number, timeoutMs: number, signal: AbortSignal, lost?: LostSource): Promise<WakeReason> {
    if (this.generation !== sinceGeneration && this.lastNotified > afterSeq) return Promise.resolve('notify');
    return new Promise<WakeReason>((resolve, reject) => {
      let offLost: (() => void) | undefined = undefined; // set below; finish may run first (an aborted signal)
      const finish = (settle: () => void) => {
        clearTimeout(timer);
        signal.removeEventListener('abort', onAbort);
        this.waiters.delete(waiter);
        offLost?.();
        settle();
      };
      const waiter: Waiter = { afterSeq, wake: (reason) => finish(() => resolve(reason)) };
      const onAbort = () => finish(() => reject(signal.reason));
      const timer = setTimeout(() => waiter.wake('poll'), timeoutMs);
      if (signal.aborted) return onAbort();
      signal.addEventListener('abort', onAbort, { once: true });
      this.waiters.add(waiter);
      offLost = lost?.onLost((err) => finish(() => reject(err)));
    });
  }

  private notified = (message: pg.Notification): void => {
    if (message.channel !== this.options.channel) return;
    let seq: bigint;
    try {
      seq = BigInt(message.payload ?? '');
    } catch {
      return; // not a watermarker's payload: ignore
    }
    this.generation += 1;
    this.lastNotified = seq;
    this.options.emit({ type: 'listener:notification', safeSeq: seq });
    for (const waiter of [...this.waiters]) if (seq > waiter.afterSeq) waiter.wake('notify');
  };

  private async run(stop: AbortSignal): Promise<void> {
    const { backoffMinMs, backoffMaxMs, emit } = this.options;
    let attempt = 0;
    while (!stop.aborted) {
      let failure: unknown;
      try {
        const client = await this.checkout(stop);
        const up = Date.now();
        const healthy = await this.listen(client, stop);
        if (healthy || Date.now() - up >= STABLE_MS) attempt = 0;
        if (stop.aborted) break;
        failure = new ConnectionLostError('listener');
      } catch (err) {
        if (stop.aborted) break;
        failure = err;
      }
      const retryInMs = backoffCeilingMs(attempt + 1, backoffMinMs, backoffMaxMs);
      attempt += 1;
      emit({ type: 'listener:error', error: failure, attempt, retryInMs });
      await sleep(retryInMs, stop).catch(() => undefined);
    }
    emit({ type: 'listener:stopped' });
  }

  /** A pooled connection within `acquireTimeoutMs`, keeping one checkout pending across attempts. */
  private async checkout(stop: AbortSignal): Promise<pg.PoolClient> {
    const pending = (this.pending ??= this.pool.connect());
    let timer: NodeJS.Timeout | undefined;
    let onAbort: (() => void) | undefined;
    const giveUp = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error(`no pooled connection for the listener within ${this.options.acquireTimeoutMs} ms`)), this.options.acquireTimeoutMs);
      onAbort = () => reject(stop.reason);
      stop.addEventListener('abort', onAbort, { once: true });
    });
    try {
      const client = await Promise.race([pending, giveUp]);
      this.pending = undefined;
      return client;
    } catch (err) {
      if (this.pending === pending) {
        // A failed checkout is forgotten; a slow one stays pending for the next attempt.
        pending.then(
          () => undefined,
          () => {
            if (this.pending === pending) this.pending = undefined;
          },
        );
      }
      throw err;
    } finally {
      clearTimeout(timer);
      stop.removeEventListener('abort', onAbort!);
    }
  }

  /**
   * LISTENs on `client` until it fails or `stop` aborts, then gives the
   * connection back (UNLISTEN succeeded) or destroys it. Returns whether a
   * notification arrived on it (proof that it worked).
   */
  private async listen(client: pg.PoolClient, stop: AbortSignal): Promise<boolean> {
    let broken: unknown;
    let onFailure!: (err?: unknown) => void;
    const failed = new Promise<void>((resolve) => {
      onFailure = (err?: unknown) => {
        broken ??= err ?? new Error('listener connection ended');
        resolve();
      };
    });
    const generation = this.generation;
    let pinger: NodeJS.Timeout | undefined;
    client.on('error', onFailure);
    client.on('end', onFailure);
    client.on('notification', this.notified);
    const channel = quoteIdent(this.options.channel);
    try {
      const bound = this.options.responseTimeoutMs;
      await withDeadline(client, bound, 'listener', () => client.query(`LISTEN ${channel}`));
      this.options.emit({ type: 'listener:listening' });
      // An idle LISTEN connection hears nothing from a half-open path: probe it.
      pinger = setInterval(() => {
        withDeadline(client, bound, 'listener', () => client.query('SELECT 1')).catch(onFailure);
      }, bound);
      // Notifications sent while nobody listened are lost: wake everyone to page once.
      for (const waiter of [...this.waiters]) waiter.wake('listener');
      let onAbort: (() => void) | undefined;
      const stopped = new Promise<void>((resolve) => {
        onAbort = () => resolve();
        if (stop.aborted) resolve();
        else stop.addEventListener('abort', onAbort, { once: true });
      });
      await Promise.race([failed, stopped]);
      stop.removeEventListener('abort', onAbort!);
      clearInterval(pinger);
      if (broken === undefined) await withDeadline(client, this.options.responseTimeoutMs, 'listener', () => client.query(`UNLISTEN ${channel}`));
    } catch (err) {
      broken ??= err;
    } finally {
      clearInterval(pinger);
      client.off('notification', this.notified);
      client.off('error', onFailure);
      client.off('end', onFailure);
      client.release(broken === undefined ? undefined : broken instanceof Error ? broken : new Error(String(broken)));
    }
    return this.generation !== generation;
  }

  private async shutdown(): Promise<void> {
    const { stop, loop } = this;
    this.stop = undefined;
    this.loop = undefined;
    stop?.abort();
    await loop;
    // A checkout still in flight goes straight back when it arrives (unless
    // a new subscriber's loop has taken it over). Wait for it a little, so
    // that in the usual case (a connection being opened) every connection is
    // back in the pool when the tail ends; an exhausted pool is not waited for.
    const pending = this.pending;
    if (pending && this.subscribers === 0) {
      this.pending = undefined;
      const returned = pending.then((client) => client.release(), () => undefined);
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([returned, new Promise<void>((resolve) => (timer = setTimeout(resolve, this.options.acquireTimeoutMs)))]);
      clearTimeout(timer);
    }
  }
}
