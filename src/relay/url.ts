/** The `url` option a broker sink takes, checked as far as every such sink checks it. */
import { InvalidOptionsError } from '../errors.js';
import { echoValue, redactUrl } from '../options.js';

/**
 * Parses `value` as a URL whose scheme is one of `schemes` (`'redis:'`)
 * with a host; `text` is `value`, a string. `bad(why)` builds the option's error: the reason, what was
 * `expected`, and the value without its password; the sink's own checks
 * use it too.
 */
export function sinkUrl(value: unknown, schemes: readonly string[], expected: string): { text: string; url: URL; host: string; bad: (why: string) => InvalidOptionsError } {
  const bad = (why: string) => new InvalidOptionsError('url', `${why}; expected ${expected}, got ${echoValue(typeof value === 'string' ? redactUrl(value) : value)}`);
  if (typeof value !== 'string') throw bad('not a string');
  let url: URL;
  try {
    url = new URL(value);
  } catch {
    throw bad('not a URL');
  }
  if (!schemes.includes(url.protocol)) throw bad(`the scheme ${url.protocol} is not ${schemes.join(' or ')}`);
  const host = url.hostname.replace(/^\[|\]$/g, '');
  if (!host) throw bad('no host');
  return { text: value, url, host, bad };
}
