/**
 * Standard Webhooks signatures (https://www.standardwebhooks.com/): each
 * request carries `webhook-id`, `webhook-timestamp` (unix seconds) and
 * `webhook-signature: v1,<base64 HMAC-SHA256 of "<id>.<timestamp>.<body>">`.
 *
 * The secret is either `whsec_<base64>` (the Standard Webhooks form: the
 * key is the base64-decoded bytes) or any other string, whose UTF-8 bytes
 * are the key as they are (what a receiver that takes a plain shared
 * secret, such as a GitHub-style HMAC check, expects). Either way the key
 * must be at least 16 bytes.
 */
import { Buffer } from 'node:buffer';
import { createHmac } from 'node:crypto';
import { InvalidOptionsError } from '../../../errors.js';

/** The Standard Webhooks secret prefix. */
export const SECRET_PREFIX = 'whsec_';
/** The shortest key taken, in bytes: a shorter one is guessable. */
export const MIN_KEY_BYTES = 16;

/** The HMAC key of `secret` (see the module comment); throws `InvalidOptionsError` naming `secret`, never echoing it. */
export function signingKey(secret: unknown): Buffer {
  if (typeof secret !== 'string' || secret.length === 0) throw new InvalidOptionsError('secret', 'expected a non-empty string');
  let key: Buffer;
  if (secret.startsWith(SECRET_PREFIX)) {
    const text = secret.slice(SECRET_PREFIX.length);
    key = Buffer.from(text, 'base64');
    // Buffer.from skips what is not base64: a typo would make another key in silence.
    if (!/^[A-Za-z0-9+/]*={0,2}$/.test(text) || key.toString('base64').replace(/=+$/, '') !== text.replace(/=+$/, '')) {
      throw new InvalidOptionsError('secret', `a ${SECRET_PREFIX} secret must be followed by base64 (the key's bytes)`);
    }
  } else {
    key = Buffer.from(secret, 'utf8');
  }
  if (key.length < MIN_KEY_BYTES) throw new InvalidOptionsError('secret', `the key is ${key.length} bytes; at least ${MIN_KEY_BYTES} are needed (Standard Webhooks suggests 24 to 64 random bytes)`);
  return key;
}

/** `v1,<base64 HMAC-SHA256 of "<id>.<timestamp>.<body>">`. */
export function signature(key: Buffer, id: string, timestamp: number, body: Buffer): string {
  return `v1,${createHmac('sha256', key).update(`${id}.${timestamp}.`).update(body).digest('base64')}`;
}
