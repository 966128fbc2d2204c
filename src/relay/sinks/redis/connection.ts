/**
 * The Redis sink's connection: one ioredis client at a time, made when a
 * command needs it, destroyed when a reply is late. ioredis's own
 * reconnection, offline queue and resending are off: the relay owns retries,
 * and a command ioredis sent again behind its back could land after a later
 * page.
 */
import type * as IORedis from 'ioredis';
import type { Redis } from 'ioredis';
import { ClosedError, SinkError } from '../../../errors.js';
import { loadRedis } from './client.js';
import { NAME, redisError } from './replies.js';
import type { RedisServer } from './url.js';

const noop = () => undefined;

/** The live connection of a RedisSink, and the bounds on its replies. */
export class RedisLink {
  /** The last connection error ioredis reported (its commands then fail with a bare "Connection is closed"). */
  lastError: unknown;
  private client: Redis | undefined;
  /** ioredis itself, once a connection was dialled. */
  private module: typeof IORedis | undefined;
  private connecting: Promise<Redis> | undefined;
  private closed = false;
  private closing: Promise<void> | undefined;

  constructor(
    private readonly server: RedisServer,
    private readonly connectTimeoutMs: number,
  ) {}

  /** Closes the connection; idempotent. */
  close(): Promise<void> {
    this.closing ??= (async () => {
      this.closed = true;
      await this.connecting?.catch(noop);
      const client = this.client;
      this.client = undefined;
      if (client) await client.quit().catch(() => client.disconnect());
    })();
    return this.closing;
  }

  /** The live connection, or a new one (one attempt shared by concurrent callers); `signal` abandons the wait. */
  connection(signal: AbortSignal): Promise<Redis> {
    if (this.client?.status === 'ready') return Promise.resolve(this.client);
    this.connecting ??= this.dial().finally(() => (this.connecting = undefined));
    return abortable(this.connecting, signal);
  }

  private async dial(): Promise<Redis> {
    const stale = this.client;
    this.client = undefined;
    stale?.disconnect();
    this.module = await loadRedis();
    const { Redis: Client } = this.module;
    const { host, port, tls, username, password, db } = this.server;
    const client = new Client({
      host,
      port,
      ...(tls ? { tls: { servername: host } } : {}),
      ...(username !== undefined ? { username } : {}),
      ...(password !== undefined ? { password } : {}),
      db,
      connectionName: 'tidemark-relay',
      lazyConnect: true,
      connectTimeout: this.connectTimeoutMs,
      // The relay owns retries: no reconnection, no queue of commands
      // waiting for a connection, nothing sent again behind its back.
      retryStrategy: () => null,
      reconnectOnError: null,
      enableOfflineQueue: false,
      maxRetriesPerRequest: 0,
      autoResendUnfulfilledCommands: false,
      autoResubscribe: false,
      // RESP2: servers before Redis 6 have no HELLO; no maintenance push messages.
      protocol: 2,
      maintNotifications: 'disabled',
      disconnectTimeout: 100,
    });
    // Failures reach the relay through the commands they fail; the event names the socket's error.
    this.lastError = undefined;
    client.on('error', (err: unknown) => {
      if (this.client === client || this.client === undefined) this.lastError = err;
    });
    client.once('end', () => {
      if (this.client === client) this.client = undefined;
    });
    try {
      await this.bounded(client, client.connect(), undefined, this.connectTimeoutMs, () => `cannot connect to ${this.server.address}: not ready within ${this.connectTimeoutMs} ms (connectTimeoutMs)`);
    } catch (err) {
      client.disconnect();
      throw redisError(err, `cannot connect to ${this.server.address}`, undefined, this.lastError);
    }
    if (this.closed) {
      client.disconnect();
      throw new ClosedError('RedisSink');
    }
    this.client = client;
    return client;
  }

  /**
   * `reply`, or a retryable `SinkError` with `message()` after `ms` (the
   * connection is then destroyed: what it still owes can never be told
   * apart from a later page's replies), or `signal.reason` once it aborts.
   */
  bounded<T>(client: Redis, reply: Promise<T>, signal: AbortSignal | undefined, ms: number, message: () => string): Promise<T> {
    reply.catch(noop);
    return new Promise<T>((resolve, reject) => {
      const onAbort = () => {
        settle();
        reject(signal!.reason);
      };
      const timer = setTimeout(() => {
        settle();
        this.drop(client);
        reject(new SinkError(NAME, message(), { retryable: true }));
      }, ms);
      const settle = () => {
        clearTimeout(timer);
        signal?.removeEventListener('abort', onAbort);
      };
      if (signal?.aborted) return onAbort();
      signal?.addEventListener('abort', onAbort, { once: true });
      reply.then(
        (value) => {
          settle();
          resolve(value);
        },
        (err: unknown) => {
          settle();
          reject(err);
        },
      );
    });
  }

  /**
   * Sends the command `name` with `args` on `client` (made by this link),
   * as `client.call(name, ...args)` would. ioredis copies a command's
   * arguments with `Array.prototype.flat`, which V8 runs at about 130 ns an
   * argument: 2.4 µs an event of a page script call. `args` are strings,
   * flat already, so the command takes them as they are.
   */
  send(client: Redis, name: string, args: string[]): Promise<unknown> {
    const command = new this.module!.Command(name, [], { replyEncoding: 'utf8' });
    command.args = args;
    return client.sendCommand(command) as Promise<unknown>;
  }

  /** Destroys the connection at once (a stopped server never answers the FIN of a polite close). */
  drop(client: Redis): void {
    if (this.client === client) this.client = undefined;
    client.stream?.destroy();
    client.disconnect();
  }
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
