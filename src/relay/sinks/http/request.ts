/**
 * One POST of the HTTP sink, bounded: `connectTimeoutMs` to get a
 * connection, `ackTimeoutMs` for the whole exchange, and at most
 * {@link BODY_LIMIT} bytes of the response read (a receiver's answer is
 * only looked at for an error message; a longer one closes the connection
 * instead of being read on).
 *
 * Requests go through an undici `Pool` of keep-alive HTTP/1.1 connections,
 * one request on a connection at a time (no pipelining: a POST is not
 * idempotent, so a request is never queued behind another's answer). Its
 * dispatch API costs about half the CPU time of a `node:http` request per
 * event (measured: 38-48 µs against 81-94 µs on this workload), and the
 * relay's rate to a webhook is bound by that CPU time.
 *
 * Where undici differs from node:http, and what the sink makes of it:
 * - a `100 Continue` the sink did not ask for (it never sends `Expect`)
 *   breaks the exchange (node:http skipped it): the try fails as a lost
 *   connection would, and is sent again, its retry naming the 100;
 * - a 204 or 304 with a `Content-Length` and, rightly, no body counts as
 *   that status (undici reports the length as a mismatch);
 * - a header undici will not send is the event's refusal (its seq named),
 *   not a network failure sent again for ever;
 * - the connect timeout is a timer of our own (undici's ticks in about
 *   half seconds), and `close` ends connections still being made.
 */
import { Buffer } from 'node:buffer';
import type { Socket } from 'node:net';
import { buildConnector, errors, Pool, type Dispatcher } from 'undici';

/** Response bytes kept for an error message. */
export const SNIPPET_BYTES = 200;
/** Response bytes read before the connection is dropped rather than drained. */
export const BODY_LIMIT = 64 * 1024;

/** Where requests go, parsed once. */
export interface Endpoint {
  url: URL;
  /** The URL for logs: no credentials, no query string. */
  shown: string;
  pool: Pool;
  /** The request line's target: path and query. */
  path: string;
  /** `Basic ...` from the URL's credentials, or undefined. */
  authorization: string | undefined;
  /** Sockets still connecting: `close` ends them (the pool knows of a connection only once it is made). */
  connecting: Set<Socket>;
}

/** What one try gave: the response's status, `Retry-After` in ms, and the start of its body; or the failure of the exchange. */
export type Answer =
  | { status: number; retryAfterMs: number | undefined; snippet: string }
  | { failure: 'timeout' | 'network'; error: Error }
  /** undici refused to send the request (a header value it cannot carry): the event's own refusal, never sent. */
  | { failure: 'unsendable'; error: Error };

/**
 * A pool of up to `sockets` keep-alive connections to `url`'s origin. Its
 * own timeouts for headers and body are off: `post` bounds the whole
 * exchange itself. Certificates are verified (NODE_EXTRA_CA_CERTS adds a
 * private CA, as for node:https).
 */
export function endpoint(url: URL, shown: string, sockets: number, connectTimeoutMs: number): Endpoint {
  const connecting = new Set<Socket>();
  // undici's own connect timeout off (0): ours below, a native timer.
  const connector = buildConnector({ timeout: 0 });
  const connect: buildConnector.connector = (options, callback) => {
    // Set once the connector returned (its callback may come first, for a connection refused at once).
    const made: { socket?: Socket; timer?: NodeJS.Timeout; done?: boolean } = {};
    // The connector returns the socket it connects (its type says void).
    const socket = (connector as unknown as (o: buildConnector.Options, cb: buildConnector.Callback) => Socket)(options, (...args) => {
      made.done = true;
      clearTimeout(made.timer);
      if (made.socket) connecting.delete(made.socket);
      callback(...args);
    });
    if (made.done) return;
    made.socket = socket;
    connecting.add(socket);
    made.timer = setTimeout(() => socket.destroy(new errors.ConnectTimeoutError(`no connection within ${connectTimeoutMs} ms (connectTimeoutMs)`)), connectTimeoutMs);
  };
  const pool = new Pool(url.origin, { connections: sockets, pipelining: 1, headersTimeout: 0, bodyTimeout: 0, connect });
  const authorization =
    url.username || url.password ? `Basic ${Buffer.from(`${decodeURIComponent(url.username)}:${decodeURIComponent(url.password)}`).toString('base64')}` : undefined;
  return { url, shown, pool, path: `${url.pathname}${url.search}`, authorization, connecting };
}

/** Ends the pool's connections, and those still being made. */
export async function closeEndpoint(ep: Endpoint): Promise<void> {
  for (const socket of ep.connecting) socket.destroy(new Error('the HTTP sink was closed'));
  ep.connecting.clear();
  await ep.pool.destroy();
}

/**
 * The requests of one publish in flight, each by its cancel function: one
 * abort listener for all of them (an AbortSignal listener per request cost
 * a measurable part of each request's CPU time).
 */
export class InFlight {
  private readonly cancels = new Set<(reason: Error) => void>();
  private stopped: Error | undefined;

  /** Ends every request in flight, and any sent later, with `reason` (a network failure). */
  cancel(reason: unknown): void {
    this.stopped = reason instanceof Error ? reason : new Error('aborted');
    for (const cancel of this.cancels) cancel(this.stopped);
  }

