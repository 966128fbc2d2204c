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
import { Duplex } from 'node:stream';
import { connect, IllegalOperationError, type Channel, type ChannelModel, type ConfirmChannel, type Message, type Options } from 'amqplib';
import { ClosedError, InvalidOptionsError, SinkError } from '../../errors.js';
import { checkKnownOptions, echoValue, integerOption, redactUrl } from '../../options.js';
import { stringHeaders, type RelayMessage, type Sink, type SinkTarget } from '../sink.js';
import { compileTemplate, type Template } from '../template.js';
import { streamEvent } from '../../consumer/exact-json.js';

/** Options for {@link RabbitMqSink}. Every duration is in milliseconds. */
export interface RabbitMqSinkOptions {
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

const NAME = 'rabbitmq';
const DEFAULTS = { exchange: 'tidemark', routingKey: '{stream}.{kind}', createExchange: false, ackTimeoutMs: 10_000, connectTimeoutMs: 5_000 };

/** AMQP 0-9-1 reply codes the sink reacts to, as RabbitMQ sends them in `channel.close` and `connection.close`. The one table. */
const REPLY = { accessRefused: 403, notFound: 404, preconditionFailed: 406, notAllowed: 530 } as const;
/** `basic.publish`'s class and method ids: a channel error naming them was caused by a published message. */
const BASIC_PUBLISH = { classId: 60, methodId: 40 } as const;
/** An AMQP short string (exchange, routing key, message property) holds at most 255 bytes. */
const SHORTSTR_MAX_BYTES = 255;
/** amqplib encodes a message's header table into a 64 KiB buffer, the table's 4-byte length included. */
const HEADER_TABLE_MAX_BYTES = 65_536 - 4;
/** Own headers not copied under their own names: RabbitMQ routes by `CC` and `BCC` (sender-selected distribution). */
const NOT_COPIED: ReadonlySet<string> = new Set(['CC', 'BCC']);

/**
 * amqplib reports a broker that refused the connection during the handshake
 * with a plain `Error` whose fixed text (lib/connection.js) is its only
 * mark: the login (`connection.start-ok`, reply code in the text) or the
 * vhost (`connection.open`, answered with a bare `connection.close`).
 */
const LOGIN_REFUSED = /^Handshake terminated by server: (\d+) /;
const VHOST_REFUSED = /^Expected ConnectionOpenOk; got <ConnectionClose /;
/** RabbitMQ's `406 PRECONDITION_FAILED` for a message over `max_message_size` states the limit; used only to point at the seq. */
const MAX_SIZE_TEXT = /max size (\d+)/;

/** Where to connect, parsed once from `url`. */
interface Broker {
  connect: Options.Connect;
  /** `host:port`, for messages. */
  address: string;
  user: string;
  vhost: string;
  /** The URL without its password. */
  shown: string;
}

/** One message ready to publish. */
interface Outgoing {
  seq: bigint;
  id: string;
  exchange: string;
  routingKey: string;
  content: Buffer;
  options: Options.Publish;
}

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
    };
    checkKnownOptions(options, resolved, 'RabbitMqSink');
    this.broker = broker;
    this.exchange = exchange;
    this.routingKey = routingKey;
    this.createExchange = createExchange;
    this.ackTimeoutMs = resolved.ackTimeoutMs;
    this.connectTimeoutMs = resolved.connectTimeoutMs;
    this.description = `${broker.shown} exchange ${exchange.text} routing key ${routingKey.text}`;
  }

  /**
   * Connects and checks each exchange the template names without per-event
   * fields (one per stream of `target`); a template naming `kind`, `key` or
   * `seq` is checked at the first use of each name instead.
   */
  async open(target: SinkTarget, signal: AbortSignal): Promise<void> {
    if (this.closed) throw new ClosedError('RabbitMqSink');
    signal.throwIfAborted();
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
    return {
      seq,
      id: message.id,
      exchange: shortString(this.exchange.render(message), 'exchange', seq),
      routingKey: shortString(this.routingKey.render(message), 'routingKey', seq),
      content: Buffer.from(event.payloadText),
      options: {
        messageId: message.id,
        persistent: true,
        mandatory: true,
        contentType: 'application/json',
        // `type` is a short string; a longer kind is in the tidemark-kind header alone.
        type: kindBytes <= SHORTSTR_MAX_BYTES ? event.kind : undefined,
        timestamp: Math.floor(event.occurredAt.getTime() / 1000),
        appId: 'tidemark',
        headers: headerTable(message),
      },
    };
  }
}

/**
 * The `tidemark-*` headers, then each own header whose value is a string
 * under its own name while the table stays within amqplib's limit (all of
 * them are in `tidemark-headers`, as JSON, whatever their type).
 */
