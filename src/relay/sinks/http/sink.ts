/**
 * The HTTP webhook sink: each relayed event is POSTed to one URL with
 * Standard Webhooks headers (`webhook-id`, `webhook-timestamp`,
 * `webhook-signature`; see sign.ts) and tidemark's own (see message.ts).
 *
 * Delivery is at least once. An event counts as delivered once the
 * receiver answered 2xx. 408, 429, 5xx, timeouts and network errors are
 * transient: the sink sends that request again itself, after a back-off
 * (`retryMinMs` doubling to `retryMaxMs`, with jitter) or the receiver's
 * `Retry-After` when that is longer, until it succeeds or the relay stops;
 * each try again is told to the relay (`SinkTarget.onRetry`), which reports
 * it as a `retry` event with `seq`. The page is kept meanwhile: the events
 * the receiver took stay taken, so a receiver that fails one request in
 * five still lets the relay advance. Any other answer (3xx, 4xx) is the
 * event's own refusal: a `SinkError` that is not retryable, with `seq`, the
 * status and the start of the answer; the relay stops on it, or sets the
 * event aside as a dead letter (`onRefused: 'dead-letter'`).
 *
 * A request the receiver may have processed (a timeout, a connection lost
 * after sending) is sent again with the same `webhook-id`, as is every
 * event of a page the relay publishes again after a crash: receivers
 * deduplicate by `webhook-id`, `<origin>:<seq>`, which names the event
 * across databases and schemas and never changes.
 *
 * Order: events of one key are sent one after another, each only once the
 * previous one was answered 2xx; up to `concurrency` keys are in flight at
 * once. Events of different keys may arrive in any order.
 */
import { Buffer } from 'node:buffer';
import { setMaxListeners } from 'node:events';
import { backoffMs } from '../../../backoff.js';
import { sleep } from '../../../db/acquire.js';
import { ClosedError, InvalidOptionsError, SinkError } from '../../../errors.js';
import { checkKnownOptions, echoValue, integerOption } from '../../../options.js';
import { messageFormat, type FormatOptions, type MessageFormat } from '../../format.js';
import type { RelayMessage, Sink, SinkTarget } from '../../sink.js';
import { batch, single, type Outgoing } from './message.js';
import { closeEndpoint, endpoint, InFlight, post, type Answer, type Endpoint } from './request.js';
import { signature, signingKey } from './sign.js';

const NAME = 'http';
const HOUR = 3_600_000;

/** Options for {@link HttpSink}. Every duration is in milliseconds. */
export interface HttpSinkOptions extends FormatOptions {
  /** The receiver: an `http://` or `https://` URL (certificates verified). Required. */
  url: string;
  /**
   * The signing secret: `whsec_<base64>` (Standard Webhooks: the key is the
   * decoded bytes) or any other string (its UTF-8 bytes are the key), at
   * least 16 bytes of key. Without it requests are unsigned, and
   * `description` says so.
   */
  secret?: string;
  /** Keys in flight at once (one request each). Default 16. */
  concurrency?: number;
  /**
   * Events of one key sent in one request, as a JSON array (see
   * message.ts), when they follow each other in a page. Default 1: one
   * event per request, the payload as the body. Not with `cloudevents-binary`.
   * A batch's `webhook-id` names the batch; after a failure the same events
   * may go in other batches, so receivers deduplicate by each element's id.
   */
  batchSize?: number;
  /** How long one request may take, from sending to the end of the answer, before it counts as failed (and is sent again). Default 10000. */
  ackTimeoutMs?: number;
  /** How long getting a connection may take before the try fails (and is sent again). Default 5000. */
  connectTimeoutMs?: number;
  /** First pause before sending a failed request again; it doubles with each failure, with jitter. Default 100. */
  retryMinMs?: number;
  /** Cap of that pause (a longer `Retry-After` is honoured, up to an hour). Default 10000. */
  retryMaxMs?: number;
}

