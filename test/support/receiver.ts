/**
 * A webhook receiver for the HTTP sink's tests: a node:http server that
 * records every request (headers, body bytes, when it arrived and when it
 * was answered, by the receiver's clock) and answers as `respond` says: a
 * status with headers, after a delay, or never (held until the sink gives up).
 */
import { Buffer } from 'node:buffer';
import { createServer, type IncomingHttpHeaders, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';

export interface Received {
  /** Order of arrival, from 0. */
  n: number;
  /** The request target: path and query. */
  url: string;
  headers: IncomingHttpHeaders;
  body: Buffer;
  /** performance.now() when the body was read, and when the answer went out (undefined: not answered). */
  at: number;
  answeredAt?: number;
  status?: number;
}

/** How to answer one request: `hold` never answers (the connection is closed when the server stops). */
export type Reply = { status: number; headers?: Record<string, string>; body?: string; delayMs?: number } | { hold: true };

export class Receiver {
  readonly requests: Received[] = [];
  /** Requests being handled now, and the most there ever were. */
  inFlight = 0;
  maxInFlight = 0;
  private server: Server | undefined;
  url = '';

  constructor(public respond: (request: Received) => Reply = () => ({ status: 200 })) {}

  async start(): Promise<this> {
    this.server = createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on('data', (c: Buffer) => chunks.push(c));
      req.on('end', () => {
        const request: Received = { n: this.requests.length, url: req.url ?? '', headers: req.headers, body: Buffer.concat(chunks), at: performance.now() };
        this.requests.push(request);
        this.inFlight += 1;
        this.maxInFlight = Math.max(this.maxInFlight, this.inFlight);
        const reply = this.respond(request);
        const done = () => (this.inFlight -= 1);
        if ('hold' in reply) {
          res.once('close', done);
          return;
        }
        const answer = () => {
          done();
          request.answeredAt = performance.now();
          request.status = reply.status;
          if (!res.destroyed) res.writeHead(reply.status, reply.headers ?? {}).end(reply.body ?? '');
        };
        if (reply.delayMs) setTimeout(answer, reply.delayMs);
        else answer();
      });
    });
    this.server.keepAliveTimeout = 30_000;
    await new Promise<void>((resolve) => this.server!.listen(0, '127.0.0.1', resolve));
    this.url = `http://127.0.0.1:${(this.server.address() as AddressInfo).port}/hook`;
    return this;
  }

  async stop(): Promise<void> {
    if (!this.server) return;
    this.server.closeAllConnections();
    await new Promise<void>((resolve) => this.server!.close(() => resolve()));
  }
}

/** A seeded pseudo-random generator (mulberry32): the same failures on every run. */
export function seeded(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
