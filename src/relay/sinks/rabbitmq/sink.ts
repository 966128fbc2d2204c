/**
 * The RabbitMQ sink: each relayed event becomes one persistent AMQP message
 * published to an exchange on a publisher-confirm channel (amqplib).
 *
 * Delivery is at least once. Messages are published `persistent` and
 * `mandatory`, and a batch counts as published only once the broker has
 * confirmed every message of it; a message no queue takes comes back as a
 * `basic.return` and stops the relay instead of vanishing. After a failure
 * or a crash the relay publishes again every event of a batch it did not
 * see confirmed, some of which the broker may already have stored, so
 * consumers deduplicate by the AMQP `message_id`, `<schema>:<seq>`, which is
 * the same on every publish of an event.
 *
 * Order: RabbitMQ keeps the order of the messages one channel routes to one
 * queue, and the sink publishes every stream on its one confirm channel, each
 * in seq order, so a queue holds each tidemark stream in order, except around
 * a republish, where events already stored come again after later ones
 * (`1 2 3 4 3 4 5`).
 *
 * Connections: amqplib does not reconnect by itself. A lost connection, a
 * closed channel, or a batch that goes `ackTimeoutMs` without a confirm
 * (the connection is then destroyed) fails the batches in
 * flight with a retryable `SinkError`, and the next `publish` connects
 * again. A batch that fails on its own (nack, return, abort) retires its
 * connection: no new batch goes to it, and it closes once the other streams'
 * batches on it end, so a late confirm or return of the failed attempt is
 * never taken for its republished copy.
 */
import { Buffer } from 'node:buffer';
import type { ConfirmChannel } from 'amqplib';
import { ClosedError, InvalidOptionsError, SinkError } from '../../../errors.js';
import { checkKnownOptions, echoValue, integerOption } from '../../../options.js';
import type { RelayMessage, Sink, SinkTarget } from '../../sink.js';
import { compileTemplate, type Template } from '../../template.js';
import { connectBroker, destroySocket, parseUrl, type Broker } from './broker.js';
import { headerTable, probe, shortString, type Outgoing } from './message.js';
import { abortable, bounded, NAME, reason, SHORTSTR_MAX_BYTES } from './protocol.js';
import { Session } from './session.js';
import { CE_STRUCTURED_CONTENT_TYPE, messageFormat, type FormatOptions, type MessageFormat } from '../../format.js';

/** Options for {@link RabbitMqSink}. Every duration is in milliseconds. */
export interface RabbitMqSinkOptions extends FormatOptions {
  /**
   * The broker: `amqp://USER:PASS@HOST:PORT/VHOST`, or `amqps://` for TLS
   * (certificates verified). Port 5672 (5671 for amqps) and vhost `/` when
   * left out; a vhost holding `/` is written `%2F`. Query parameters
   * `heartbeat` (seconds) and `frameMax` are passed to the broker. Required.
   */
  url: string;
  /** Template of the exchange each message is published to (see `compileTemplate`). Default `tidemark`. */
  exchange?: string;
  /** Template of each message's routing key. Default `{stream}.{kind}`. */
  routingKey?: string;
  /** Declare a missing exchange as a durable `topic` exchange instead of refusing to start. Default false. */
  createExchange?: boolean;
  /** How long a batch waits for the broker's confirms before it fails (retryable) and the connection is dropped. Default 10000. */
  ackTimeoutMs?: number;
  /** How long connecting, and each declaration or check, may take before it fails (retryable); also bounds `close()`. Default 5000. */
  connectTimeoutMs?: number;
}

const DEFAULTS = { exchange: 'tidemark', routingKey: '{stream}.{kind}', createExchange: false, ackTimeoutMs: 10_000, connectTimeoutMs: 5_000 };

/**
 * Publishes relayed events to RabbitMQ. See the module comment for the
 * delivery guarantee (at least once: consumers deduplicate by `message_id`).
 *
 * @example
 * const sink = new RabbitMqSink({ url: 'amqp://relay:secret@mq:5672/prod', routingKey: '{stream}.{kind}' });
 * const relay = new Relay(pool, sink, { consumer: 'to-rabbit', streams: ['orders'] });
 */
