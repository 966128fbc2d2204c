/**
 * The Redis Streams sink: each relayed event becomes one entry of a Redis
 * stream, the stream's key rendered from a template (`{schema}:{stream}` by
 * default: one Redis stream per tidemark stream), added with XADD under an
 * explicit entry id taken from the event's seq, `<seq>-0`.
 *
 * Entry fields, format `tidemark` (the default), in this order:
 * `id` (`<schema>:<seq>`), `seq` (decimal), `stream`, `kind`, `key`,
 * `occurred_at` (ISO 8601, milliseconds), `payload` (PostgreSQL's JSON text
 * of the payload, byte for byte: numbers JavaScript cannot hold arrive
 * whole), `headers` (the headers' JSON text), then `traceparent` and
 * `tracestate` when the headers carry a valid W3C trace context as strings,
 * so a consumer can continue the trace. The event's other headers are in
 * `headers` only: Redis fields are flat, and a header named like one of the
 * fields above must not replace it. Format `cloudevents`: two fields,
 * `content-type` (`application/cloudevents+json`) and `cloudevent` (the
 * structured-mode envelope, src/relay/format.ts). Binary mode needs message
 * headers, which entries do not have: refused.
 *
 * Delivery is exactly once. Entry ids only grow within a Redis stream, and
 * Redis refuses an XADD whose id is not above the stream's top with one
 * fixed reply (`ERR The ID specified in XADD is equal or smaller than the
 * target stream top item`, replies.ts). The relay publishes one tidemark
 * stream's events in seq order and, after a failure or a crash, publishes
 * again from its committed cursor; so an event refused that way is one a
 * previous attempt stored, and the sink counts it as delivered. A page is
 * stored as a prefix: its events up to one Redis refused, never a later
 * one after it. With a plain pipeline, a command refused for a passing
 * reason (OOM, READONLY after a failover) could be followed by a later one
 * stored, and the refused event, published again, would then be taken as
 * delivered and lost. So a page goes as calls of a Lua script
 * ({@link PAGE_SCRIPT}), 128 entries each, sent pipelined: each adds its
 * entries in order and stops at the first refusal other than that one,
 * and adds nothing unless the calls before it stored all of theirs. A
 * script runs whole, with no other command between its XADDs, and costs
 * one command where a pipeline costs one per event. Where the server does not let the user run scripts (an
 * ACL without `@scripting`, a managed service without Lua), `open` finds
 * out and each page goes as one MULTI/EXEC transaction instead: stored
 * whole or, when a command is refused while queued, not at all. This
 * holds as long as:
 * - the Redis stream belongs to the relay: nothing else adds entries to it
 *   (an entry above an event's seq would make the relay skip the event), and
 *   nobody deletes the key (the relay would not send again what it held);
 * - one Redis stream takes one tidemark stream's events: seqs are global,
 *   so two tidemark streams in one key would refuse each other's lower ids.
 *   The key template may name only `{schema}` and `{stream}` (a `{kind}`,
 *   `{key}` or `{seq}` key could join streams at run time), and `open`
 *   refuses a template under which two relayed streams share a key;
 * - Redis keeps what it acknowledged: `appendonly yes` with
 *   `appendfsync always`, and no failover to a replica that missed writes.
 *   A server that loses acknowledged entries (no persistence, `everysec`'s
 *   last second) loses them for good: the relay's cursor has moved past them.
 * Moving the relay's cursor back (`tidemark cursor set`) re-sends nothing
 * below the stream's top: to rebuild a Redis stream, delete its key first.
 *
 * Trimming (optional, at most one): `maxLen` adds `MAXLEN ~ n` to each
 * XADD, `minIdLag` adds `MINID ~ <seq − n + 1>` (about the entries of the
 * last n seqs). Trimming never lowers a stream's top, so a republished
 * event that was trimmed away is still refused as stored.
 *
 * Connections: ioredis's own reconnection, offline queue and resending are
 * off (the relay owns retries). A connection failure, a page that waits
 * `ackTimeoutMs` for its reply (the connection is then destroyed) and the
 * transient replies fail the page with a retryable `SinkError`; the next
 * `publish` connects again.
 *
 * @example
 * ```ts
 * const sink = new RedisSink({ url: 'redis://127.0.0.1:6379', maxLen: 1_000_000 });
 * const relay = new Relay(pool, sink, { consumer: 'to-redis', streams: ['orders'] });
 * ```
 */
