/** The RabbitMQ sink's connections and batches: one confirm channel shared by every stream's batches. */
import type { Channel, ChannelModel, ConfirmChannel, Message } from 'amqplib';
import { amqp } from './client.js';
import { SinkError } from '../../../errors.js';
import { destroySocket, type Broker } from './broker.js';
import type { Outgoing } from './message.js';
import { BASIC_PUBLISH, bounded, isFrom, MAX_SIZE_TEXT, NAME, REPLY, reason, replyCode } from './protocol.js';

/** Hooks a session calls back into its sink. */
export interface SessionHooks {
  /** The session takes no new batches. */
  gone(session: Session): void;
  /** The session's connection is closed. */
  closed(session: Session): void;
  /** These exchanges were found missing at publish time. */
  missing(names: readonly string[]): void;
}

interface InFlight {
  out: Outgoing;
  batch: Batch;
}

/**
 * One connection and its confirm channel, shared by the batches of every
 * stream. It ends on the first connection or channel failure, failing every
 * batch on it; it is retired (no new batches, closed once idle) when one
 * batch fails on its own.
 */
export class Session {
  /** Why the session ended, once it has. */
  failure: SinkError | undefined;
  private retired = false;
  private blocked: string | undefined;
  /** Messages published and not yet confirmed, by message id, in publish order. */
  private readonly inFlight = new Map<string, InFlight>();
  private readonly batches = new Set<Batch>();
  private readonly drainWaiters = new Set<() => void>();
  private closing: Promise<void> | undefined;
  /** Resolves when the connection has closed, however it closed. */
  private readonly connectionClosed: Promise<void>;

  constructor(
    private readonly model: ChannelModel,
    private readonly channel: ConfirmChannel,
    private readonly broker: Broker,
    private readonly boundMs: number,
    private readonly hooks: SessionHooks,
  ) {
    model.on('error', (err: Error) => this.end(err, 'connection'));
    this.connectionClosed = new Promise((resolve) =>
      model.on('close', (err?: Error) => {
        this.end(err, 'connection');
        resolve();
      }),
    );
    model.on('blocked', (why: string) => (this.blocked = why));
    model.on('unblocked', () => (this.blocked = undefined));
    channel.on('error', (err: Error) => this.end(err, 'channel'));
    // Ahead of amqplib's own listener, which fails the unconfirmed messages
    // with a bare "channel closed": they fail with the reason instead.
    channel.prependListener('close', () => this.end(undefined, 'channel'));
    channel.on('return', (message: Message) => this.returned(message));
    channel.on('drain', () => this.wake());
  }

  get usable(): boolean {
    return !this.failure && !this.retired;
  }

  holds(id: string): boolean {
    return this.inFlight.has(id);
  }

  /** Publishes `outgoing` pipelined and resolves once each is confirmed. */
  async send(outgoing: readonly Outgoing[], signal: AbortSignal, ackTimeoutMs: number): Promise<void> {
    if (!this.usable) throw this.failure ?? new SinkError(NAME, 'the channel was retired after a failed batch; publish again', { retryable: true });
    signal.throwIfAborted();
    const batch = new Batch(outgoing.length, (b, failed) => this.settled(b, failed));
    this.batches.add(batch);
    const timeout = () => {
      const pending = batch.size - batch.confirmed;
      const blocked = this.blocked === undefined ? '' : `; the broker blocked the connection (${this.blocked})`;
      this.kill(
        new SinkError(NAME, `${this.broker.address}: ${pending} of ${batch.size} messages not confirmed within ${ackTimeoutMs} ms (ackTimeoutMs)${blocked}; reconnecting`, {
          retryable: true,
        }),
      );
    };
    const onAbort = () => batch.fail(signal.reason);
    signal.addEventListener('abort', onAbort, { once: true });
    try {
      batch.arm(ackTimeoutMs, timeout);
      for (const out of outgoing) {
        if (batch.settled) break;
        const entry: InFlight = { out, batch };
        let writable: boolean;
        try {
          writable = this.channel.publish(out.exchange, out.routingKey, out.content, out.options, (err: unknown) => this.confirmed(entry, err));
        } catch (err) {
          // A channel or connection already closing throws IllegalOperationError: retryable, unlike a message amqplib cannot encode.
          const closing = err instanceof amqp().IllegalOperationError;
          batch.fail(
            this.failure ??
              new SinkError(NAME, `seq ${out.seq}: amqplib ${closing ? 'could not send' : 'refused'} the message: ${reason(err)}`, { retryable: closing, seq: out.seq, cause: err }),
          );
          break;
        }
        this.inFlight.set(out.id, entry);
        if (!writable) {
          // The channel's buffer is full: wait for it to drain (a stalled socket never does, hence the timer).
          await new Promise<void>((resolve) => this.drainWaiters.add(resolve));
          batch.arm(ackTimeoutMs, timeout);
        }
      }
      batch.arm(ackTimeoutMs, timeout);
      batch.check();
      await batch.done;
    } finally {
      signal.removeEventListener('abort', onAbort);
    }
  }