export class RabbitMqSink implements Sink {
  readonly name = NAME;
  readonly description: string;
  readonly ackTimeoutMs: number;
  private readonly connectTimeoutMs: number;
  private readonly createExchange: boolean;
  private readonly broker: Broker;
  private readonly exchange: Template;
  private readonly routingKey: Template;
  private readonly format: MessageFormat;
  /** The installation's origin id, from `open` (CloudEvents ids). */
  private origin = '';
  /** Exchanges seen to exist (or declared); a 404 at publish time removes them. */
  private readonly known = new Set<string>();
  private readonly sessions = new Set<Session>();
  private current: Session | undefined;
  private connecting: Promise<Session> | undefined;
  private closed = false;
  private closing: Promise<void> | undefined;

  /** Checks `options` (throws `InvalidOptionsError` naming the option); connects to nothing. */
  constructor(options: RabbitMqSinkOptions) {
    if (typeof options !== 'object' || options === null) throw new InvalidOptionsError('options', 'expected an object');
    const broker = parseUrl(options.url);
    const exchange = compileTemplate(options.exchange ?? DEFAULTS.exchange, 'exchange');
    const routingKey = compileTemplate(options.routingKey ?? DEFAULTS.routingKey, 'routingKey');
    const createExchange = options.createExchange ?? DEFAULTS.createExchange;
    if (typeof createExchange !== 'boolean') throw new InvalidOptionsError('createExchange', `expected a boolean, got ${echoValue(createExchange)}`);
    const resolved = {
      url: broker.shown,
      exchange: exchange.text,
      routingKey: routingKey.text,
      createExchange,
      ackTimeoutMs: integerOption(options, 'ackTimeoutMs', DEFAULTS.ackTimeoutMs, 1, 3_600_000),
      connectTimeoutMs: integerOption(options, 'connectTimeoutMs', DEFAULTS.connectTimeoutMs, 1, 600_000),
      format: undefined,
      ceSource: undefined,
      ceType: undefined,
    };
    checkKnownOptions(options, resolved, 'RabbitMqSink');
    this.broker = broker;
    this.exchange = exchange;
    this.routingKey = routingKey;
    this.createExchange = createExchange;
    this.ackTimeoutMs = resolved.ackTimeoutMs;
    this.connectTimeoutMs = resolved.connectTimeoutMs;
    this.format = messageFormat(options, NAME, true);
    const shown = this.format.format === 'tidemark' ? '' : ` as ${this.format.format}`;
    this.description = `${broker.shown} exchange ${exchange.text} routing key ${routingKey.text}${shown}`;
  }

  /**
   * Connects and checks each exchange the template names without per-event
   * fields (one per stream of `target`); a template naming `kind`, `key` or
   * `seq` is checked at the first use of each name instead.
   */
  async open(target: SinkTarget, signal: AbortSignal): Promise<void> {
    if (this.closed) throw new ClosedError('RabbitMqSink');
    signal.throwIfAborted();
    this.origin = target.origin;
    const session = await this.session(signal);
    if (!this.exchange.fields.every((field) => field === 'schema' || field === 'stream')) return;
    const streams = this.exchange.fields.length === 0 ? [''] : target.streams;
    const names = new Set(streams.map((stream) => shortString(this.exchange.render(probe(target.schema, stream)), 'exchange')));
    for (const name of names) await this.ensureExchange(session, name, signal);
  }

  /** Publishes `messages` pipelined and resolves once the broker confirmed each; see {@link Sink.publish}. */
  async publish(messages: readonly RelayMessage[], signal: AbortSignal): Promise<void> {
    if (this.closed) throw new ClosedError('RabbitMqSink');
    signal.throwIfAborted();
    if (messages.length === 0) return;
    const outgoing = messages.map((message) => this.prepare(message));
    let session = await this.session(signal);
    for (const name of new Set(outgoing.map((out) => out.exchange))) await this.ensureExchange(session, name, signal);
    // A check may have outlived the session; and an id still in flight on
    // this channel (a republish racing its first attempt) must go to a fresh one.
    if (!session.usable || outgoing.some((out) => session.holds(out.id))) {
      session.retire();
      session = await this.session(signal);
    }
    await session.send(outgoing, signal, this.ackTimeoutMs);
  }