function headerTable(message: RelayMessage): Record<string, string> {
  const { event } = message;
  const table: Record<string, string> = Object.create(null) as Record<string, string>;
  table['tidemark-seq'] = event.seq.toString();
  table['tidemark-stream'] = event.stream;
  table['tidemark-kind'] = event.kind;
  table['tidemark-key'] = event.key;
  table['tidemark-occurred-at'] = event.occurredAt.toISOString();
  table['tidemark-headers'] = event.headersText;
  let size = 0;
  for (const [name, value] of Object.entries(table)) size += entryBytes(name, value);
  if (size > HEADER_TABLE_MAX_BYTES) {
    throw new SinkError(NAME, `seq ${event.seq}: its headers take ${size} bytes as an AMQP header table, over amqplib's ${HEADER_TABLE_MAX_BYTES}`, {
      retryable: false,
      seq: event.seq,
    });
  }
  for (const [name, value] of stringHeaders(event.headersText)) {
    if (typeof value !== 'string' || name === '' || name.startsWith('tidemark-') || NOT_COPIED.has(name)) continue;
    if (Buffer.byteLength(name) > SHORTSTR_MAX_BYTES || size + entryBytes(name, value) > HEADER_TABLE_MAX_BYTES) continue;
    table[name] = value;
    size += entryBytes(name, value);
  }
  return table;
}

/** A string entry of an AMQP field table: name length, name, type tag, value length, value. */
function entryBytes(name: string, value: string): number {
  return 1 + Buffer.byteLength(name) + 1 + 4 + Buffer.byteLength(value);
}

/** `value` when it fits an AMQP short string; a rendered name that does not stops the relay. */
function shortString(value: string, option: 'exchange' | 'routingKey', seq?: bigint): string {
  const bytes = Buffer.byteLength(value);
  if (bytes === 0 || bytes > SHORTSTR_MAX_BYTES) {
    const what = `${seq === undefined ? '' : `seq ${seq}: `}the ${option} template renders ${bytes} bytes`;
    throw new SinkError(NAME, `${what}; AMQP takes 1 to ${SHORTSTR_MAX_BYTES}: change ${option}`, { retryable: false, seq });
  }
  return value;
}

/** A message carrying only what a `{schema}`/`{stream}` template reads. */
function probe(schema: string, stream: string): RelayMessage {
  return { id: '', schema, event: streamEvent({ seq: 0n, stream, kind: '', key: '', payloadText: '{}', headersText: '{}', occurredAt: new Date(0) }) };
}