  /** Whether exchange `name` exists (passive declare on a throwaway channel: a 404 closes the channel). */
  checkExchange(name: string): Promise<boolean> {
    return this.onThrowaway(name, async (ch) => {
      try {
        await ch.checkExchange(name);
        return true;
      } catch (err) {
        if (replyCode(err) === REPLY.notFound) return false;
        throw err;
      }
    });
  }

  /** Declares exchange `name` as a durable topic exchange. */
  async declareExchange(name: string): Promise<void> {
    await this.onThrowaway(name, (ch) => ch.assertExchange(name, 'topic', { durable: true }));
  }

  /** No new batches; the connection closes once the batches on it end. */
  retire(): void {
    if (this.retired) return;
    this.retired = true;
    this.hooks.gone(this);
    if (this.batches.size === 0) void this.shutdown();
  }

  /** Fails the batches in flight (retryable) and closes, within the bound. */
  close(): Promise<void> {
    this.end(new SinkError(NAME, 'the sink was closed', { retryable: true }), 'connection');
    return this.shutdown();
  }

  /** Runs `body` on a channel of its own, within the bound; a stall ends the session. */
  private async onThrowaway<T>(exchange: string, body: (ch: Channel) => Promise<T>): Promise<T> {
    if (this.failure) throw this.failure;
    const work = (async () => {
      const ch = await this.model.createChannel();
      ch.on('error', () => undefined); // a refused call closes the channel; its rejection carries the error
      try {
        return await body(ch);
      } finally {
        ch.close().catch(() => undefined);
      }
    })();
    try {
      return await bounded(work, this.boundMs, () => `no answer about exchange ${JSON.stringify(exchange)} within ${this.boundMs} ms (connectTimeoutMs)`);
    } catch (err) {
      if (err instanceof SinkError) {
        this.kill(err);
        throw err;
      }
      const code = replyCode(err);
      if (code === REPLY.accessRefused || code === REPLY.preconditionFailed) {
        throw new SinkError(NAME, `exchange ${JSON.stringify(exchange)}: the broker refused (${reason(err)})`, { retryable: false, cause: err });
      }
      throw this.failure ?? new SinkError(NAME, `exchange ${JSON.stringify(exchange)}: ${reason(err)}`, { retryable: true, cause: err });
    }
  }

  private confirmed(entry: InFlight, err: unknown): void {
    this.inFlight.delete(entry.out.id);
    if (err === null || err === undefined) entry.batch.confirm();
    else if (!this.failure) {
      const seq = entry.out.seq;
      entry.batch.fail(new SinkError(NAME, `seq ${seq}: the broker nacked the message (it could not take it); publishing again may succeed`, { retryable: true, seq }));
    }
  }

  /** A `basic.return`: no queue took the message. It comes before the message's ack, which then does not count. */
  private returned(message: Message): void {
    const id: unknown = message.properties.messageId;
    const entry = typeof id === 'string' ? this.inFlight.get(id) : undefined;
    if (!entry) return;
    const { seq, exchange, routingKey } = entry.out;
    entry.batch.fail(
      new SinkError(
        NAME,
        `seq ${seq}: no queue is bound to exchange ${JSON.stringify(exchange)} for routing key ${JSON.stringify(routingKey)}, so the broker returned the message: bind a queue, or change routingKey`,
        { retryable: false, seq },
      ),
    );
  }

  private settled(batch: Batch, failed: boolean): void {
    this.batches.delete(batch);
    this.wake();
    if (failed && !this.failure) this.retire();
    else if (this.retired && this.batches.size === 0) void this.shutdown();
  }

  private wake(): void {
    const waiters = [...this.drainWaiters];
    this.drainWaiters.clear();
    for (const wake of waiters) wake();
  }

  /** Ends the session on the first failure: every batch in flight fails, the connection closes. */
  private end(err: unknown, source: 'connection' | 'channel'): void {
    if (this.failure) return;
    const { general, culprit } = this.explain(err, source);
    this.failure = general;
    for (const batch of [...this.batches]) batch.fail(culprit?.batch === batch ? culprit.error : general);
    this.wake();
    this.hooks.gone(this);
    void this.shutdown();
  }

  /** Ends the session and destroys its socket at once: the connection is stalled. */
  private kill(err: SinkError): void {
    this.end(err, 'connection');
    destroySocket(this.model);
  }