  /** Closes the channel and connection, waiting at most `connectTimeoutMs` for the broker. Idempotent. */
  close(): Promise<void> {
    this.closing ??= (async () => {
      this.closed = true;
      await this.connecting?.catch(() => undefined);
      await Promise.all([...this.sessions].map((session) => session.close()));
    })();
    return this.closing;
  }

  /** The live session, or a new one (one connection attempt shared by concurrent callers). */
  private async session(signal: AbortSignal): Promise<Session> {
    if (this.current?.usable) return this.current;
    this.connecting ??= this.connectSession().finally(() => (this.connecting = undefined));
    return await abortable(this.connecting, signal);
  }

  private async connectSession(): Promise<Session> {
    const model = await connectBroker(this.broker, this.connectTimeoutMs);
    let channel: ConfirmChannel;
    try {
      channel = await bounded(model.createConfirmChannel(), this.connectTimeoutMs, () => `no channel within ${this.connectTimeoutMs} ms (connectTimeoutMs)`);
    } catch (err) {
      destroySocket(model);
      throw err instanceof SinkError ? err : new SinkError(NAME, `${this.broker.address}: opening a channel failed: ${reason(err)}`, { retryable: true, cause: err });
    }
    const session = new Session(model, channel, this.broker, this.connectTimeoutMs, {
      gone: (s) => {
        if (this.current === s) this.current = undefined;
      },
      closed: (s) => this.sessions.delete(s),
      missing: (names) => names.forEach((name) => this.known.delete(name)),
    });
    this.sessions.add(session);
    if (this.closed) {
      await session.close();
      throw new ClosedError('RabbitMqSink');
    }
    this.current = session;
    return session;
  }

  /** Checks that exchange `name` exists, declaring it when `createExchange`; remembered once seen. */
  private async ensureExchange(session: Session, name: string, signal: AbortSignal): Promise<void> {
    if (this.known.has(name)) return;
    if (!(await abortable(session.checkExchange(name), signal))) {
      if (!this.createExchange) {
        throw new SinkError(
          NAME,
          `exchange ${JSON.stringify(name)} does not exist on ${this.broker.address} (vhost ${JSON.stringify(this.broker.vhost)}): ` +
            'declare it, or set createExchange (--create-exchange) to have tidemark declare it as a durable topic exchange',
          { retryable: false },
        );
      }
      await abortable(session.declareExchange(name), signal);
    }
    this.known.add(name);
  }

  /** The message for `message`: exchange and routing key rendered, properties, headers and body. */
  private prepare(message: RelayMessage): Outgoing {
    const { event } = message;
    const seq = event.seq;
    const kindBytes = Buffer.byteLength(event.kind);
    const structured = this.format.format === 'cloudevents';
    const binary = this.format.format === 'cloudevents-binary';
    return {
      seq,
      id: message.id,
      exchange: shortString(this.exchange.render(message), 'exchange', seq),
      routingKey: shortString(this.routingKey.render(message), 'routingKey', seq),
      content: Buffer.from(structured ? this.format.structured(message, this.origin) : event.payloadText),
      options: {
        messageId: message.id,
        persistent: true,
        mandatory: true,
        contentType: structured ? CE_STRUCTURED_CONTENT_TYPE : 'application/json',
        // `type` is a short string; a longer kind is in the tidemark-kind header alone.
        type: kindBytes <= SHORTSTR_MAX_BYTES ? event.kind : undefined,
        timestamp: Math.floor(event.occurredAt.getTime() / 1000),
        appId: 'tidemark',
        headers: headerTable(message, binary ? this.format.attributes(message, this.origin).filter(([name]) => name !== 'datacontenttype') : []),
      },
    };
  }
}
