/**
 * One POST of the HTTP sink, bounded: `connectTimeoutMs` to get a
 * connection, `ackTimeoutMs` for the whole exchange, and at most
 * {@link BODY_LIMIT} bytes of the response read (a receiver's answer is
 * only looked at for an error message; a longer one closes the connection
 * instead of being read on).
 */
import { Buffer } from 'node:buffer';
import http from 'node:http';
import https from 'node:https';
import type { Socket } from 'node:net';

/** Response bytes kept for an error message. */
export const SNIPPET_BYTES = 200;
/** Response bytes read before the connection is dropped rather than drained. */
export const BODY_LIMIT = 64 * 1024;

/** Where requests go, parsed once. */
export interface Endpoint {
  url: URL;
  /** The URL for logs: no credentials, no query string. */
  shown: string;
  agent: http.Agent;
  request: typeof http.request;
  /** The URL as request options, made once (a URL given to each request is converted each time). */
  options: http.RequestOptions;
}

/** What one try gave: the response's status, `Retry-After` in ms, and the start of its body; or the failure of the exchange. */
export type Answer =
  | { status: number; retryAfterMs: number | undefined; snippet: string }
  | { failure: 'timeout' | 'connect-timeout' | 'network'; error: Error };

/** A keep-alive agent with room for `sockets` connections. */
export function endpoint(url: URL, shown: string, sockets: number): Endpoint {
  const tls = url.protocol === 'https:';
  const options = { keepAlive: true, maxSockets: sockets, maxFreeSockets: sockets, scheduling: 'lifo' as const };
  const agent = tls ? new https.Agent(options) : new http.Agent(options);
  const auth = url.username || url.password ? `${decodeURIComponent(url.username)}:${decodeURIComponent(url.password)}` : undefined;
  const request: http.RequestOptions = {
    method: 'POST',
    agent,
    protocol: url.protocol,
    // An IPv6 literal comes bracketed in a URL; the request wants it bare.
    hostname: url.hostname.startsWith('[') ? url.hostname.slice(1, -1) : url.hostname,
    port: url.port === '' ? undefined : Number(url.port),
    path: `${url.pathname}${url.search}`,
    ...(auth === undefined ? {} : { auth }),
  };
  return { url, shown, agent, request: tls ? https.request : http.request, options: request };
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

/** Sends `body` with `headers` and resolves with the answer; never rejects. `inFlight.cancel` ends it with its reason as a network failure. */
export function post(ep: Endpoint, headers: Record<string, string>, body: Buffer, ackTimeoutMs: number, connectTimeoutMs: number, inFlight: InFlight): Promise<Answer> {
  return new Promise<Answer>((resolve) => {
    let settled = false;
    let connectTimer: NodeJS.Timeout | undefined;
    const finish = (answer: Answer) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      clearTimeout(connectTimer);
      inFlight.delete(onAbort);
      resolve(answer);
    };
    const fail = (failure: 'timeout' | 'connect-timeout' | 'network', error: Error) => {
      finish({ failure, error });
      req.destroy();
    };
    headers['content-length'] = String(body.length);
    const req = ep.request({ ...ep.options, headers });
    const timer = setTimeout(() => fail('timeout', new Error(`no response within ${ackTimeoutMs} ms (ackTimeoutMs)`)), ackTimeoutMs);
    const onAbort = (reason: Error) => fail('network', reason);
    inFlight.add(onAbort);
    req.once('socket', (socket: Socket) => {
      if (!socket.connecting) return;
      connectTimer = setTimeout(() => fail('connect-timeout', new Error(`no connection within ${connectTimeoutMs} ms (connectTimeoutMs)`)), connectTimeoutMs);
      socket.once('connect', () => clearTimeout(connectTimer));
    });
    // `on`, not `once`: a request destroyed by a timeout may report more than one error.
    req.on('error', (err) => finish({ failure: 'network', error: err }));
    req.once('response', (res) => {
      const status = res.statusCode ?? 0;
      if (status >= 200 && status < 300) {
        // Acknowledged: the answer's body is not looked at, only drained (or dropped when long) so the connection is reused.
        let read = 0;
        res.on('data', (chunk: Buffer) => {
          read += chunk.length;
          if (read > BODY_LIMIT) {
            finish({ status, retryAfterMs: undefined, snippet: '' });
            req.destroy();
          }
        });
        res.once('end', () => finish({ status, retryAfterMs: undefined, snippet: '' }));
        res.on('error', (err) => finish({ failure: 'network', error: err }));
        return;
      }
      const chunks: Buffer[] = [];
      let kept = 0;
      let read = 0;
      const done = (drop: boolean) => {
        if (settled) return;
        finish({ status, retryAfterMs: retryAfter(res.headers['retry-after']), snippet: Buffer.concat(chunks).toString('utf8') });
        if (drop) req.destroy();
      };
      res.on('data', (chunk: Buffer) => {
        read += chunk.length;
        if (kept < SNIPPET_BYTES) {
          chunks.push(chunk.subarray(0, SNIPPET_BYTES - kept));
          kept += Math.min(chunk.length, SNIPPET_BYTES - kept);
        }
        // Past the limit: answer now and drop the connection rather than read on.
        if (read > BODY_LIMIT) done(true);
      });
      res.once('end', () => done(false));
      res.on('error', (err) => finish({ failure: 'network', error: err }));
    });
    req.end(body);
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