/** Parses and checks the `url` option. */
function parseUrl(value: unknown): Broker {
  const bad = (why: string) =>
    new InvalidOptionsError('url', `${why}; expected amqp://USER:PASS@HOST:PORT/VHOST or amqps://..., got ${echoValue(typeof value === 'string' ? redactUrl(value) : value)}`);
  if (typeof value !== 'string') throw bad('not a string');
  let url: URL;
  try {
    url = new URL(value);
  } catch {
    throw bad('not a URL');
  }
  if (url.protocol !== 'amqp:' && url.protocol !== 'amqps:') throw bad(`the scheme ${url.protocol} is not amqp: or amqps:`);
  const hostname = url.hostname.replace(/^\[|\]$/g, '');
  if (!hostname) throw bad('no host');
  const port = url.port ? Number(url.port) : url.protocol === 'amqp:' ? 5672 : 5671;
  const segment = url.pathname.replace(/^\//, '');
  if (segment.includes('/')) throw bad('the vhost holds a "/" (write it %2F)');
  let vhost: string, user: string, password: string;
  try {
    vhost = segment === '' ? '/' : decodeURIComponent(segment);
    user = decodeURIComponent(url.username);
    password = decodeURIComponent(url.password);
  } catch {
    throw bad('a malformed %-escape');
  }
  const params: Record<string, number> = {};
  for (const [name, text] of url.searchParams) {
    if (name !== 'heartbeat' && name !== 'frameMax') throw bad(`unknown query parameter ${JSON.stringify(name)} (known: heartbeat, frameMax)`);
    const n = Number(text);
    const [min, max] = name === 'heartbeat' ? [0, 65_535] : [4096, 0xffff_ffff];
    if (!/^\d+$/.test(text) || n < min || n > max) throw bad(`${name} must be an integer from ${min} to ${max}`);
    params[name] = n;
  }
  const shown = new URL(url.href);
  shown.password = '';
  // No user in the URL: amqplib's default login, guest/guest.
  const login = url.username || url.password ? { username: user, password } : {};
  return {
    // amqplib percent-decodes `vhost` itself, so it gets the segment as written.
    connect: { protocol: url.protocol.slice(0, -1), hostname, port, vhost: segment, ...login, ...params },
    address: `${url.hostname}:${port}`,
    user: url.username || url.password ? user : 'guest',
    vhost,
    shown: shown.href,
  };
}

/** Connects within `timeoutMs`; a connection that comes up later is destroyed. */
function connectBroker(broker: Broker, timeoutMs: number): Promise<ChannelModel> {
  return new Promise((resolve, reject) => {
    let late = false;
    const timer = setTimeout(() => {
      late = true;
      reject(new SinkError(NAME, `cannot connect to ${broker.address}: no answer within ${timeoutMs} ms (connectTimeoutMs)`, { retryable: true }));
    }, timeoutMs);
    connect(broker.connect, { timeout: timeoutMs, noDelay: true, clientProperties: { connection_name: 'tidemark relay' } }).then(
      (model) => {
        // The Session's listeners read every error; this one keeps an error
        // between here and there from being thrown as unhandled.
        model.on('error', () => undefined);
        clearTimeout(timer);
        if (late) destroySocket(model);
        else resolve(model);
      },
      (err: unknown) => {
        clearTimeout(timer);
        if (!late) reject(connectError(broker, err));
      },
    );
  });
}

/** A failed connection attempt as a `SinkError`: a refused login or vhost is not retryable, anything else is. */
function connectError(broker: Broker, err: unknown): SinkError {
  const text = err instanceof Error ? err.message : '';
  const login = LOGIN_REFUSED.exec(text);
  if (login && Number(login[1]) === REPLY.accessRefused) {
    return new SinkError(NAME, `${broker.address} refused the login of user ${JSON.stringify(broker.user)} (403 ACCESS_REFUSED): check the user and password in url`, {
      retryable: false,
      cause: err,
    });
  }
  if (VHOST_REFUSED.test(text) || (login && Number(login[1]) === REPLY.notAllowed)) {
    return new SinkError(
      NAME,
      `${broker.address} refused user ${JSON.stringify(broker.user)} the vhost ${JSON.stringify(broker.vhost)}: check that the vhost exists and the user has permissions on it`,
      { retryable: false, cause: err },
    );
  }
  return new SinkError(NAME, `cannot connect to ${broker.address}: ${reason(err)}`, { retryable: true, cause: err });
}

/** Hooks a session calls back into its sink. */
interface SessionHooks {
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
class Session {
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
          const closing = err instanceof IllegalOperationError;
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

/** Whether the AMQP error names `method` as its cause. */
function isFrom(err: unknown, method: { classId: number; methodId: number }): boolean {
  const e = err as { classId?: unknown; methodId?: unknown };
  return e.classId === method.classId && e.methodId === method.methodId;
}

/** The AMQP reply code of an amqplib channel or connection error. */
function replyCode(err: unknown): number | undefined {
  const code = typeof err === 'object' && err !== null ? (err as { code?: unknown }).code : undefined;
  return typeof code === 'number' ? code : undefined;
}

/** A short reason: a socket error's code, else the first line of the message. */
function reason(err: unknown): string {
  if (err instanceof AggregateError && err.errors.length > 0) return reason(err.errors[0]);
  const code = typeof err === 'object' && err !== null ? (err as { code?: unknown }).code : undefined;
  if (typeof code === 'string') return code;
  const text = err instanceof Error ? err.message : String(err);
  return text.split('\n')[0]!.slice(0, 300);
}

/** Destroys the connection's socket: amqplib's only way out of a connection whose broker stopped answering. */
function destroySocket(model: ChannelModel): void {
  // amqplib keeps the socket as `connection.stream` (lib/connection.js) and
  // offers no abort. Destroying it with an error runs amqplib's own teardown:
  // 'error' and 'close' on the connection, 'close' on each channel.
  const stream: unknown = (model.connection as { stream?: unknown }).stream;
  if (stream instanceof Duplex && !stream.destroyed) stream.destroy(new Error('tidemark dropped the connection'));
}

/** `promise`, or `signal.reason` once it aborts. */
function abortable<T>(promise: Promise<T>, signal: AbortSignal): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => reject(signal.reason);
    if (signal.aborted) onAbort();
    else signal.addEventListener('abort', onAbort, { once: true });
    promise.then(
      (value) => {
        signal.removeEventListener('abort', onAbort);
        resolve(value);
      },
      (err: unknown) => {
        signal.removeEventListener('abort', onAbort);
        reject(err);
      },
    );
  });
}

/** `promise`, or a retryable `SinkError` with `message()` after `ms`. */
function bounded<T>(promise: Promise<T>, ms: number, message: () => string): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    const timer = setTimeout(() => reject(new SinkError(NAME, message(), { retryable: true })), ms);
    promise.then(
      (value) => {
        clearTimeout(timer);
        resolve(value);
      },
      (err: unknown) => {
        clearTimeout(timer);
        reject(err);
      },
    );
  });
}
