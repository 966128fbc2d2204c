/**
 * `tidemark relay --to URL --consumer NAME --stream S [--stream S2]`: the
 * flags of the relay role, turned into a sink and relay options before
 * anything connects. `serve --roles relay` takes the same flags.
 */
import { resolveRelayOptions, type RelayOptions } from '../../relay/options.js';
import type { Sink } from '../../relay/sink.js';
import type { FormatOptions } from '../../relay/format.js';
import type { HttpSinkOptions } from '../../relay/sinks/http/sink.js';
import type { RedisSinkOptions } from '../../relay/sinks/redis/sink.js';
import { InvalidOptionsError } from '../../errors.js';
import { readFile } from 'node:fs/promises';
import { echoValue, redactUrl } from '../../options.js';
import { CliError } from '../cli-error.js';
import { configured, positiveInt } from '../context.js';
import { parseDuration } from '../duration.js';
import { cursorTarget } from './cursor.js';
import type { CursorTarget } from '../../consumer/cursors.js';

/** The relay's flags, as commander parses them. */
export interface RelayFlags {
  to?: string;
  consumer?: string;
  stream?: string[];
  subject?: string;
  natsStream?: string;
  createStream?: boolean;
  exchange?: string;
  routingKey?: string;
  createExchange?: boolean;
  redisStream?: string;
  maxLen?: string;
  minIdLag?: string;
  format?: string;
  ceSource?: string;
  ceType?: string;
  webhookSecretFile?: string;
  concurrency?: string;
  webhookBatch?: string;
  onRefused?: string;
  batch?: string;
  ackTimeout?: string;
  restartWithin?: string;
  poll?: string;
  from?: string;
}

/** The relay role, configured: a sink not yet connected, and checked relay options. */
export interface RelaySetup {
  sink: Sink;
  options: RelayOptions;
  /** Where a cursor of a stream the relay has not relayed yet starts (`--from`); absent: seq 0. */
  from?: CursorTarget;
}

const NATS_ONLY = [['subject', '--subject'], ['natsStream', '--nats-stream'], ['createStream', '--create-stream']] as const;
const AMQP_ONLY = [['exchange', '--exchange'], ['routingKey', '--routing-key'], ['createExchange', '--create-exchange']] as const;
const HTTP_ONLY = [['webhookSecretFile', '--webhook-secret-file'], ['concurrency', '--concurrency'], ['webhookBatch', '--webhook-batch']] as const;
const REDIS_ONLY = [['redisStream', '--redis-stream'], ['maxLen', '--max-len'], ['minIdLag', '--min-id-lag']] as const;
const SCHEMES = 'a nats://, tls://, amqp://, amqps://, redis://, rediss://, http:// or https:// URL';
/** The environment variable the webhook secret is read from (a flag's value would show in `ps`). */
export const WEBHOOK_SECRET_ENV = 'TIDEMARK_WEBHOOK_SECRET';

/**
 * Checks the relay flags and builds the sink and options; throws `CliError`
 * naming the flag. Connects to nothing. Loads only the client library of
 * the broker named (each one costs memory and start-up time).
 */
export async function relaySetup(flags: RelayFlags, schema: string): Promise<RelaySetup> {
  if (!flags.to) throw new CliError('--to: required: where to relay to, nats://HOST:PORT, amqp://USER:PASS@HOST:PORT/VHOST, redis://HOST:PORT or an http(s):// webhook URL');
  if (!flags.consumer) throw new CliError('--consumer: required: the name of the relay\'s cursors');
  if (!flags.stream || flags.stream.length === 0) throw new CliError('--stream: required: a stream to relay (repeat --stream for more)');
  let scheme: string;
  try {
    scheme = new URL(flags.to).protocol;
  } catch {
    throw new CliError(`--to: expected ${SCHEMES}, got ${echoValue(redactUrl(flags.to))}`);
  }
  const nats = scheme === 'nats:' || scheme === 'tls:';
  const amqp = scheme === 'amqp:' || scheme === 'amqps:';
  const web = scheme === 'http:' || scheme === 'https:';
  const redis = scheme === 'redis:' || scheme === 'rediss:';
  if (!nats && !amqp && !web && !redis) throw new CliError(`--to: expected ${SCHEMES}, got ${echoValue(redactUrl(flags.to))}`);
  const others: [readonly (readonly [keyof RelayFlags, string])[], string][] = [[NATS_ONLY, 'nats://'], [AMQP_ONLY, 'amqp://'], [HTTP_ONLY, 'http(s)://'], [REDIS_ONLY, 'redis://']];
  for (const [only, kind] of others.filter(([, kind]) => kind !== (nats ? 'nats://' : amqp ? 'amqp://' : redis ? 'redis://' : 'http(s)://'))) {
    for (const [key, flag] of only) if (flags[key] !== undefined) throw new CliError(`${flag}: applies to ${kind} destinations, not ${scheme}//`);
  }
  if (flags.onRefused !== undefined && flags.onRefused !== 'stop' && flags.onRefused !== 'dead-letter') {
    throw new CliError(`--on-refused: expected stop or dead-letter, got ${echoValue(flags.onRefused)}`);
  }
  const from = flags.from === undefined ? undefined : cursorTarget(flags.from, '--from');
  // What every sink takes: the acknowledgement timeout and the format options (src/relay/format.ts).
  const common = dropUndefined({
    ackTimeoutMs: flags.ackTimeout === undefined ? undefined : parseDuration(flags.ackTimeout, '--ack-timeout'),
    format: flags.format === 'tidemark' ? undefined : (flags.format as FormatOptions['format']),
    ceSource: flags.ceSource,
    ceType: flags.ceType,
  });
  const options: RelayOptions = {
    consumer: flags.consumer,
    streams: flags.stream,
    schema,
    batchSize: flags.batch === undefined ? undefined : positiveInt(flags.batch, '--batch'),
    restartWithinMs: flags.restartWithin === undefined ? undefined : parseDuration(flags.restartWithin, '--restart-within'),
    pollIntervalMs: flags.poll === undefined ? undefined : parseDuration(flags.poll, '--poll'),
    onRefused: flags.onRefused as RelayOptions['onRefused'],
  };
  const sink = web ? await webhookSink(flags, common) : redis ? await redisSink(flags, common) : await brokerSink(flags, nats, common);
  if (flags.onRefused === 'dead-letter' && sink.inOrderOnly !== undefined) {
    throw new CliError(`--on-refused dead-letter: a dead letter's replay sends its event after later ones, and ${sink.inOrderOnly}; use --on-refused stop`);
  }
  configured(() => resolveRelayOptions(options));
  return { sink, options: dropUndefined(options), ...(from === undefined ? {} : { from }) };
}

