/**
 * The NATS JetStream sink: each event becomes one JetStream message on the
 * subject its template renders (`{schema}.{stream}.{kind}` by default),
 * its payload's JSON text as the body and its fields in `Tidemark-*`
 * headers, published pipelined and acknowledged by JetStream.
 *
 * Delivery guarantee. Each message carries `Nats-Msg-Id: <schema>:<seq>`,
 * and JetStream drops a message whose id it stored within the stream's
 * `duplicate_window`. The relay publishes an event again, after a failure
 * or a crash, within `SinkTarget.republishWithinMs`, and `open` refuses a
 * stream whose window is not longer than that: so each event is stored in
 * the stream exactly once, across broker outages and relay crashes.
 * Order: JetStream stores a connection's messages in the order it receives
 * them, and the relay sends one stream's events in seq order on one
 * connection, each batch only after the previous one was acknowledged; a
 * republished batch starts at the first unacknowledged event, so each
 * tidemark stream's events are stored in seq order. (The one exception would
 * be JetStream refusing one message with a transient error and storing the
 * next: the refused event is then stored after it when republished.)
 *
 * @example
 * ```ts
 * const sink = new NatsSink({ url: 'nats://127.0.0.1:4222', createStream: true });
 * const relay = new Relay(pool, sink, { consumer: 'relay', streams: ['orders'] });
 * ```
 */
import type { NatsConnection } from '@nats-io/transport-node';
import { loadNats, nats } from './client.js';
import { ClosedError, InvalidOptionsError, SinkError } from '../../../errors.js';
import { checkKnownOptions, echoValue, integerOption } from '../../../options.js';
import type { RelayMessage, Sink, SinkTarget } from '../../sink.js';
import { compileTemplate, type Template } from '../../template.js';
import { natsMessage, type NatsLayout, type NatsMessage as Outgoing } from './message.js';
import { messageFormat, type FormatOptions } from '../../format.js';
import { AckInbox, type AckFailure } from './acks.js';
import { firstLine, noJetStream, openStream } from './stream.js';
import { checkSubjectTemplate, minimalFilters, subjectFilter } from './subject.js';
import { parseNatsUrl, type NatsServers } from './url.js';

/** Options of {@link NatsSink}. */
export interface NatsSinkOptions extends FormatOptions {
  /**
   * The server: `nats://host:port`, or `tls://host:port` for TLS, with
   * `user:password@` (or a `token@`) when the server requires it; several
   * servers of one cluster separated by commas. Required.
   */
  url: string;
  /** The JetStream stream the subjects belong to. Default `'TIDEMARK'`. */
  stream?: string;
  /**
   * The subject template (fields `{schema}`, `{stream}`, `{kind}`, `{key}`,
   * `{seq}`). A field's characters that a subject token cannot hold
   * (whitespace, `*`, `>`) become `_`, and so does an empty token; dots are
   * kept. Default `'{schema}.{stream}.{kind}'`.
   */
  subject?: string;
  /**
   * Create the stream when it does not exist: file storage, the relay's
   * subject filters, a duplicate window of max(2 minutes, 2 × the relay's
   * republish bound); and when it exists but does not take a subject of the
   * relay's streams (a stream relayed since it was created), add the
   * relay's filter to its subjects. Default false.
   */
  createStream?: boolean;
  /** How long to wait for JetStream's acknowledgement of a message. Default 10000. */
  ackTimeoutMs?: number;
  /** How long connecting to the server may take. Default 5000. */
  connectTimeoutMs?: number;
}

/** The defaults of {@link NatsSinkOptions}. */
export const NATS_SINK_DEFAULTS = Object.freeze({
  stream: 'TIDEMARK',
  subject: '{schema}.{stream}.{kind}',
  createStream: false,
  ackTimeoutMs: 10_000,
  connectTimeoutMs: 5_000,
});

const noop = () => undefined;
/** JetStream's "message size exceeds maximum allowed" (the stream's max_msg_size). */
const MESSAGE_TOO_LARGE = 10054;
/** JetStream's "expected stream does not match" (`Nats-Expected-Stream`). */
const OTHER_STREAM = 10060;

/** A connection and its JetStream client. */
interface Link {
  nc: NatsConnection;
  /** Where JetStream's acknowledgements of this connection's publishes arrive. */
  acks: AckInbox;
  /** Set while the client is reconnecting; resolved once it reconnected. */
  down: { promise: Promise<void>; resolve: () => void } | undefined;
}

/**
 * A {@link Sink} publishing to a NATS JetStream stream. Options are checked
 * in the constructor; nothing connects before `open`.
 */