/** One key's events of a publish: sent in order, one request at a time. */
interface Lane {
  messages: RelayMessage[];
  /** The first not yet sent. */
  next: number;
  /** A request of it is in flight. */
  busy: boolean;
}

/** The defaults of {@link HttpSinkOptions}. */
export const HTTP_SINK_DEFAULTS = { concurrency: 16, batchSize: 1, ackTimeoutMs: 10_000, connectTimeoutMs: 5_000, retryMinMs: 100, retryMaxMs: 10_000 } as const;

/**
 * POSTs relayed events to a webhook receiver. See the module comment for
 * the guarantee (at least once: receivers deduplicate by `webhook-id`).
 *
 * @example
 * const sink = new HttpSink({ url: 'https://hooks.example.com/tidemark', secret: process.env.TIDEMARK_WEBHOOK_SECRET });
 * const relay = new Relay(pool, sink, { consumer: 'webhook', streams: ['orders'], onRefused: 'dead-letter' });
 */
export class HttpSink implements Sink {
  readonly name = NAME;
  readonly description: string;
  readonly ackTimeoutMs: number;
  private readonly concurrency: number;
  private readonly batchSize: number;
  private readonly retryMinMs: number;
  private readonly retryMaxMs: number;
  private readonly key: Buffer | undefined;
  private readonly format: MessageFormat;
  private readonly endpoint: Endpoint;
  private target: SinkTarget | undefined;
  private closed = false;

  /** Checks `options` (throws `InvalidOptionsError` naming the option); connects to nothing. */
  constructor(options: HttpSinkOptions) {
    if (typeof options !== 'object' || options === null) throw new InvalidOptionsError('options', 'expected an object');
    const url = parseUrl(options.url);
    const resolved = {
      url: options.url,
      secret: options.secret,
      concurrency: integerOption(options, 'concurrency', HTTP_SINK_DEFAULTS.concurrency, 1, 1024),
      batchSize: integerOption(options, 'batchSize', HTTP_SINK_DEFAULTS.batchSize, 1, 10_000),
      ackTimeoutMs: integerOption(options, 'ackTimeoutMs', HTTP_SINK_DEFAULTS.ackTimeoutMs, 1, HOUR),
      connectTimeoutMs: integerOption(options, 'connectTimeoutMs', HTTP_SINK_DEFAULTS.connectTimeoutMs, 1, 600_000),
      retryMinMs: integerOption(options, 'retryMinMs', HTTP_SINK_DEFAULTS.retryMinMs, 1, HOUR),
      retryMaxMs: integerOption(options, 'retryMaxMs', HTTP_SINK_DEFAULTS.retryMaxMs, 1, HOUR),
      format: undefined,
      ceSource: undefined,
      ceType: undefined,
    };
    checkKnownOptions(options, resolved, 'HttpSink');
    if (resolved.retryMaxMs < resolved.retryMinMs) throw new InvalidOptionsError('retryMaxMs', `must be at least retryMinMs (${resolved.retryMinMs}), got ${resolved.retryMaxMs}`);
    this.key = options.secret === undefined ? undefined : signingKey(options.secret);
    this.format = messageFormat(options, NAME, true);
    if (this.format.format === 'cloudevents-binary' && resolved.batchSize > 1) {
      throw new InvalidOptionsError('batchSize', 'cloudevents-binary carries one event per request: use cloudevents (a batch is then an array of envelopes) or batchSize 1');
    }
    this.concurrency = resolved.concurrency;
    this.batchSize = resolved.batchSize;
    this.ackTimeoutMs = resolved.ackTimeoutMs;
    this.retryMinMs = resolved.retryMinMs;
    this.retryMaxMs = resolved.retryMaxMs;
    this.endpoint = endpoint(url.url, url.shown, this.concurrency, resolved.connectTimeoutMs);
    const shown = this.format.format === 'tidemark' ? '' : ` as ${this.format.format}`;
    const batched = this.batchSize > 1 ? `, up to ${this.batchSize} events a request` : '';
    this.description = `POST ${url.shown}${shown}${batched}, ${this.key ? 'signed' : 'UNSIGNED (no secret: receivers cannot tell these requests from forged ones)'}`;
  }