  add(cancel: (reason: Error) => void): void {
    if (this.stopped) cancel(this.stopped);
    else this.cancels.add(cancel);
  }

  delete(cancel: (reason: Error) => void): void {
    this.cancels.delete(cancel);
  }
}

/** undici's codes: arguments it refuses; a body unlike its Content-Length. */
const INVALID_ARG = 'UND_ERR_INVALID_ARG';
const LENGTH_MISMATCH = 'UND_ERR_RES_CONTENT_LENGTH_MISMATCH';

/**
 * Sends `body` with `headers` and resolves with the answer; never rejects.
 * `inFlight.cancel` ends it with its reason as a network failure. An
 * exchange ended early (timeout, cancel, a long answer) has its connection
 * closed, so nothing of it is read as the next request's answer.
 */
export function post(ep: Endpoint, headers: Record<string, string>, body: Buffer, ackTimeoutMs: number, inFlight: InFlight): Promise<Answer> {
  return new Promise<Answer>((resolve) => {
    let settled = false;
    /** undici's hold on the exchange, once it has a connection; until then an end is applied when it gets one. */
    let controller: Dispatcher.DispatchController | undefined;
    let ended: Error | undefined;
    let status = 0;
    let retryAfterMs: number | undefined;
    const chunks: Buffer[] = [];
    let kept = 0;
    let read = 0;
    const finish = (answer: Answer) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      inFlight.delete(onCancel);
      resolve(answer);
    };
    /** Settles with `answer` and closes the connection: the exchange is not read to its end. */
    const end = (answer: Answer) => {
      finish(answer);
      ended ??= 'error' in answer ? answer.error : new Error('the answer was longer than the sink reads');
      controller?.abort(ended);
    };
    const timer = setTimeout(() => end({ failure: 'timeout', error: new Error(`no response within ${ackTimeoutMs} ms (ackTimeoutMs)`) }), ackTimeoutMs);
    const onCancel = (reason: Error) => end({ failure: 'network', error: reason });
    inFlight.add(onCancel);
    if (ep.authorization !== undefined) headers.authorization = ep.authorization;
    const handler: Dispatcher.DispatchHandler = {
      onRequestStart(c) {
        // Ended while it waited for a connection: refuse to start. undici then fails the request and keeps the
        // connection for the next one (an abort here would close it, unused).
        if (ended) throw ended;
        controller = c;
      },
      onResponseStart(_c, statusCode, responseHeaders) {
        status = statusCode;
        if (status < 200 || status >= 300) {
          const value = responseHeaders['retry-after'];
          retryAfterMs = retryAfter(Array.isArray(value) ? value[0] : value);
        }
      },
      onResponseData(_c, chunk) {
        read += chunk.length;
        // A 2xx acknowledges: its body is only drained so the connection is reused.
        if (kept < SNIPPET_BYTES && (status < 200 || status >= 300)) {
          chunks.push(chunk.subarray(0, SNIPPET_BYTES - kept));
          kept += Math.min(chunk.length, SNIPPET_BYTES - kept);
        }
        // Past the limit: answer now and drop the connection rather than read on.
        if (read > BODY_LIMIT) end({ status, retryAfterMs, snippet: Buffer.concat(chunks).toString('utf8') });
      },
      onResponseEnd() {
        finish({ status, retryAfterMs, snippet: chunks.length === 0 ? '' : Buffer.concat(chunks).toString('utf8') });
      },
      onResponseError(_c, error) {
        finish(failed(error, status, controller !== undefined));
      },
    };
    // Cancelled before it was sent (the publish failed meanwhile): nothing to send.
    if (settled) return;
    try {
      ep.pool.dispatch({ origin: ep.url.origin, method: 'POST', path: ep.path, headers, body }, handler);
    } catch (err) {
      finish(failed(err instanceof Error ? err : new Error(String(err)), status, false));
    }
  });
}

/** The answer of an exchange undici ended with `error`: `status` the answer's status if one came, `sent` whether the request went out on a connection. */
function failed(error: Error, status: number, sent: boolean): Answer {
  const code = (error as { code?: unknown }).code;
  // 204 and 304 have no body whatever their Content-Length says (RFC 9110 8.6): the answer is whole.
  if (code === LENGTH_MISMATCH && (status === 204 || status === 304)) return { status, retryAfterMs: undefined, snippet: '' };
  if (code === INVALID_ARG) return { failure: 'unsendable', error };
  // undici's one 'bad response' to a request sent and not yet answered is a 100 Continue (client-h1.js onHeadersComplete);
  // the others are answers on a connection with no request, which fail the requests queued for it: a network failure.
  if (code === 'UND_ERR_SOCKET' && error.message === 'bad response' && sent && status === 0) {
    return { failure: 'network', error: new Error('the receiver answered 100 Continue to a request that did not ask for it (no Expect header), which ends the exchange', { cause: error }) };
  }
  return { failure: 'network', error };
}

/** `Retry-After` in milliseconds from now: delay-seconds or an HTTP date; undefined when absent or unreadable. */
export function retryAfter(value: string | undefined, now = Date.now()): number | undefined {
  if (value === undefined) return undefined;
  const text = value.trim();
  if (/^\d+$/.test(text)) return Number(text) * 1000;
  const at = Date.parse(text);
  return Number.isNaN(at) ? undefined : Math.max(0, at - now);
}
