import type pg from 'pg';
import { backoffMs } from '../backoff.js';
import { ClosedError, HandlerError, InvalidOptionsError, SinkError, isRetryable } from '../errors.js';
import { poolOption } from '../options.js';
import { sleep } from '../db/acquire.js';
import { quoteIdent } from '../db/queryable.js';
import { boundedQuery } from '../db/deadline.js';
import { StreamClient } from '../consumer/stream-client.js';
import { CommitThrough } from '../consumer/page.js';
import { untraced } from '../consumer/handler-span.js';
import { readsText } from '../consumer/exact-json.js';
import { loadOtel } from '../tracing.js';
import { inPublishSpan } from './publish-span.js';
import type { Handler, StreamEvent } from '../consumer/events.js';
import { REPLAY_WITH } from '../consumer/failures.js';
import { notifyObserver } from '../callbacks.js';
import type { RelayEvent } from './events.js';
import { resolveRelayOptions, SESSION_DEATH_DETECTION_MS, type RelayOptions, type ResolvedRelayOptions } from './options.js';
import type { RelayMessage, Sink } from './sink.js';

/** Where lag() stops counting, as readStatus does. */
const LAG_COUNT_LIMIT = 1_000_000;

/** How far a relayed stream is behind, read from the database. */
export interface RelayLag {
  stream: string;
  /** The relay's committed cursor on this stream. */
  cursor: bigint;
  /** Events of the stream at or below safe_seq not yet relayed, counted up to 1,000,000. */
  events: number;
  /** Age of the oldest of them (its `occurred_at`), by the database clock; 0 when none. */
  seconds: number;
}

/** What the relay knows of one stream between a page's acknowledgements and its commit. */
interface StreamState {
  /** Retryable failures since the last page that committed. */
  attempt: number;
  /** The first chunk of the next publish: the whole page, or 1 after a failure (doubling within the page). */
  window: number;
  /** With `onRefused: 'dead-letter'`: the refusal of an event to set aside; the handler throws it for that event until it is a dead letter. */
  refused?: SinkError;
}

/**
 * Forwards streams to a message broker: every event, in seq order per
 * stream, with a durable cursor per (consumer, stream).
 *
 * Each stream is followed by a `StreamClient` tailer. A page's events are
 * handed to the sink as one batch, sent pipelined, and the page's cursor
 * advance commits only after the broker acknowledged every one of them
 * (`beforeCommit`): the cursor never passes an event the broker has not
 * taken. A failure rolls the page back whole; after a back-off the relay
 * publishes again from the committed cursor. So an event is published at
 * least once, and a broker that recognises ids (JetStream's `Nats-Msg-Id`
 * within its duplicate window) stores it exactly once.
 *
 * A second relay of the same consumer waits as a standby: it finds the
 * cursor held and retries until the first one stops.
 *
 * @example
 * const relay = new Relay(pool, new NatsSink({ url: 'nats://127.0.0.1:4222' }), { consumer: 'relay', streams: ['orders'] });
 * await relay.open();
 * await relay.run(signal); // until signal aborts
 */
export class Relay {
  /** The validated, frozen options in force. */
  readonly options: ResolvedRelayOptions;
  /** Where events go. */
  readonly sink: Sink;
  /**
   * The longest time, in milliseconds, between publishing an event and
   * publishing it again: after a failure in this process (the sink's
   * acknowledgement timeout, the back-off, taking the cursor again), or
   * after a crash (`restartWithinMs`, plus the time the server takes to end
   * a vanished session and free the cursor). A broker's duplicate window
   * must be longer for publishing to be exactly once.
   */
  readonly republishWithinMs: number;
  private readonly pool: pg.Pool;
  private readonly client: StreamClient;
  private readonly hard = new AbortController();
  private readonly streams = new Map<string, StreamState>();
  private opened: Promise<void> | undefined;
  private closed = false;