export class NatsSink implements Sink {
  readonly name = 'nats';
  readonly description: string;
  /** How long a publish waits for an acknowledgement: part of the relay's republish bound. */
  readonly ackTimeoutMs: number;
  private readonly stream: string;
  private readonly subject: Template;
  private readonly createStream: boolean;
  private readonly connectTimeoutMs: number;
  private readonly servers: NatsServers;
  private readonly format: ReturnType<typeof messageFormat>;
  /** How messages are laid out, once `open` told the origin id; undefined: tidemark's own. */
  private layout: NatsLayout | undefined;
  private link: Link | undefined;
  private connecting: Promise<Link> | undefined;
  /** The last server's max_payload, for a publish while the client reconnects. */
  private maxPayload = Number.POSITIVE_INFINITY;
  /** The stream's max_msg_size as `open` found it (-1: none). */
  private maxMsgSize = -1;
  private opened = false;
  private closed = false;
  private closing: Promise<void> | undefined;

  constructor(options: NatsSinkOptions) {
    if (typeof options !== 'object' || options === null) throw new InvalidOptionsError('options', 'expected an object');
    const resolved = { url: options.url, ...NATS_SINK_DEFAULTS, format: undefined, ceSource: undefined, ceType: undefined };
    checkKnownOptions(options, resolved, 'NatsSink');
    this.servers = parseNatsUrl(options.url, 'url');
    this.stream = streamName(options.stream ?? NATS_SINK_DEFAULTS.stream);
    this.subject = compileTemplate(options.subject ?? NATS_SINK_DEFAULTS.subject, 'subject');
    checkSubjectTemplate(this.subject, 'subject');
    const createStream = options.createStream ?? NATS_SINK_DEFAULTS.createStream;
    if (typeof createStream !== 'boolean') throw new InvalidOptionsError('createStream', `expected a boolean, got ${echoValue(createStream)}`);
    this.createStream = createStream;
    this.ackTimeoutMs = integerOption(options, 'ackTimeoutMs', NATS_SINK_DEFAULTS.ackTimeoutMs, 1, 3_600_000);
    this.connectTimeoutMs = integerOption(options, 'connectTimeoutMs', NATS_SINK_DEFAULTS.connectTimeoutMs, 1, 3_600_000);
    this.format = messageFormat(options, 'nats', true);
    const shown = this.format.format === 'tidemark' ? '' : ` as ${this.format.format}`;
    this.description = `${this.servers.display} stream ${this.stream} subject ${this.subject.text}${shown}`;
  }

  /**
   * Connects, then checks that JetStream is enabled, that the stream exists
   * (or creates it, with `createStream`), that its subjects cover every
   * subject the relay can publish, and that its duplicate window is longer
   * than `target.republishWithinMs`.
   */
  async open(target: SinkTarget, signal: AbortSignal): Promise<void> {
    if (this.closed) throw new ClosedError('NatsSink');
    signal.throwIfAborted();
    const filters = minimalFilters(target.streams.map((s) => subjectFilter(this.subject, target.schema, s)));
    try {
      const { nc } = await abortable(this.connection(), signal);
      const jsm = await abortable(nats().jetstream.jetstreamManager(nc, { timeout: this.ackTimeoutMs }), signal);
      const plan = { stream: this.stream, filters, republishWithinMs: target.republishWithinMs, create: this.createStream, hosts: this.servers.hosts };
      const info = await abortable(openStream(jsm, plan), signal);
      this.maxMsgSize = info.config.max_msg_size ?? -1;
      this.layout = this.format.format === 'tidemark' ? undefined : { format: this.format, origin: target.origin };
      this.opened = true;
    } catch (err) {
      if (signal.aborted && err === signal.reason) throw err;
      throw this.openError(err);
    }
  }