import { Buffer } from 'node:buffer';
import { createHash } from 'node:crypto';
import type { Redis } from 'ioredis';
import { ClosedError, InvalidOptionsError, SinkError } from '../../../errors.js';
import { checkKnownOptions, integerOption } from '../../../options.js';
import { messageFormat, type FormatOptions, type MessageFormat } from '../../format.js';
import type { RelayMessage, Sink, SinkTarget } from '../../sink.js';
import { compileTemplate, type Template } from '../../template.js';
import { RedisLink } from './connection.js';
import { xaddArgs, type Trim } from './entry.js';
import { ALREADY_STORED, alreadyStored, NAME, redisError, replyCode, scriptRefusal } from './replies.js';
import { parseRedisUrl, type RedisServer } from './url.js';

/** Options for {@link RedisSink}. Every duration is in milliseconds. */
export interface RedisSinkOptions extends FormatOptions {
  /** The server: `redis://[USER:PASS@]HOST:PORT[/DB]`, or `rediss://` for TLS (certificates verified). Port 6379 and database 0 when left out. Required. */
  url: string;
  /**
   * Template of each tidemark stream's Redis stream key; fields `{schema}`
   * and `{stream}` only (see the module comment). Default `{schema}:{stream}`.
   */
  stream?: string;
  /** Trim each stream to about this many entries (`XADD ... MAXLEN ~ n`). Default: no trimming. */
  maxLen?: number;
  /** Trim entries more than this many seqs below each new one (`XADD ... MINID ~ <seq − n + 1>`). Default: no trimming. */
  minIdLag?: number;
  /** How long a page waits for Redis's reply before it fails (retryable) and the connection is dropped. Default 10000. */
  ackTimeoutMs?: number;
  /** How long connecting (and each check of `open`) may take before it fails (retryable). Default 5000. */
  connectTimeoutMs?: number;
}

const DEFAULTS = { stream: '{schema}:{stream}', ackTimeoutMs: 10_000, connectTimeoutMs: 5_000 };
const KEY_FIELDS: readonly string[] = ['schema', 'stream'];
/** Redis's default `proto-max-bulk-len`, 512 MiB. */
const DEFAULT_MAX_BULK_BYTES = 512 * 1024 * 1024;
/** How {@link PAGE_SCRIPT} says that a part found the parts before it not stored. */
const PART_GAP = 'TIDEMARK_PART_GAP';

/**
 * Part of a page's XADDs in one command. KEYS[1] is the Redis stream.
 * ARGV[1] is the id of the previous part's last entry ('' for a page's
 * first part); then, for each entry in seq order, its number of XADD
 * arguments and those arguments (after the key). The parts of a page are
 * sent pipelined, so a part first checks that the stream's top is at or
 * above ARGV[1]: every entry of the parts before it stored (now or before),
 * none of them refused. If not it adds nothing and returns `{0, GAP}`.
 * Then it adds the entries in order and stops at the first refusal other
 * than {@link ALREADY_STORED}, returning the number of entries before it
 * (stored now or before) and the refusal; `{count}` when every entry is
 * stored. Ids compare by their seq's digits: `<seq>-0` throughout.
 */
