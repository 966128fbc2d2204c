/** The RabbitMQ sink's broker: its URL, parsed and checked, and the connection to it. */
import { sinkUrl } from '../../url.js';
import { Duplex } from 'node:stream';
import type { ChannelModel, Options } from 'amqplib';
import { loadAmqp } from './client.js';
import { SinkError } from '../../../errors.js';
import { NAME, REPLY, reason } from './protocol.js';

/**
 * amqplib reports a broker that refused the connection during the handshake
 * with a plain `Error` whose fixed text (lib/connection.js) is its only
 * mark: the login (`connection.start-ok`, reply code in the text) or the
 * vhost (`connection.open`, answered with a bare `connection.close`).
 */
const LOGIN_REFUSED = /^Handshake terminated by server: (\d+) /;
const VHOST_REFUSED = /^Expected ConnectionOpenOk; got <ConnectionClose /;

/** Where to connect, parsed once from `url`. */
export interface Broker {
  connect: Options.Connect;
  /** `host:port`, for messages. */
  address: string;
  user: string;
  vhost: string;
  /** The URL without its password. */
  shown: string;
}

/** Parses and checks the `url` option. */
export function parseUrl(value: unknown): Broker {
  const { url, host: hostname, bad } = sinkUrl(value, ['amqp:', 'amqps:'], 'amqp://USER:PASS@HOST:PORT/VHOST or amqps://...');
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
export async function connectBroker(broker: Broker, timeoutMs: number): Promise<ChannelModel> {
  // amqplib itself, first: missing, that is a MissingPackageError, not a failed connection.
  const { connect } = await loadAmqp();
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
export function connectError(broker: Broker, err: unknown): SinkError {
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

/** Destroys the connection's socket: amqplib's only way out of a connection whose broker stopped answering. */
export function destroySocket(model: ChannelModel): void {
  // amqplib keeps the socket as `connection.stream` (lib/connection.js) and
  // offers no abort. Destroying it with an error runs amqplib's own teardown:
  // 'error' and 'close' on the connection, 'close' on each channel.
  const stream: unknown = (model.connection as { stream?: unknown }).stream;
  if (stream instanceof Duplex && !stream.destroyed) stream.destroy(new Error('tidemark dropped the connection'));
}