  /**
   * Sends every message before awaiting any acknowledgement, in order on
   * one connection, and resolves once JetStream acknowledged each (a
   * duplicate's acknowledgement included). Rejects with the first failure
   * in seq order. A message over the server's `max_payload` (or the
   * stream's `max_msg_size`) fails the batch before anything is sent.
   */
  async publish(messages: readonly RelayMessage[], signal: AbortSignal): Promise<void> {
    if (this.closed) throw new ClosedError('NatsSink');
    if (!this.opened) throw new SinkError(this.name, 'publish was called before open', { retryable: false });
    signal.throwIfAborted();
    if (messages.length === 0) return;
    const outgoing = messages.map((m) => natsMessage(m, this.stream, this.subject, this.layout));
    const link = await abortable(this.connection(), signal);
    // Sent while the client reconnects, messages would be dropped at the reconnection: wait for it.
    if (link.down) await abortable(this.reconnected(link.down.promise), signal);
    this.checkSizes(link.nc, outgoing);
    // All messages are written before the first await: one pipelined run, in seq order.
    const sent: { token: string; acked: Promise<void> }[] = [];
    try {
      for (const o of outgoing) sent.push(link.acks.send(o.subject, o.body, o.headers));
    } catch (err) {
      link.acks.expire(sent.map((x) => x.token), { kind: 'closed' });
      for (const x of sent) x.acked.catch(noop);
      throw this.sendError(err, outgoing[sent.length]!);
    }
    for (const x of sent) x.acked.catch(noop); // awaited below in order; a later failure after an earlier one is not unhandled
    const timer = setTimeout(() => link.acks.expire(sent.map((x) => x.token), { kind: 'timeout' }), this.ackTimeoutMs);
    try {
      await abortable(this.awaitAcks(sent.map((x) => x.acked), outgoing), signal);
    } finally {
      clearTimeout(timer);
      link.acks.expire(sent.map((x) => x.token), { kind: 'closed' }); // those still open after a failure or an abort
    }
  }

  /** Closes the connection; idempotent. Every publish the relay waits for has settled by then, so nothing is drained. */
  close(): Promise<void> {
    this.closing ??= (async () => {
      this.closed = true;
      await this.connecting?.catch(noop);
      const link = this.link;
      this.link = undefined;
      await link?.nc.close().catch(noop);
    })();
    return this.closing;
  }

  /** The live connection, or a new one when there is none or it was closed for good. */
  private connection(): Promise<Link> {
    if (this.link && !this.link.nc.isClosed()) return Promise.resolve(this.link);
    this.connecting ??= this.dial().finally(() => (this.connecting = undefined));
    return this.connecting;
  }

  private async dial(): Promise<Link> {
    const stale = this.link;
    this.link = undefined;
    await stale?.nc.close().catch(noop);
    const { servers, tls, user, pass, token } = this.servers;
    const { transport } = await loadNats();
    const { errors } = transport;
    let nc: NatsConnection;
    try {
      nc = await transport.connect({
        servers,
        ...(tls ? { tls: {} } : {}),
        ...(user !== undefined ? { user, pass } : {}),
        ...(token !== undefined ? { token } : {}),
        name: 'tidemark relay',
        // An Error (with its stack) per request for async traces costs a fifth of the publish time.
        noAsyncTraces: true,
        timeout: this.connectTimeoutMs,
        // Never give up: a broker outage is waited out (publishes fail with
        // retryable errors meanwhile) rather than ending in a closed client.
        maxReconnectAttempts: -1,
        reconnectTimeWait: 500,
        // A dead peer that sends no RST is noticed within ~45 s, not 4 minutes.
        pingInterval: 15_000,
      });
    } catch (err) {
      const auth = err instanceof errors.AuthorizationError || err instanceof errors.UserAuthenticationExpiredError;
      throw new SinkError(
        this.name,
        auth
          ? `the NATS server at ${this.servers.hosts} refused the credentials (${firstLine(err)}); check the user and password in url`
          : `cannot connect to NATS at ${this.servers.hosts} (${firstLine(err)}); is nats-server running with -js?`,
        { retryable: !auth, cause: err },
      );
    }
    if (this.closed) {
      await nc.close().catch(noop);
      throw new ClosedError('NatsSink');
    }
    const link: Link = { nc, acks: new AckInbox(nc), down: undefined };
    void nc.closed().then(() => link.acks.failAll({ kind: 'closed' }));
    void (async () => {
      for await (const status of nc.status()) {
        if (status.type === 'disconnect') link.down ??= settable();
        if (status.type === 'reconnect') {
          link.down?.resolve();
          link.down = undefined;
        }
      }
    })().catch(noop);
    this.maxPayload = nc.info?.max_payload ?? this.maxPayload;
    this.link = link;
    return link;
  }

  /** Resolves once the client reconnected; a retryable SinkError when it has not within ackTimeoutMs. */
  private async reconnected(up: Promise<void>): Promise<void> {
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<never>((_, reject) => {
      timer = setTimeout(
        () => reject(new SinkError(this.name, `NATS at ${this.servers.hosts} is unreachable; the client did not reconnect within ${this.ackTimeoutMs} ms`, { retryable: true })),
        this.ackTimeoutMs,
      );
    });
    try {
      await Promise.race([up, late]);
    } finally {
      clearTimeout(timer);
    }
  }

