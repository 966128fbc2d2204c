/**
 * The NATS sink's `url`: `nats://[user:password@]host[:port]` (or `tls://`),
 * several servers of one cluster separated by commas (those after the first
 * may leave out the scheme). Credentials are taken out of the URL here, so
 * nothing printed afterwards can show them.
 */
import { InvalidOptionsError } from '../../../errors.js';
import { echoValue } from '../../../options.js';

/** A parsed `url`: what the client connects with, and how logs name it. */
export interface NatsServers {
  /** `host:port` of each server, as the client takes them. */
  servers: string[];
  /** `tls://`: the client requires TLS. */
  tls: boolean;
  user: string | undefined;
  pass: string | undefined;
  /** A user name without a password (`nats://token@host`): a token. */
  token: string | undefined;
  /** The servers, comma-separated, for messages: `127.0.0.1:4222`. */
  hosts: string;
  /** The URL without credentials: `nats://127.0.0.1:4222`. */
  display: string;
}

const DEFAULT_PORT = '4222';

/** Parses and checks `value`; a bad URL is an InvalidOptionsError naming `option`, never quoting a password. */
export function parseNatsUrl(value: unknown, option: string): NatsServers {
  if (typeof value !== 'string' || value.trim() === '') {
    throw new InvalidOptionsError(option, `expected a NATS URL such as nats://127.0.0.1:4222, got ${echoValue(value)}`);
  }
  const schemes = new Set<string>();
  const credentials = new Set<string>();
  const servers: string[] = [];
  let user: string | undefined;
  let pass: string | undefined;
  for (const [i, part] of value.split(',').entries()) {
    const bad = (why: string) => new InvalidOptionsError(option, `server ${i + 1} of the URL ${why}; expected nats://[user:password@]host:port or tls://...`);
    let url: URL;
    // A server after the first may leave out the scheme: `nats://a:4222,b:4222`.
    const text = i > 0 && !part.includes('://') ? `${[...schemes][0]}//${part.trim()}` : part.trim();
    try {
      url = new URL(text);
    } catch {
      throw bad('is not a URL');
    }
    if (url.protocol !== 'nats:' && url.protocol !== 'tls:') throw bad(`has the scheme ${echoValue(url.protocol.slice(0, -1))}`);
    if (url.hostname === '') throw bad('has no host');
    if ((url.pathname !== '' && url.pathname !== '/') || url.search !== '' || url.hash !== '') throw bad('has a path, query or fragment');
    schemes.add(url.protocol);
    if (url.username !== '' || url.password !== '') {
      user = decodeURIComponent(url.username);
      pass = url.password === '' ? undefined : decodeURIComponent(url.password);
      credentials.add(`${url.username}:${url.password}`);
    }
    servers.push(`${url.hostname}:${url.port || DEFAULT_PORT}`);
  }
  if (schemes.size > 1) throw new InvalidOptionsError(option, 'mixes nats:// and tls:// servers; use one scheme for all');
  if (credentials.size > 1) throw new InvalidOptionsError(option, 'gives different credentials for different servers; give the same (or only on the first)');
  const scheme = schemes.has('tls:') ? 'tls' : 'nats';
  const hosts = servers.join(',');
  return {
    servers,
    tls: scheme === 'tls',
    user: pass === undefined ? undefined : user,
    pass,
    token: pass === undefined ? user : undefined,
    hosts,
    display: `${scheme}://${hosts}`,
  };
}