export const PAGE_SCRIPT = `local after = ARGV[1]
if after ~= '' then
  local top = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)[1]
  local at = top and string.sub(top[1], 1, string.find(top[1], '-', 1, true) - 1) or ''
  local want = string.sub(after, 1, string.find(after, '-', 1, true) - 1)
  if #at < #want or (#at == #want and at < want) then return {0, ${JSON.stringify(`${PART_GAP} the previous part of the page was not stored`)}} end
end
local added, i = 0, 2
while i <= #ARGV do
  local n = tonumber(ARGV[i])
  local reply = redis.pcall('XADD', KEYS[1], unpack(ARGV, i + 1, i + n))
  if type(reply) == 'table' and reply.err ~= nil and reply.err ~= ${JSON.stringify(ALREADY_STORED)} then
    return {added, reply.err}
  end
  added = added + 1
  i = i + n + 1
end
return {added}`;
const PAGE_SCRIPT_SHA = createHash('sha1').update(PAGE_SCRIPT).digest('hex');
/**
 * Entries per script call: a page goes in parts, pipelined, so Redis runs
 * one part while the next is encoded and sent.
 */
const PART_ENTRIES = 128;
/**
 * At most this many UTF-16 units of arguments per part (so at most three
 * times as many bytes): a command must fit Redis's query buffer
 * (`client-query-buffer-limit`, 1 GiB by default).
 */
const SCRIPT_CALL_UNITS = 32 * 1024 * 1024;

/**
 * Publishes relayed events to Redis Streams, exactly once (see the module
 * comment for the conditions). Options are checked in the constructor;
 * nothing connects before `open`.
 */
export class RedisSink implements Sink {
  readonly name = NAME;
  readonly inOrderOnly = 'a Redis stream takes an entry only above its top: a replayed dead letter would be taken as stored and lost';
  readonly description: string;
  readonly ackTimeoutMs: number;
  private readonly connectTimeoutMs: number;
  private readonly server: RedisServer;
  private readonly keyTemplate: Template;
  private readonly trim: Trim;
  /** The CloudEvents rendering; undefined: tidemark's own fields. */
  private readonly format: MessageFormat | undefined;
  /** Set by `open`: each relayed stream's key, and the installation's origin id. */
  private target: { keys: Map<string, string>; origin: string } | undefined;
  private readonly link: RedisLink;
  /**
   * The server's `proto-max-bulk-len` as `open` read it (Redis's default
   * when CONFIG is not allowed): a longer field makes Redis drop the
   * connection without a reply, so it is refused before sending.
   */
  private maxBulkBytes = DEFAULT_MAX_BULK_BYTES;
  /** Whether pages go as {@link PAGE_SCRIPT} calls (`open` checks that the user may run it) or as MULTI/EXEC transactions. */
  private scripted = false;
  private closed = false;

  /** Checks `options` (throws `InvalidOptionsError` naming the option); connects to nothing. */
  constructor(options: RedisSinkOptions) {
    if (typeof options !== 'object' || options === null) throw new InvalidOptionsError('options', 'expected an object');
    const server = parseRedisUrl(options.url);
    const keyTemplate = compileTemplate(options.stream ?? DEFAULTS.stream, 'stream');
    const other = keyTemplate.fields.find((field) => !KEY_FIELDS.includes(field));
    if (other !== undefined) {
      throw new InvalidOptionsError(
        'stream',
        `names {${other}}: a Redis stream key may name only {schema} and {stream}, since entry ids come from the seq, ` +
          'which all tidemark streams share: one Redis stream must take the events of one tidemark stream, and all of them',
      );
    }
    const maxLen = options.maxLen === undefined ? undefined : integerOption(options, 'maxLen', 0, 1, Number.MAX_SAFE_INTEGER);
    const minIdLag = options.minIdLag === undefined ? undefined : integerOption(options, 'minIdLag', 0, 1, Number.MAX_SAFE_INTEGER);
    if (maxLen !== undefined && minIdLag !== undefined) throw new InvalidOptionsError('minIdLag', 'trims by seq, maxLen by count: give one of them, not both');
    const resolved = {
      url: server.shown,
      stream: keyTemplate.text,
      maxLen,
      minIdLag,
      ackTimeoutMs: integerOption(options, 'ackTimeoutMs', DEFAULTS.ackTimeoutMs, 1, 3_600_000),
      connectTimeoutMs: integerOption(options, 'connectTimeoutMs', DEFAULTS.connectTimeoutMs, 1, 600_000),
      format: undefined,
      ceSource: undefined,
      ceType: undefined,
    };
    checkKnownOptions(options, resolved, 'RedisSink');
    const format = messageFormat(options, NAME, false);
    this.server = server;
    this.keyTemplate = keyTemplate;
    this.trim = { maxLen, minIdLag };
    this.format = format.format === 'tidemark' ? undefined : format;
    this.ackTimeoutMs = resolved.ackTimeoutMs;
    this.connectTimeoutMs = resolved.connectTimeoutMs;
    this.link = new RedisLink(server, resolved.connectTimeoutMs);
    const trimmed = maxLen !== undefined ? ` maxlen ~${maxLen}` : minIdLag !== undefined ? ` minid lag ${minIdLag}` : '';
    this.description = `${server.shown} stream ${keyTemplate.text}${trimmed}${this.format ? ` as ${format.format}` : ''}`;
  }

