/** The Redis sink's server: its `url` option, parsed and checked, with the password kept out of what is shown. */
import { sinkUrl } from '../../url.js';
import { redactUrl } from '../../../options.js';

/** Where to connect, parsed once from `url`. */
export interface RedisServer {
  host: string;
  port: number;
  /** `rediss://`: TLS, certificates verified against `host`. */
  tls: boolean;
  /** ACL user (Redis 6+); absent: the `default` user. */
  username: string | undefined;
  password: string | undefined;
  db: number;
  /** `host:port`, for messages. */
  address: string;
  /** The URL without its password. */
  shown: string;
}

const DEFAULT_PORT = 6379;

/** Parses `redis://[user:pass@]host:port[/db]` or `rediss://...`; throws `InvalidOptionsError` naming `url`. */
export function parseRedisUrl(value: unknown): RedisServer {
  const { text, url, host, bad } = sinkUrl(value, ['redis:', 'rediss:'], 'redis://[USER:PASS@]HOST:PORT[/DB] or rediss://...');
  if (url.search || url.hash) throw bad('query parameters and fragments are not taken');
  const path = url.pathname.replace(/^\//, '');
  if (path !== '' && !/^\d{1,9}$/.test(path)) throw bad(`the database ${JSON.stringify(path)} is not a number`);
  let username: string, password: string;
  try {
    username = decodeURIComponent(url.username);
    password = decodeURIComponent(url.password);
  } catch {
    throw bad('a malformed %-escape');
  }
  // `redis://user@host` would log in as nobody in particular: AUTH needs a password.
  if (username && !password) throw bad('a user without a password (write redis://USER:PASS@HOST, or redis://:PASS@HOST for the default user)');
  const port = url.port ? Number(url.port) : DEFAULT_PORT;
  return {
    host,
    port,
    tls: url.protocol === 'rediss:',
    username: username || undefined,
    password: password || undefined,
    db: path === '' ? 0 : Number(path),
    address: `${url.hostname}:${port}`,
    shown: redactUrl(text),
  };
}