/** What every sink's options share, from the flags. */
type CommonSinkOptions = Pick<FormatOptions, 'format' | 'ceSource' | 'ceType'> & { ackTimeoutMs?: number };

/**
 * Builds a sink; its `InvalidOptionsError` in the CLI's words. `named` maps
 * the sink's own option names that are not the flags' (`stream` of the
 * Redis sink is --redis-stream, not --stream).
 */
function buildSink(make: () => Sink, named: Record<string, string> = {}): Sink {
  try {
    return make();
  } catch (err) {
    if (err instanceof InvalidOptionsError && named[err.option]) throw new CliError(`${named[err.option]}: ${err.message.slice(err.option.length + 2)}`);
    return configured(() => {
      throw err;
    });
  }
}

/** The relay to NATS JetStream or RabbitMQ. */
async function brokerSink(flags: RelayFlags, nats: boolean, common: CommonSinkOptions): Promise<Sink> {
  const { NatsSink } = nats ? await import('../../relay/sinks/nats/sink.js') : { NatsSink: undefined };
  const { RabbitMqSink } = nats ? { RabbitMqSink: undefined } : await import('../../relay/sinks/rabbitmq/sink.js');
  // The broker's client package (an optional peer dependency), now: missing,
  // the command says which to install before it touches the database.
  if (nats) await (await import('../../relay/sinks/nats/client.js')).loadNats();
  else await (await import('../../relay/sinks/rabbitmq/client.js')).loadAmqp();
  return buildSink(() =>
    NatsSink
      ? new NatsSink(dropUndefined({ url: flags.to!, stream: flags.natsStream, subject: flags.subject, createStream: flags.createStream, ...common }))
      : new RabbitMqSink!(dropUndefined({ url: flags.to!, exchange: flags.exchange, routingKey: flags.routingKey, createExchange: flags.createExchange, ...common })),
  );
}

/** The relay to a redis:// or rediss:// server (src/relay/sinks/redis). */
async function redisSink(flags: RelayFlags, common: CommonSinkOptions): Promise<Sink> {
  const { RedisSink } = await import('../../relay/sinks/redis/sink.js');
  // ioredis (an optional peer dependency), now: missing, the command says so before it touches the database.
  await (await import('../../relay/sinks/redis/client.js')).loadRedis();
  const sinkOptions: RedisSinkOptions = dropUndefined({
    url: flags.to!,
    stream: flags.redisStream,
    maxLen: flags.maxLen === undefined ? undefined : positiveInt(flags.maxLen, '--max-len'),
    minIdLag: flags.minIdLag === undefined ? undefined : positiveInt(flags.minIdLag, '--min-id-lag'),
    ...common,
  });
  return buildSink(() => new RedisSink(sinkOptions), { stream: '--redis-stream', maxLen: '--max-len', minIdLag: '--min-id-lag' });
}

/** The relay to an http(s):// webhook: the secret from a file or the environment, never from a flag's value. */
async function webhookSink(flags: RelayFlags, common: CommonSinkOptions): Promise<Sink> {
  let secret: string | undefined;
  if (flags.webhookSecretFile !== undefined) {
    try {
      secret = (await readFile(flags.webhookSecretFile, 'utf8')).replace(/\r?\n$/, '');
    } catch (err) {
      throw new CliError(`--webhook-secret-file: cannot read ${JSON.stringify(flags.webhookSecretFile)} (${(err as NodeJS.ErrnoException).code ?? String(err)})`);
    }
    if (secret === '') throw new CliError(`--webhook-secret-file: ${JSON.stringify(flags.webhookSecretFile)} is empty`);
  } else if (process.env[WEBHOOK_SECRET_ENV]) {
    secret = process.env[WEBHOOK_SECRET_ENV];
  }
  const where = flags.webhookSecretFile !== undefined ? '--webhook-secret-file' : WEBHOOK_SECRET_ENV;
  const { HttpSink } = await import('../../relay/sinks/http/sink.js');
  const sinkOptions: HttpSinkOptions = dropUndefined({
    url: flags.to!,
    secret,
    concurrency: flags.concurrency === undefined ? undefined : positiveInt(flags.concurrency, '--concurrency'),
    batchSize: flags.webhookBatch === undefined ? undefined : positiveInt(flags.webhookBatch, '--webhook-batch'),
    ...common,
  });
  // Its batchSize is not the relay's --batch.
  return buildSink(() => new HttpSink(sinkOptions), { secret: where, concurrency: '--concurrency', batchSize: '--webhook-batch' });
}

function dropUndefined<T extends object>(value: T): T {
  return Object.fromEntries(Object.entries(value).filter(([, v]) => v !== undefined)) as T;
}