  constructor(pool: pg.Pool, sink: Sink, options: RelayOptions) {
    poolOption(pool);
    if (!sink || typeof sink.publish !== 'function' || typeof sink.open !== 'function') throw new InvalidOptionsError('sink', 'expected a Sink');
    this.pool = pool;
    this.sink = sink;
    this.options = resolveRelayOptions(options);
    const o = this.options;
    if (o.onRefused === 'dead-letter' && sink.inOrderOnly !== undefined) {
      throw new InvalidOptionsError('onRefused', `'dead-letter' needs a sink that takes an event after later ones (a dead letter's replay), and ${sink.inOrderOnly}: use 'stop'`);
    }
    this.republishWithinMs =
      o.restartWithinMs + SESSION_DEATH_DETECTION_MS + o.lockTimeoutMs + 2 * o.responseTimeoutMs + o.retryMaxMs + (sink.ackTimeoutMs ?? 0);
    this.client = new StreamClient(pool, {
      schema: o.schema,
      batchSize: o.batchSize,
      pollIntervalMs: o.pollIntervalMs,
      listen: o.listen,
      lockTimeoutMs: o.lockTimeoutMs,
      responseTimeoutMs: o.responseTimeoutMs,
      retryMinMs: o.retryMinMs,
      retryMaxMs: o.retryMaxMs,
      // Read the next page while the broker acknowledges this one.
      prefetch: true,
      onError: o.onError,
      observer: (event) => {
        if (event.type === 'retry') {
          this.emit({ type: 'retry', stream: event.stream, source: 'database', error: event.error, attempt: event.attempt, delayMs: event.delayMs });
        } else if (event.type === 'page' && event.consumer === this.options.consumer) {
          this.onPage(event.stream);
        } else if ((event.type === 'dead-letter' || event.type === 'dead-letter:replay') && event.consumer === this.options.consumer) {
          const state = this.streams.get(event.stream);
          if (event.type === 'dead-letter' && state?.refused?.seq === event.seq) state.refused = undefined;
          this.emit({ type: event.type, stream: event.stream, seq: event.seq, id: event.id, error: event.error });
        }
      },
    });
  }

  /**
   * Connects the sink and checks its destination. Rejects with the sink's
   * `SinkError` (retryable when the broker cannot be reached now). `run`
   * opens the sink itself when this was not called; call it first to fail
   * fast on a broker that is missing or misconfigured.
   */
  async open(signal?: AbortSignal): Promise<void> {
    if (this.closed) throw new ClosedError('Relay');
    this.opened ??= this.readOrigin()
      .then((origin) =>
        this.sink.open(
          {
            schema: this.options.schema,
            streams: this.options.streams,
            republishWithinMs: this.republishWithinMs,
            origin,
            onRetry: (r) => this.emit({ type: 'retry', stream: r.stream, source: 'sink', error: r.error, attempt: r.attempt, delayMs: r.delayMs, seq: r.seq }),
          },
          signal ?? this.hard.signal,
        ),
      )
      .then(
        () => this.emit({ type: 'open', sink: this.sink.name, description: this.sink.description }),
        (err: unknown) => {
          this.opened = undefined;
          throw err;
        },
      );
    return this.opened;
  }

  /**
   * Relays every stream until `signal` aborts, then finishes the page in
   * flight (its acknowledgements and its cursor commit) and resolves.
   * Retryable failures of the broker or the database back off and go on
   * from the committed cursor, including a sink that cannot be opened yet.
   * Rejects with the first error that is not retryable (a misconfigured
   * destination, a message the broker can never take, `ResyncRequiredError`
   * when retention removed events before they were relayed), after the
   * other streams finished their pages in flight.
   */
  async run(signal?: AbortSignal): Promise<void> {
    if (this.closed) throw new ClosedError('Relay');
    if (signal?.aborted) return;
    const stop = new AbortController();
    const forward = () => stop.abort(signal!.reason);
    signal?.addEventListener('abort', forward, { once: true });
    const hardStop = () => stop.abort(this.hard.signal.reason);
    this.hard.signal.addEventListener('abort', hardStop, { once: true });
    try {
      if (!(await this.retrying({ attempt: 0 }, '', 'sink', stop.signal, () => this.open(stop.signal)))) return;
      let failure: { error: unknown } | undefined;
      await Promise.all(
        this.options.streams.map((stream) =>
          this.relayStream(stream, stop.signal).catch((err: unknown) => {
            failure ??= { error: err };
            stop.abort(err);
          }),
        ),
      );
      if (failure) throw failure.error;
      if (this.hard.signal.aborted) throw new ClosedError('Relay');
    } finally {
      signal?.removeEventListener('abort', forward);
      this.hard.signal.removeEventListener('abort', hardStop);
    }
  }

  /** The installation's origin id, from the watermark row (migration 18). */
  private async readOrigin(): Promise<string> {
    const r = await boundedQuery<{ origin: string }>(
      this.pool,
      this.options.responseTimeoutMs,
      'the origin id',
      `SELECT origin::text AS origin FROM ${quoteIdent(this.options.schema)}.watermark`,
      [],
    );
    if (!r.rows[0]) throw new Error(`${this.options.schema}.watermark has no row: run tidemark migrate`);
    return r.rows[0].origin;
  }