  /**
   * Renders each relayed stream's key (two streams on one key: not
   * retryable), connects, PINGs, and checks that each key is a stream or
   * absent (another type: not retryable, naming the key).
   */
  async open(target: SinkTarget, signal: AbortSignal): Promise<void> {
    if (this.closed) throw new ClosedError('RedisSink');
    signal.throwIfAborted();
    const keys = new Map<string, string>();
    const owners = new Map<string, string>();
    for (const stream of target.streams) {
      const key = this.keyTemplate.render(probe(target.schema, stream));
      const owner = owners.get(key);
      if (owner !== undefined) {
        throw new SinkError(
          NAME,
          `streams ${JSON.stringify(owner)} and ${JSON.stringify(stream)} would share the Redis stream ${JSON.stringify(key)} (template ${this.keyTemplate.text}): ` +
            'entry ids come from the seq, shared by all streams, so each would refuse the other\'s lower ids; name {stream} in the template',
          { retryable: false },
        );
      }
      owners.set(key, stream);
      keys.set(stream, key);
    }
    const client = await this.link.connection(signal);
    await this.check(client, client.ping(), signal, 'PING');
    this.maxBulkBytes = await this.maxBulk(client, signal);
    for (const key of new Set(keys.values())) {
      const type = await this.check(client, client.type(key), signal, `checking the key ${JSON.stringify(key)}`);
      if (type !== 'stream' && type !== 'none') {
        throw new SinkError(NAME, `the key ${JSON.stringify(key)} on ${this.server.address} holds a ${type}, not a stream: change the stream template, or remove the key`, {
          retryable: false,
        });
      }
    }
    this.scripted = await this.scriptAllowed(client, keys.values().next().value ?? 'tidemark', signal);
    this.target = { keys, origin: target.origin };
  }