  /** Takes the origin id (for `webhook-id`) and the retry hook; sends nothing (a receiver answers only to events). */
  async open(target: SinkTarget, signal: AbortSignal): Promise<void> {
    if (this.closed) throw new ClosedError('HttpSink');
    signal.throwIfAborted();
    this.target = target;
  }

  /**
   * Sends `messages` (in seq order, one stream's) and resolves once every
   * one was answered 2xx: one key's events one after another, up to
   * `concurrency` keys at once, transient failures sent again. Rejects with
   * the first refusal (the other keys' requests in flight are abandoned) or
   * the abort reason.
   */
  async publish(messages: readonly RelayMessage[], signal: AbortSignal): Promise<void> {
    if (this.closed) throw new ClosedError('HttpSink');
    if (!this.target) throw new SinkError(NAME, 'publish was called before open', { retryable: false });
    signal.throwIfAborted();
    if (messages.length === 0) return;
    const byKey = new Map<string, Lane>();
    for (const message of messages) {
      const lane = byKey.get(message.event.key);
      if (lane) lane.messages.push(message);
      else byKey.set(message.event.key, { messages: [message], next: 0, busy: false });
    }
    const lanes = [...byKey.values()];
    const stop = new AbortController();
    // Each back-off in flight listens to it: up to `concurrency` at once.
    setMaxListeners(0, stop.signal);
    const inFlight = new InFlight();
    stop.signal.addEventListener('abort', () => inFlight.cancel(stop.signal.reason), { once: true });
    const forward = () => stop.abort(signal.reason);
    signal.addEventListener('abort', forward, { once: true });
    let failure: { error: unknown } | undefined;
    try {
      await new Promise<void>((resolve) => {
        let running = 0;
        // A free slot goes to the idle key with the most events left: the
        // longest chain of requests starts first, so the page's last
        // requests are not one key's, sent one by one while the other slots idle.
        const pump = () => {
          while (!failure && running < this.concurrency) {
            let best: Lane | undefined;
            for (const lane of lanes) {
              if (!lane.busy && lane.next < lane.messages.length && (!best || lane.messages.length - lane.next > best.messages.length - best.next)) best = lane;
            }
            if (!best) break;
            const lane = best;
            const run = lane.messages.slice(lane.next, lane.next + this.batchSize);
            lane.next += run.length;
            lane.busy = true;
            running += 1;
            this.deliver(this.prepare(run), stop.signal, inFlight).then(
              () => {
                lane.busy = false;
                running -= 1;
                pump();
              },
              (err: unknown) => {
                running -= 1;
                failure ??= { error: err };
                stop.abort(err);
                pump();
              },
            );
          }
          if (running === 0) resolve();
        };
        pump();
      });
    } finally {
      signal.removeEventListener('abort', forward);
    }
    if (signal.aborted) throw signal.reason;
    if (failure) throw failure.error;
  }

  /** Closes the keep-alive connections (a request still in flight fails, and is not sent again). Idempotent. */
  async close(): Promise<void> {
    this.closed = true;
    await closeEndpoint(this.endpoint);
  }

  private prepare(run: readonly RelayMessage[]): Outgoing {
    const origin = this.target!.origin;
    return this.batchSize === 1 ? single(run[0]!, this.format, origin) : batch(run, this.format, origin);
  }

