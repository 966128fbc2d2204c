// A webhook receiver for `tidemark relay --to http://...`: checks each
// request's Standard Webhooks signature (constant-time) and timestamp, and
// prints each event once, answering a copy it has already seen (the relay
// delivers at least once) with 2xx without printing it again.
// Start it, then the relay, with the same secret:
//   export TIDEMARK_WEBHOOK_SECRET=whsec_$(openssl rand -base64 32)
//   PORT=8787 npx tsx examples/webhook-receiver.ts
//   npx tidemark relay --to http://127.0.0.1:8787/hooks --consumer to-webhook --stream orders
import { Buffer } from 'node:buffer';
import { createHmac, timingSafeEqual } from 'node:crypto';
import { createServer } from 'node:http';

const secret = process.env.TIDEMARK_WEBHOOK_SECRET ?? '';
if (!secret) throw new Error('set TIDEMARK_WEBHOOK_SECRET, the relay\'s secret');
// whsec_<base64>: the key is the decoded bytes; any other secret: its UTF-8 bytes.
const key = secret.startsWith('whsec_') ? Buffer.from(secret.slice(6), 'base64') : Buffer.from(secret);
const TOLERANCE_S = 5 * 60; // older or newer requests may be replays of a captured one
const seen = new Set<string>(); // a service keeps webhook-ids in its database, with its effects

function verified(headers: Record<string, string | string[] | undefined>, body: Buffer): boolean {
  const [id, timestamp, signatures] = ['webhook-id', 'webhook-timestamp', 'webhook-signature'].map((h) => headers[h]);
  if (typeof id !== 'string' || typeof timestamp !== 'string' || typeof signatures !== 'string') return false;
  if (Math.abs(Date.now() / 1000 - Number(timestamp)) > TOLERANCE_S) return false;
  const expected = createHmac('sha256', key).update(`${id}.${timestamp}.`).update(body).digest();
  // The header may list several space-separated signatures (during a key rotation).
  return signatures.split(' ').some((s) => {
    const given = Buffer.from(s.startsWith('v1,') ? s.slice(3) : '', 'base64');
    return given.length === expected.length && timingSafeEqual(given, expected);
  });
}

const server = createServer((req, res) => {
  const chunks: Buffer[] = [];
  let size = 0;
  req.on('data', (chunk: Buffer) => {
    size += chunk.length;
    if (size > 1024 * 1024) req.destroy(); // bound what a caller can make us hold
    else chunks.push(chunk);
  });
  req.on('end', () => {
    const body = Buffer.concat(chunks);
    if (req.method !== 'POST' || !verified(req.headers, body)) return res.writeHead(401).end();
    const id = req.headers['webhook-id'] as string; // <origin>:<seq>, the same on every copy
    if (!seen.has(id)) {
      seen.add(id);
      const field = (name: string) => decodeURIComponent(String(req.headers[`tidemark-${name}`]));
      console.log(`${field('seq')} ${field('stream')} ${field('kind')} ${field('key')}: ${body.toString()}`);
    }
    res.writeHead(204).end();
  });
});
server.listen(Number(process.env.PORT ?? 8787), '127.0.0.1', () => console.error(`listening on http://127.0.0.1:${process.env.PORT ?? 8787}/`));
const stop = () => {
  server.close();
  server.closeAllConnections(); // the relay's keep-alive connections must not hold the exit
};
process.once('SIGTERM', stop);
process.once('SIGINT', stop);