  /**
   * Sends `messages` as one MULTI/EXEC transaction of XADDs, pipelined, and
   * resolves once Redis answered it: each entry stored, or refused as at or
   * below the stream's top (stored before). Rejects with the first other
   * refusal, or when no reply came within `ackTimeoutMs`.
   */
  async publish(messages: readonly RelayMessage[], signal: AbortSignal): Promise<void> {
    if (this.closed) throw new ClosedError('RedisSink');
    const target = this.target;
    if (!target) throw new SinkError(NAME, 'publish was called before open', { retryable: false });
    signal.throwIfAborted();
    if (messages.length === 0) return;
    const keys: string[] = [];
    const entries: string[][] = [];
    for (const message of messages) {
      const key = target.keys.get(message.event.stream) ?? this.keyTemplate.render(message);
      const args = xaddArgs(message, this.trim, this.format, target.origin);
      this.checkSize(message, key, args);
      keys.push(key);
      entries.push(args);
    }
    const client = await this.link.connection(signal);
    if (this.scripted) return this.addByScript(client, keys, entries, messages, signal);
    const tx = client.multi();
    for (let i = 0; i < entries.length; i += 1) tx.xadd(keys[i]!, ...(entries[i] as [string, string]));
    const replies = await this.reply(client, tx.exec(), messages, 0, messages.length, signal);
    if (!replies) throw new SinkError(NAME, `publishing ${this.what(messages, 0, messages.length)}: Redis discarded the transaction`, { retryable: true });
    for (let i = 0; i < replies.length; i += 1) {
      const failure = replies[i]![0];
      if (failure === null || alreadyStored(failure)) continue;
      const seq = messages[i]!.event.seq;
      throw redisError(failure, `publishing the event seq ${seq} to the Redis stream ${JSON.stringify(keys[i])}`, seq);
    }
  }

  /**
   * `messages` as {@link PAGE_SCRIPT} calls, pipelined: one run of events
   * with the same key after another, each run in parts of up to
   * {@link PART_ENTRIES} entries and {@link SCRIPT_CALL_UNITS}. A part adds
   * nothing unless the parts before it stored all of their entries, so what
   * Redis holds is always a prefix of the page; the first refusal, in page
   * order, is the page's.
   */
  private async addByScript(client: Redis, keys: string[], entries: string[][], messages: readonly RelayMessage[], signal: AbortSignal): Promise<void> {
    const parts: { from: number; key: string; reply: Promise<unknown> }[] = [];
    // Per key, the last entry of its previous part: a key's parts are chained even when other keys' come between.
    const lastOf = new Map<string, string>();
    for (let from = 0; from < entries.length; ) {
      const key = keys[from]!;
      const args: string[] = [PAGE_SCRIPT_SHA, '1', key, lastOf.get(key) ?? ''];
      let units = 0;
      let to = from;
      while (to < entries.length && keys[to] === key && (to === from || (to - from < PART_ENTRIES && units < SCRIPT_CALL_UNITS))) {
        const entry = entries[to]!;
        args.push(String(entry.length));
        for (const arg of entry) {
          args.push(arg);
          units += arg.length;
        }
        to += 1;
      }
      const sent = this.link.send(client, 'evalsha', args).catch((err: unknown) => {
        // Not in the server's script cache (a restart, SCRIPT FLUSH): the script itself, which caches it again.
        if (replyCode(err) !== 'NOSCRIPT') throw err;
        args[0] = PAGE_SCRIPT;
        return this.link.send(client, 'eval', args);
      });
      const reply = this.reply(client, sent, messages, from, to, signal);
      reply.catch(() => undefined); // awaited below, in order; a part after a failure is not
      parts.push({ from, key, reply });
      lastOf.set(key, `${messages[to - 1]!.event.seq}-0`);
      from = to;
    }
    for (const { from, key, reply } of parts) {
      const [added, refusal] = (await reply) as [number, string?];
      if (refusal === undefined) continue;
      if (refusal.startsWith(PART_GAP)) {
        // Only after a part that failed, whose error came first; or the key was changed between two parts.
        throw new SinkError(NAME, `publishing to the Redis stream ${JSON.stringify(key)}: its top fell below an entry just stored (was the key deleted?)`, { retryable: true });
      }
      const seq = messages[from + added]!.event.seq;
      throw redisError(scriptRefusal(refusal), `publishing the event seq ${seq} to the Redis stream ${JSON.stringify(key)}`, seq);
    }
  }