  /** What a failure means for the batches in flight: `general` for all, `culprit` for the batch whose message caused it. */
  private explain(err: unknown, source: 'connection' | 'channel'): { general: SinkError; culprit?: { batch: Batch; error: SinkError } } {
    if (err instanceof SinkError) return { general: err };
    const code = replyCode(err);
    const address = this.broker.address;
    if (source === 'connection' || code === undefined) {
      const why = err === undefined ? 'closed' : `lost: ${reason(err)}`;
      return { general: new SinkError(NAME, `the connection to ${address} ${why}; the next publish reconnects`, { retryable: true, cause: err }) };
    }
    const fromPublish = isFrom(err, BASIC_PUBLISH);
    const entries = [...this.inFlight.values()];
    const exchanges = [...new Set(entries.map((e) => e.out.exchange))];
    const named = exchanges.map((name) => JSON.stringify(name)).join(', ');
    if (fromPublish && code === REPLY.notFound) {
      this.hooks.missing(exchanges);
      return { general: new SinkError(NAME, `the broker has no exchange ${named} any more (404 NOT_FOUND): declare it again`, { retryable: false, cause: err }) };
    }
    if (fromPublish && code === REPLY.accessRefused) {
      return { general: new SinkError(NAME, `the broker refused publishing to exchange ${named} (403 ACCESS_REFUSED): grant the user write permission`, { retryable: false, cause: err }) };
    }
    const general = new SinkError(NAME, `the broker closed the channel: ${reason(err)}; the next publish reconnects`, { retryable: true, cause: err });
    if (fromPublish && code === REPLY.preconditionFailed && entries.length > 0) {
      // The broker takes a channel's messages in order and stops at the first
      // over its max_message_size: the first in flight larger than the limit.
      const limit = MAX_SIZE_TEXT.exec(err instanceof Error ? err.message : '')?.[1];
      const largest = entries.reduce((a, b) => (b.out.content.length > a.out.content.length ? b : a));
      const entry = (limit === undefined ? undefined : entries.find((e) => e.out.content.length > Number(limit))) ?? largest;
      const { seq } = entry.out;
      const error = new SinkError(NAME, `seq ${seq}: its ${entry.out.content.length}-byte payload is over the broker's max message size${limit === undefined ? '' : ` (${limit} bytes)`}`, {
        retryable: false,
        seq,
        cause: err,
      });
      return { general, culprit: { batch: entry.batch, error } };
    }
    return { general };
  }

  /** Closes the connection; a broker that does not answer within the bound gets its socket destroyed. */
  private shutdown(): Promise<void> {
    this.closing ??= (async () => {
      // A destroyed socket closes the connection without the closing handshake: 'close' ends the wait then.
      const closed = Promise.race([this.model.close().catch(() => undefined), this.connectionClosed]);
      await bounded(closed, this.boundMs, () => 'close').catch(() => destroySocket(this.model));
      this.hooks.closed(this);
    })();
    return this.closing;
  }
}

/** One `publish` call's messages: it succeeds when each is confirmed, and settles once. Exported for its tests only. */
export class Batch {
  confirmed = 0;
  settled = false;
  readonly done: Promise<void>;
  private resolve!: () => void;
  private reject!: (err: unknown) => void;
  private timer: NodeJS.Timeout | undefined;
  /** When the batch last made progress: armed, or a message confirmed. */
  private progressAt = 0;

  constructor(
    readonly size: number,
    private readonly onSettled: (batch: Batch, failed: boolean) => void,
  ) {
    this.done = new Promise<void>((resolve, reject) => {
      this.resolve = resolve;
      this.reject = reject;
    });
    this.done.catch(() => undefined); // awaited by `send`; this keeps an early failure from counting as unhandled
  }

  /**
   * (Re)starts the timer: no progress (a confirm, or a re-arm) for `ms` fails
   * the batch through `onTimeout`. A confirm only notes the time; the timer,
   * when it fires early, waits out the rest, so a large batch confirmed at a
   * steady pace is never failed for its size.
   */
  arm(ms: number, onTimeout: () => void): void {
    if (this.settled) return;
    clearTimeout(this.timer);
    this.progressAt = Date.now();
    const fire = () => {
      const idle = Date.now() - this.progressAt;
      if (idle < ms) this.timer = setTimeout(fire, ms - idle);
      else onTimeout();
    };
    this.timer = setTimeout(fire, ms);
  }

  confirm(): void {
    this.confirmed += 1;
    this.progressAt = Date.now();
    this.check();
  }

  /** Succeeds once every message is sent and confirmed. */
  check(): void {
    if (this.settled || this.confirmed < this.size) return;
    this.settle(false);
    this.resolve();
  }

  fail(err: unknown): void {
    if (this.settled) return;
    this.settle(true);
    this.reject(err);
  }

  private settle(failed: boolean): void {
    this.settled = true;
    clearTimeout(this.timer);
    this.onSettled(this, failed);
  }
}
