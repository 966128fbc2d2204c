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
 * event (measured: 43-55 µs against 80-94 µs on this workload), and the
 * relay's rate to a webhook is bound by that CPU time.
 */
import { Buffer } from 'node:buffer';
import { Pool, type Dispatcher } from 'undici';

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
  connectTimeoutMs: number;
}

/** What one try gave: the response's status, `Retry-After` in ms, and the start of its body; or the failure of the exchange. */
export type Answer =
  | { status: number; retryAfterMs: number | undefined; snippet: string }
  | { failure: 'timeout' | 'connect-timeout' | 'network'; error: Error };

/**
 * A pool of up to `sockets` keep-alive connections to `url`'s origin. Its
 * own timeouts for headers and body are off: `post` bounds the whole
 * exchange itself. Certificates are verified (NODE_EXTRA_CA_CERTS adds a
 * private CA, as for node:https).
 */
export function endpoint(url: URL, shown: string, sockets: number, connectTimeoutMs: number): Endpoint {
  const pool = new Pool(url.origin, { connections: sockets, pipelining: 1, headersTimeout: 0, bodyTimeout: 0, connect: { timeout: connectTimeoutMs } });
  const authorization =
    url.username || url.password ? `Basic ${Buffer.from(`${decodeURIComponent(url.username)}:${decodeURIComponent(url.password)}`).toString('base64')}` : undefined;
  return { url, shown, pool, path: `${url.pathname}${url.search}`, authorization, connectTimeoutMs };
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

/** undici's code for a connection not made within `connect.timeout`. */
const CONNECT_TIMEOUT = 'UND_ERR_CONNECT_TIMEOUT';

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
        controller = c;
        if (ended) c.abort(ended);
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
        const code = (error as { code?: unknown }).code;
        if (code === CONNECT_TIMEOUT) finish({ failure: 'connect-timeout', error: new Error(`no connection within ${ep.connectTimeoutMs} ms (connectTimeoutMs)`, { cause: error }) });
        else finish({ failure: 'network', error });
      },
    };
    try {
      ep.pool.dispatch({ origin: ep.url.origin, method: 'POST', path: ep.path, headers, body }, handler);
    } catch (err) {
      // Arguments undici refuses (a header value it cannot send): that try failed as the network would.
      finish({ failure: 'network', error: err instanceof Error ? err : new Error(String(err)) });
    }
  });
}

/** `Retry-After` in milliseconds from now: delay-seconds or an HTTP date; undefined when absent or unreadable. */
export function retryAfter(value: string | undefined, now = Date.now()): number | undefined {
  if (value === undefined) return undefined;
  const text = value.trim();
  if (/^\d+$/.test(text)) return Number(text) * 1000;
  const at = Date.parse(text);
  return Number.isNaN(at) ? undefined : Math.max(0, at - now);
}