  /** Redis's reply to the events `from` to `to` (exclusive) of `messages`, bounded by ackTimeoutMs; a failure as a SinkError. */
  private async reply<T>(client: Redis, reply: Promise<T>, messages: readonly RelayMessage[], from: number, to: number, signal: AbortSignal): Promise<T> {
    const what = this.what(messages, from, to);
    try {
      return await this.link.bounded(client, reply, signal, this.ackTimeoutMs, () => `no reply from ${this.server.address} to ${what} within ${this.ackTimeoutMs} ms (ackTimeoutMs); the connection was dropped`);
    } catch (err) {
      if (signal.aborted && err === signal.reason) throw err;
      throw redisError(err, `publishing ${what} to ${this.server.address}`, undefined, this.link.lastError);
    }
  }

  /** "the event seq N" or "the events seq N to M", for the events `from` to `to` (exclusive). */
  private what(messages: readonly RelayMessage[], from: number, to: number): string {
    const first = messages[from]!.event.seq;
    const last = messages[to - 1]!.event.seq;
    return to - from === 1 ? `the event seq ${first}` : `the events seq ${first} to ${last}`;
  }

  /** Closes the connection; idempotent. */
  close(): Promise<void> {
    this.closed = true;
    return this.link.close();
  }

  /**
   * Whether the user may run {@link PAGE_SCRIPT}: a call with no entries
   * (which also puts the script in the server's cache). A refusal that is
   * not retryable (NOPERM, an unknown or renamed command, scripting turned
   * off) means no: pages then go as MULTI/EXEC transactions.
   */
  private async scriptAllowed(client: Redis, key: string, signal: AbortSignal): Promise<boolean> {
    try {
      await this.check(client, client.eval(PAGE_SCRIPT, 1, key, ''), signal, 'loading the page script (EVAL)');
      return true;
    } catch (err) {
      if (err instanceof SinkError && !err.retryable) return false;
      throw err;
    }
  }

  /** `proto-max-bulk-len`, or Redis's default when CONFIG GET is not allowed (managed servers, ACLs). */
  private async maxBulk(client: Redis, signal: AbortSignal): Promise<number> {
    try {
      const reply = await this.check(client, client.config('GET', 'proto-max-bulk-len'), signal, 'CONFIG GET proto-max-bulk-len');
      const value = Number((reply as string[])[1]);
      return Number.isSafeInteger(value) && value > 0 ? value : DEFAULT_MAX_BULK_BYTES;
    } catch (err) {
      if (err instanceof SinkError && !err.retryable) return DEFAULT_MAX_BULK_BYTES;
      throw err;
    }
  }

  /** Refuses (not retryable, naming the seq) an entry with a field over `proto-max-bulk-len`. */
  private checkSize(message: RelayMessage, key: string, args: readonly string[]): void {
    const limit = this.maxBulkBytes;
    for (const arg of args) {
      // UTF-16 length × 3 bounds the UTF-8 length: only a long field is measured.
      if (arg.length * 3 <= limit) continue;
      const bytes = Buffer.byteLength(arg);
      if (bytes > limit) {
        const seq = message.event.seq;
        throw new SinkError(NAME, `the event seq ${seq} has a field of ${bytes} bytes for the Redis stream ${JSON.stringify(key)}, over the server's proto-max-bulk-len of ${limit} bytes; raise it or keep events smaller`, {
          retryable: false,
          seq,
        });
      }
    }
  }

  /** A command of `open`, bounded by connectTimeoutMs. */
  private async check<T>(client: Redis, reply: Promise<T>, signal: AbortSignal, what: string): Promise<T> {
    try {
      return await this.link.bounded(client, reply, signal, this.connectTimeoutMs, () => `${what}: no reply from ${this.server.address} within ${this.connectTimeoutMs} ms (connectTimeoutMs)`);
    } catch (err) {
      if (signal.aborted && err === signal.reason) throw err;
      throw redisError(err, `${what} on ${this.server.address}`, undefined, this.link.lastError);
    }
  }
}

/** A message of `stream` with nothing but the key's fields, to render its key. */
function probe(schema: string, stream: string): RelayMessage {
  return { id: '', schema, event: { stream } } as RelayMessage;
}