  /** Sends `out` until the receiver answers 2xx (resolves), refuses it (rejects, not retryable), or `signal` aborts (rejects with its reason). */
  private async deliver(out: Outgoing, signal: AbortSignal, inFlight: InFlight): Promise<void> {
    for (let attempt = 1; ; attempt += 1) {
      const timestamp = Math.floor(Date.now() / 1000);
      // The request's own headers, set again for each try (undici reads them when the request is dispatched).
      const headers = out.headers;
      headers['webhook-id'] = out.id;
      headers['webhook-timestamp'] = String(timestamp);
      if (this.key) headers['webhook-signature'] = signature(this.key, out.id, timestamp, out.body);
      const answer = await post(this.endpoint, headers, out.body, this.ackTimeoutMs, inFlight);
      if (signal.aborted) throw signal.reason;
      if (this.closed) throw new ClosedError('HttpSink');
      if ('status' in answer && answer.status >= 200 && answer.status < 300) return;
      const error = this.failure(out, answer);
      if (!error.retryable) throw error;
      const waitMs = 'status' in answer && answer.retryAfterMs !== undefined ? Math.min(answer.retryAfterMs, HOUR) : 0;
      const delayMs = Math.max(backoffMs(attempt, this.retryMinMs, this.retryMaxMs), waitMs);
      this.target!.onRetry?.({ stream: out.stream, seq: out.seq, attempt, delayMs, error });
      await sleep(delayMs, signal);
    }
  }

  /** The `SinkError` of a try that was not a 2xx: retryable when transient. */
  private failure(out: Outgoing, answer: Answer): SinkError {
    const what = out.count === 1 ? `seq ${out.seq}` : `seq ${out.seq} and the ${out.count - 1} events after it`;
    if ('failure' in answer) {
      const { failure, error } = answer;
      // Not sendable: the event's own refusal.
      if (failure === 'unsendable') return new SinkError(NAME, `${what}: cannot be sent: ${error.message}`, { retryable: false, seq: out.seq, cause: error });
      return new SinkError(NAME, `${what}: ${this.endpoint.shown}: ${error.message}`, { retryable: true, seq: out.seq, cause: error });
    }
    const { status } = answer;
    const transient = status === 408 || status === 429 || status >= 500;
    // An answer about the endpoint, not the event: every event would get it, so it
    // names no seq and stops the relay under either onRefused policy.
    const endpointWide = (status >= 300 && status < 400) || ENDPOINT_STATUSES.has(status);
    const said = answer.snippet.replace(/\s+/g, ' ').trim();
    const text = said === '' ? '' : `: ${echoValue(said, 120)}`;
    const next =
      transient ? ''
      : status >= 300 && status < 400 ? ' (redirects are not followed: give the final URL)'
      : endpointWide ? ' (about the endpoint, not the event: check the URL, its method and credentials)'
      : ' (the receiver refuses the event itself)';
    return new SinkError(NAME, `${what}: ${this.endpoint.shown} answered ${status}${text}${next}`, { retryable: transient, ...(endpointWide ? {} : { seq: out.seq }) });
  }
}

/**
 * 4xx answers about the endpoint rather than the event (credentials, a
 * wrong path or method, the wrong server): refusals of every event alike.
 */
const ENDPOINT_STATUSES: ReadonlySet<number> = new Set([401, 403, 404, 405, 407, 421]);

/** `url` checked: http or https, no fragment; `shown` without credentials and query (which may hold a token). */
function parseUrl(value: unknown): { url: URL; shown: string } {
  if (typeof value !== 'string' || value.length === 0) throw new InvalidOptionsError('url', 'expected an http:// or https:// URL');
  let url: URL;
  try {
    url = new URL(value);
  } catch {
    throw new InvalidOptionsError('url', 'expected an http:// or https:// URL, got text that does not parse as a URL');
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') throw new InvalidOptionsError('url', `expected an http:// or https:// URL, got a ${url.protocol}// URL`);
  if (url.hash !== '') throw new InvalidOptionsError('url', 'a URL fragment (#...) is never sent: remove it');
  const shown = `${url.protocol}//${url.username ? '***@' : ''}${url.host}${url.pathname}${url.search ? '?***' : ''}`;
  return { url, shown };
}