  /** How far each stream is behind, read from the database (for metrics and health). */
  async lag(): Promise<RelayLag[]> {
    const s = quoteIdent(this.options.schema);
    // Bounded twice, as readStatus is: the count stops at 1,000,000 events
    // (a relay far behind must not make every scrape scan its backlog), and
    // the answer must come within responseTimeoutMs (a half-open connection
    // is destroyed, never waited on).
    const r = await boundedQuery<{ stream: string; cursor: string; events: string; seconds: number | null }>(
      this.pool,
      this.options.responseTimeoutMs,
      'the relay lag',
      `SELECT st.stream, coalesce(c.seq, 0) AS cursor,
              (SELECT count(*) FROM (SELECT 1 FROM ${s}.events e WHERE e.stream = st.stream AND e.seq > coalesce(c.seq, 0) AND e.seq <= w.safe_seq
                LIMIT ${LAG_COUNT_LIMIT}) p) AS events,
              (SELECT extract(epoch FROM now() - e.occurred_at)::float8 FROM ${s}.events e
                WHERE e.stream = st.stream AND e.seq > coalesce(c.seq, 0) AND e.seq <= w.safe_seq ORDER BY e.seq LIMIT 1) AS seconds
         FROM pg_catalog.unnest($2::text[]) AS st(stream) CROSS JOIN ${s}.watermark w
         LEFT JOIN ${s}.cursors c ON c.consumer = $1 AND c.stream = st.stream`,
      [this.options.consumer, this.options.streams],
    );
    return r.rows.map((row) => ({ stream: row.stream, cursor: BigInt(row.cursor), events: Number(row.events), seconds: Math.max(0, row.seconds ?? 0) }));
  }

  /** Stops at once: publishes in flight are abandoned (their pages roll back), then the sink closes. Idempotent. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.hard.abort(new ClosedError('Relay'));
    await this.client.close();
    await this.sink.close();
  }

  /** Follows one stream until `signal` aborts (resolves) or a non-retryable error (rejects). */
  private async relayStream(stream: string, signal: AbortSignal): Promise<void> {
    const { consumer, schema } = this.options;
    const state: StreamState = { attempt: 0, window: Number.POSITIVE_INFINITY };
    this.streams.set(stream, state);
    let batch: RelayMessage[] = [];
    // No span per event here: the relay's span is per published page (below).
    // It reads the text of payload and headers only: its events parse them on first read (readsText).
    const handler = readsText(untraced((event: StreamEvent) => {
      // The event the sink refused (onRefused 'dead-letter'): failing here makes the
      // stream client's policy commit the events before it, then record it as a dead letter.
      if (state.refused !== undefined) {
        // Past it: set aside already (its record's answer may have been lost); never again.
        if (event.seq > state.refused.seq!) state.refused = undefined;
        else if (event.seq === state.refused.seq) throw state.refused;
      }
      // A page that failed before its publish left its events here; its retry starts over.
      if (batch.length > 0 && event.seq <= batch[batch.length - 1]!.event.seq) batch = [];
      batch.push({ id: `${schema}:${event.seq}`, schema, event });
    }));
    // Runs after the page's last event, before its cursor advance and COMMIT:
    // the cursor commits only once the broker has acknowledged every event.
    // After a failure the page goes out in growing chunks (1, 2, 4, ...), so
    // the refused event goes first and alone, and a failure commits the
    // acknowledged prefix (CommitThrough): a broker that takes only a few
    // messages at a time (a full queue) still lets the relay advance.
    const publishPage = async () => {
      const messages = batch;
      batch = [];
      const started = performance.now();
      let sent = 0;
      try {
        for (let chunk = state.window; sent < messages.length; chunk *= 2) {
          const part = sent === 0 && chunk >= messages.length ? messages : messages.slice(sent, sent + chunk);
          await this.sink.publish(part, this.hard.signal);
          sent += part.length;
        }
      } catch (err) {
        state.window = 1;
        this.emit({ type: 'failed', stream, count: messages.length - sent, error: err });
        if (this.setsAside(err, messages.slice(sent))) state.refused = err as SinkError;
        if (sent > 0) {
          const last = messages[sent - 1]!.event;
          this.emit({ type: 'published', stream, count: sent, cursor: last.seq, ackMs: performance.now() - started, lastOccurredAt: last.occurredAt, partial: true });
          throw new CommitThrough(last.seq, messages[sent]!.event.seq, err);
        }
        throw err;
      }
      state.window = Number.POSITIVE_INFINITY;
      // Reported here, not after the COMMIT: a stop that aborts the tail right after
      // its last page commits would otherwise leave that page unreported.
      const last = messages[messages.length - 1]!.event;
      this.emit({ type: 'published', stream, count: messages.length, cursor: last.seq, ackMs: performance.now() - started, lastOccurredAt: last.occurredAt });
    };
    // With @opentelemetry/api installed, each page publishes in a PRODUCER span (src/relay/publish-span.ts).
    const otel = await loadOtel();
    const beforeCommit = () => inPublishSpan(otel, this.sink.name, stream, batch, publishPage);
    // onRefused 'dead-letter': the stream client's failure policy records a refused
    // event; a replay of it publishes it from the handler's stand-in (replayPublisher).
    const failures =
      this.options.onRefused === 'dead-letter' ? { failures: { maxAttempts: 1, onExhausted: 'dead-letter' as const }, [REPLAY_WITH]: this.replayPublisher(stream) } : {};
    await this.retrying(state, stream, 'database', signal, () => this.client.tail(consumer, stream, handler, { signal, beforeCommit, ...failures }));
  }

