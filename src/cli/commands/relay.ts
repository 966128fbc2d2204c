/**
 * `tidemark relay --to URL --consumer NAME --stream S [--stream S2]`: the
 * flags of the relay role, turned into a sink and relay options before
 * anything connects. `serve --roles relay` takes the same flags.
 */
import { resolveRelayOptions, type RelayOptions } from '../../relay/options.js';
import type { Sink } from '../../relay/sink.js';
import type { FormatOptions } from '../../relay/format.js';
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
  format?: string;
  ceSource?: string;
  ceType?: string;
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

/**
 * Checks the relay flags and builds the sink and options; throws `CliError`
 * naming the flag. Connects to nothing. Loads only the client library of
 * the broker named (each one costs memory and start-up time).
 */
export async function relaySetup(flags: RelayFlags, schema: string): Promise<RelaySetup> {
  if (!flags.to) throw new CliError('--to: required: the broker to relay to, nats://HOST:PORT or amqp://USER:PASS@HOST:PORT/VHOST');
  if (!flags.consumer) throw new CliError('--consumer: required: the name of the relay\'s cursors');
  if (!flags.stream || flags.stream.length === 0) throw new CliError('--stream: required: a stream to relay (repeat --stream for more)');
  let scheme: string;
  try {
    scheme = new URL(flags.to).protocol;
  } catch {
    throw new CliError(`--to: expected a nats://, tls://, amqp:// or amqps:// URL, got ${echoValue(redactUrl(flags.to))}`);
  }
  const nats = scheme === 'nats:' || scheme === 'tls:';
  const amqp = scheme === 'amqp:' || scheme === 'amqps:';
  if (!nats && !amqp) throw new CliError(`--to: expected a nats://, tls://, amqp:// or amqps:// URL, got ${echoValue(redactUrl(flags.to))}`);
  for (const [key, flag] of nats ? AMQP_ONLY : NATS_ONLY) {
    if (flags[key] !== undefined) throw new CliError(`${flag}: applies to ${nats ? 'amqp://' : 'nats://'} destinations, not ${scheme}//`);
  }
  const from = flags.from === undefined ? undefined : cursorTarget(flags.from, '--from');
  const ackTimeoutMs = flags.ackTimeout === undefined ? undefined : parseDuration(flags.ackTimeout, '--ack-timeout');
  // Every sink takes the format options (src/relay/format.ts); `tidemark` is the default.
  const format = { format: flags.format === 'tidemark' ? undefined : flags.format, ceSource: flags.ceSource, ceType: flags.ceType } as FormatOptions;
  const options: RelayOptions = {
    consumer: flags.consumer,
    streams: flags.stream,
    schema,
    batchSize: flags.batch === undefined ? undefined : positiveInt(flags.batch, '--batch'),
    restartWithinMs: flags.restartWithin === undefined ? undefined : parseDuration(flags.restartWithin, '--restart-within'),
    pollIntervalMs: flags.poll === undefined ? undefined : parseDuration(flags.poll, '--poll'),
  };
  const { NatsSink } = nats ? await import('../../relay/sinks/nats/sink.js') : { NatsSink: undefined };
  const { RabbitMqSink } = amqp ? await import('../../relay/sinks/rabbitmq/sink.js') : { RabbitMqSink: undefined };
  // The broker's client package (an optional peer dependency), now: missing,
  // the command says which to install before it touches the database.
  if (nats) await (await import('../../relay/sinks/nats/client.js')).loadNats();
  else await (await import('../../relay/sinks/rabbitmq/client.js')).loadAmqp();
  const sink = configured<Sink>(() =>
    NatsSink
      ? new NatsSink(dropUndefined({ url: flags.to!, stream: flags.natsStream, subject: flags.subject, createStream: flags.createStream, ackTimeoutMs, ...format }))
      : new RabbitMqSink!(dropUndefined({ url: flags.to!, exchange: flags.exchange, routingKey: flags.routingKey, createExchange: flags.createExchange, ackTimeoutMs, ...format })),
  );
  configured(() => resolveRelayOptions(options));
  return { sink, options: dropUndefined(options), ...(from === undefined ? {} : { from }) };
}

function dropUndefined<T extends object>(value: T): T {
  return Object.fromEntries(Object.entries(value).filter(([, v]) => v !== undefined)) as T;
}