  private checkSizes(nc: NatsConnection, outgoing: Outgoing[]): void {
    this.maxPayload = nc.info?.max_payload ?? this.maxPayload;
    for (const o of outgoing) {
      const [limit, what] =
        this.maxMsgSize >= 0 && this.maxMsgSize < this.maxPayload
          ? [this.maxMsgSize, `the max_msg_size of stream ${this.stream}`]
          : [this.maxPayload, `the server's max_payload`];
      if (o.bytes > limit) {
        throw new SinkError(this.name, `the event seq ${o.seq} is ${o.bytes} bytes as a NATS message (headers and body), over ${what} of ${limit} bytes; raise the limit or keep events smaller`, {
          retryable: false,
          seq: o.seq,
        });
      }
    }
  }

  private async awaitAcks(acks: Promise<void>[], outgoing: Outgoing[]): Promise<void> {
    for (let i = 0; i < acks.length; i += 1) {
      try {
        await acks[i];
      } catch (failure) {
        throw this.ackError(failure as AckFailure, outgoing[i]!);
      }
    }
  }

  private ackError(failure: AckFailure, o: Outgoing): SinkError {
    const at = `publishing the event seq ${o.seq} to ${o.subject}`;
    switch (failure.kind) {
      case 'api':
        if (failure.errCode === MESSAGE_TOO_LARGE) {
          return new SinkError(this.name, `${at}: over the max_msg_size of stream ${this.stream} (${o.bytes} bytes)`, { retryable: false, seq: o.seq });
        }
        if (failure.errCode === OTHER_STREAM) {
          return new SinkError(this.name, `${at}: the subject belongs to another stream than ${this.stream}`, { retryable: false });
        }
        // JetStream's 5xx (no storage now, no quorum) pass; its 4xx are configuration.
        return new SinkError(this.name, `${at}: JetStream refused it (${failure.description}, error ${failure.errCode})`, { retryable: failure.status >= 500 });
      case 'timeout':
        return new SinkError(this.name, `${at}: no acknowledgement within ${this.ackTimeoutMs} ms`, { retryable: true });
      case 'no-responders':
        return new SinkError(this.name, `${at}: no JetStream stream answered (the server is restarting, or the stream was deleted)`, { retryable: true });
      default:
        return new SinkError(this.name, `${at}: the connection closed before JetStream acknowledged it`, { retryable: true });
    }
  }

  /** A message the client would not send. */
  private sendError(err: unknown, o: Outgoing): SinkError {
    const at = `publishing the event seq ${o.seq} to ${o.subject}`;
    const { errors } = nats().transport;
    if (err instanceof errors.InvalidArgumentError || err instanceof errors.InvalidSubjectError) {
      return new SinkError(this.name, `${at}: the client refused it (${firstLine(err)})`, { retryable: false, seq: o.seq, cause: err });
    }
    return new SinkError(this.name, `${at}: ${firstLine(err)}`, { retryable: true, cause: err }); // a closed connection
  }

  private openError(err: unknown): unknown {
    if (err instanceof SinkError || err instanceof ClosedError) return err;
    if (noJetStream(err)) {
      return new SinkError(this.name, `JetStream is not enabled on the NATS server at ${this.servers.hosts} (or for this account); start nats-server with -js`, {
        retryable: false,
        cause: err,
      });
    }
    if (err instanceof nats().jetstream.JetStreamApiError) {
      return new SinkError(this.name, `JetStream refused the check of stream ${this.stream}: ${firstLine(err)} (error ${err.code})`, { retryable: err.status >= 500, cause: err });
    }
    return new SinkError(this.name, `checking stream ${this.stream} on ${this.servers.hosts}: ${firstLine(err)}`, { retryable: true, cause: err });
  }
}

/** A JetStream stream name: no whitespace, `.`, `*`, `>`, path separators or control characters. */
function streamName(value: unknown): string {
  if (typeof value !== 'string' || value.length === 0 || value.length > 255 || /[\s\p{Cc}.*>/\\]/u.test(value)) {
    throw new InvalidOptionsError('stream', `expected a JetStream stream name (no whitespace, ".", "*", ">", "/" or "\\"), got ${echoValue(value)}`);
  }
  return value;
}

function settable(): { promise: Promise<void>; resolve: () => void } {
  let resolve: () => void = noop;
  const promise = new Promise<void>((r) => (resolve = r));
  return { promise, resolve };
}

/** `promise`, or `signal.reason` as soon as the signal aborts; the promise's own failure is then handled. */
function abortable<T>(promise: Promise<T>, signal: AbortSignal): Promise<T> {
  promise.catch(noop);
  if (signal.aborted) return Promise.reject(signal.reason);
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => reject(signal.reason);
    signal.addEventListener('abort', onAbort, { once: true });
    promise.then(resolve, reject).finally(() => signal.removeEventListener('abort', onAbort));
  });
}