  /** Whether `err` is a refusal the relay sets aside (onRefused 'dead-letter'): the sink's, not retryable, naming one of `unsent`. */
  private setsAside(err: unknown, unsent: readonly RelayMessage[]): boolean {
    if (this.options.onRefused !== 'dead-letter' || !(err instanceof SinkError) || err.retryable || err.seq === undefined) return false;
    return unsent.some((m) => m.event.seq === err.seq);
  }

  /**
   * What a replay of a dead letter of `stream` runs (`tidemark dead-letters
   * replay`), in the replay's transaction: publishes the event alone and
   * returns once the broker acknowledged it, so the dead letter is deleted
   * only then. A broker that is down is waited for (the replay stays asked
   * for if the relay stops meanwhile); a refusal fails the replay, which
   * leaves the dead letter with one try more and the sink's error.
   */
  private replayPublisher(stream: string): Handler {
    const { schema, retryMinMs, retryMaxMs } = this.options;
    return async (event, _tx, context) => {
      const message: RelayMessage = { id: `${schema}:${event.seq}`, schema, event };
      for (let attempt = 1; ; attempt += 1) {
        try {
          await this.sink.publish([message], this.hard.signal);
          return;
        } catch (err) {
          if (!isRetryable(err) || context.signal.aborted) throw err;
          const delayMs = backoffMs(attempt, retryMinMs, retryMaxMs);
          this.emit({ type: 'retry', stream, source: 'sink', error: err, attempt, delayMs, seq: event.seq });
          await sleep(delayMs, context.signal);
        }
      }
    };
  }

  /** The stream client's page event: a page committed, so the failures before it are over. */
  private onPage(stream: string): void {
    const state = this.streams.get(stream);
    if (state) state.attempt = 0;
  }

  /**
   * Runs `body` until it resolves or `signal` aborts, backing off after each
   * retryable failure (`state.attempt` counts them; a committed page resets
   * it). Returns false when `signal` aborted, true when `body` resolved;
   * rethrows the first non-retryable error (a `HandlerError` over a sink's
   * error is unwrapped to that error).
   */
  private async retrying(state: { attempt: number; refused?: SinkError }, stream: string, source: 'sink' | 'database', signal: AbortSignal, body: () => Promise<unknown>): Promise<boolean> {
    const o = this.options;
    for (;;) {
      if (signal.aborted) return false;
      try {
        await body();
        return true;
      } catch (err) {
        if (signal.aborted) return false;
        const cause = err instanceof HandlerError && err.cause instanceof SinkError ? err.cause : err;
        // A refusal to set aside: tail again at once, and the next page records it (see relayStream).
        if (state.refused !== undefined && cause === state.refused) continue;
        if (!isRetryable(cause)) throw cause;
        state.attempt += 1;
        const delayMs = backoffMs(state.attempt, o.retryMinMs, o.retryMaxMs);
        this.emit({ type: 'retry', stream, source: cause instanceof SinkError ? 'sink' : source, error: cause, attempt: state.attempt, delayMs });
        try {
          await sleep(delayMs, signal);
        } catch {
          return false;
        }
      }
    }
  }

  private emit(event: RelayEvent): void {
    notifyObserver(this.options.observer, event, this.options.onError);
  }
}
