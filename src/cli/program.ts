/**
 * The `tidemark` command tree: every command, its flags, help and examples,
 * mapped to the functions in commands/. Built here and run by main.ts, so
 * tests can read any command's help without starting a process.
 */
import { readFileSync } from 'node:fs';
import { Command, Option } from 'commander';
import { checkGlobals, type GlobalOptions } from './context.js';
import { CliError } from './cli-error.js';
import type { ExplainContext } from './explain.js';
import { checkFlags } from './flags.js';
import { DEFAULT_SCHEMA } from '../db/queryable.js';
import { REMOVED_WATERMARKER_OPTIONS } from '../watermark/options.js';

/** Flags of the removed watermarker options: parsed only to be refused, with the reason they went away. */
const REMOVED_FLAGS: [flags: string, option: string][] = [
  ['--lock-timeout <duration>', 'lockTimeoutMs'],
  ['--lock-timeout-max <duration>', 'lockTimeoutMaxMs'],
  ['--fence-try-limit <n>', 'fenceTryLimit'],
];

function refuseRemovedFlags(command: Command): Command {
  for (const [flags, option] of REMOVED_FLAGS) {
    const name = flags.split(' ')[0]!;
    command.addOption(
      new Option(flags).hideHelp().argParser(() => {
        throw new CliError(`${name} was removed: ${REMOVED_WATERMARKER_OPTIONS[option]}`);
      }),
    );
  }
  return command;
}

/** The package version, read at run time from package.json (two levels up from both src/cli/ and dist/cli/). */
function packageVersion(): string {
  return (JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as { version: string }).version;
}

/** The relay role's flags, shared by `relay` and `serve`. */
function relayFlags(command: Command): Command {
  return command
    .option('--to <url>', 'relay: the broker, nats://HOST:PORT, amqp://USER:PASS@HOST:PORT/VHOST or redis://HOST:PORT, or a webhook, https://HOST/PATH')
    .option('--consumer <name>', 'relay: the name of its cursors (one per stream)')
    .option('--stream <name>', 'relay: a stream to relay; repeat for more', (value: string, previous: string[] | undefined) => [...(previous ?? []), value])
    .option('--subject <template>', 'nats: subject of each message (default: {schema}.{stream}.{kind})')
    .option('--nats-stream <name>', 'nats: the JetStream stream (default: TIDEMARK)')
    .option('--create-stream', 'nats: create the JetStream stream when it is missing')
    .option('--exchange <template>', 'amqp: exchange of each message (default: tidemark)')
    .option('--routing-key <template>', 'amqp: routing key of each message (default: {stream}.{kind})')
    .option('--create-exchange', 'amqp: declare the exchange (durable, topic) when it is missing')
    .option('--redis-stream <template>', 'redis: key of each stream\'s Redis stream, {schema} and {stream} only (default: {schema}:{stream})')
    .option('--max-len <n>', 'redis: trim each Redis stream to about n entries (XADD MAXLEN ~ n)')
    .option('--min-id-lag <n>', 'redis: trim entries more than n seqs below the newest (XADD MINID ~)')
    .option('--format <format>', 'relay: tidemark (the payload as the body), cloudevents (a structured CloudEvent) or cloudevents-binary (attributes as headers)', 'tidemark')
    .option('--ce-source <template>', 'cloudevents: the source attribute (default: /tidemark/{schema}/{stream})')
    .option('--ce-type <template>', 'cloudevents: the type attribute (default: {kind})')
    .option('--webhook-secret-file <path>', 'http: file holding the signing secret, whsec_<base64> or raw (default: $TIDEMARK_WEBHOOK_SECRET; none: unsigned)')
    .option('--concurrency <n>', 'http: keys in flight at once, one request each (default: 16)')
    .option('--webhook-batch <n>', 'http: up to n consecutive events of one key per request, as a JSON array (default: 1)')
    .option('--on-refused <stop|dead-letter>', 'relay: an event the destination refuses (a 4xx, too large): stop, or record it as a dead letter and go on (default: stop)')
    .option('--batch <n>', 'relay: events per page, published pipelined', '500')
    .option('--ack-timeout <duration>', 'relay: how long a page waits for the broker\'s acknowledgements', '10s')
    .option('--restart-within <duration>', 'relay: how soon a supervisor restarts a crashed relay (part of the duplicate-window check)', '30s')
    .option('--poll <duration>', 'relay: poll interval when no notification arrives', '1s')
    .option('--from <now|start|seq>', 'relay: where the cursor of a stream not relayed before starts: now (skip what is published), start (what retention kept) or a seq (default: seq 0)');
}

const TEMPLATES = '\nA <template> names event fields in braces: {schema}, {stream}, {kind}, {key}, {seq}; {{ and }} are literal braces.\n';

/** Help of commands with <duration> flags: a number needs its unit (parseDuration refuses a bare one). */
export const DURATIONS = '\nA <duration> is a number and its unit: 500ms, 10s, 1.5m, 2h, 7d. A bare number (other than 0) is refused.\n';

/**
 * A command's module, loaded when that command runs: `tidemark append`
 * does not load the relay's broker clients or the demo (a quicker start for
 * every short command; `--help` and usage errors load none of them).
 */
function lazy<M, K extends keyof M>(load: () => Promise<M>, name: K): M[K] {
  return (async (...args: unknown[]) => {
    const run = (await load())[name] as (...a: unknown[]) => Promise<number>;
    return run(...args);
  }) as M[K];
}

/**
 * Builds the command tree. An action reports its exit code to `setExit`,
 * and what it connects to (for one-line failure messages) to `setContext`.
 */
export function program(setExit: (code: number) => void = () => undefined, setContext: (context: ExplainContext) => void = () => undefined): Command {
  const root = new Command('tidemark')
    .description('Gap-free transactional outbox and change stream for PostgreSQL')
    .version(packageVersion(), '-V, --version', 'print the version')
    .addOption(new Option('--database-url <url>', 'PostgreSQL URL (default: $DATABASE_URL, else an embedded server under ./.tidemark/)'))
    .option('--schema <name>', `tidemark schema (default: ${DEFAULT_SCHEMA}; demo: tidemark_demo)`)
    .option('--ephemeral', 'with no database URL: a throwaway embedded server, deleted on exit')
    .option('--verbose', 'on failure, print the stack trace after the one-line message')
    // Subcommands inherit this: their --help lists the global options too.
    .configureHelp({ showGlobalOptions: true })
    .showHelpAfterError(false)
    .exitOverride()
    .configureOutput({ outputError: () => undefined });

  // Commander's option names match each command's options type.
  const action =
    <T extends GlobalOptions>(run: (options: T) => Promise<number>, defaultSchema = DEFAULT_SCHEMA) =>
    async (_opts: unknown, command: Command) => {
      const options = command.optsWithGlobals() as T;
      options.schema = (options.schema as string | undefined) ?? defaultSchema;
      // Schema, URL and flags are checked before anything connects.
      const { schema, url } = checkGlobals(options);
      setContext({ schema, url });
      checkFlags(options as unknown as Record<string, unknown>);
      setExit(await run(options));
    };
  // The same, for a command whose arguments come first (commander passes them before the options).
  const actionWithArgs =
    <T extends GlobalOptions>(run: (args: string[], options: T) => Promise<number>) =>
    async (args: string[], _opts: unknown, command: Command) =>
      action<T>((options) => run(args, options))(_opts, command);
  const examples = (lines: string[]) => `\nExamples:\n${lines.map((l) => `  $ ${l}`).join('\n')}\n`;

  root
    .command('migrate')
    .description('apply pending migrations and list them')
    .option('--dry-run', 'list what would be applied; apply nothing')
    .addHelpText('after', examples(['npx tidemark migrate', 'DATABASE_URL=postgres://localhost/app npx tidemark migrate --dry-run']))
    .action(action(lazy(() => import('./commands/migrate.js'), 'migrateCommand')));

  relayFlags(refuseRemovedFlags(root.command('serve')))
    .description('run the daemon: the leased watermarker, the pruner and/or the relay, with /healthz and /metrics')
    .option('--roles <list>', 'comma-separated: watermarker, pruner, relay', 'watermarker,pruner')
    .option('--http <host:port>', 'serve GET /healthz and GET /metrics')
    .option('--owner <name>', 'lease owner / heartbeat name (default: host:pid:random)')
    .option('--lease-ttl <duration>', 'watermarker lease TTL', '10s')
    .option('--lease-renew <duration>', 'lease renewal interval, below half the TTL (default: TTL/3)')
    .option('--max-steps-per-second <n>', 'watermarker step budget: more publishes sooner under load, at more CPU (default: 100)')
    .option('--retention <duration>', 'pruner: delete events older than this', '7d')
    .option('--prune-interval <duration>', 'pruner: pause between passes', '1m')
    .option('--allow-short-retention', 'accept a retention below 1h')
    .option('--shutdown-timeout <duration>', 'on SIGINT/SIGTERM, exit 1 if stopping takes longer', '10s')
    .addHelpText(
      'after',
      examples([
        'npx tidemark serve --roles watermarker,pruner --http 127.0.0.1:9464',
        'npx tidemark serve --roles watermarker --lease-ttl 5s --owner node-a',
        'npx tidemark serve --roles watermarker,relay --to nats://127.0.0.1:4222 --consumer relay --stream orders --create-stream',
      ]) +
        DURATIONS +
        TEMPLATES,
    )
    .action(action(lazy(() => import('./commands/serve.js'), 'serveCommand')));

  relayFlags(root.command('relay'))
    .description('forward streams to NATS JetStream, RabbitMQ or an HTTP webhook, in seq order, with a durable cursor per stream')
    .option('--http <host:port>', 'serve GET /healthz and GET /metrics')
    .option('--shutdown-timeout <duration>', 'on SIGINT/SIGTERM, exit 1 if stopping takes longer', '10s')
    .addHelpText(
      'after',
      examples([
        'npx tidemark relay --to nats://127.0.0.1:4222 --consumer relay --stream orders --create-stream',
        "npx tidemark relay --to amqp://guest:guest@127.0.0.1:5672 --consumer relay --stream orders --stream payments --exchange tidemark --create-exchange",
        'TIDEMARK_WEBHOOK_SECRET=whsec_... npx tidemark relay --to https://hooks.example.com/tidemark --consumer webhook --stream orders --on-refused dead-letter',
      ]) +
        DURATIONS +
        TEMPLATES +
        '\nNATS: each event lands in JetStream once (Nats-Msg-Id <schema>:<seq>, within the stream\'s duplicate window).\nRabbitMQ: at least once (publisher confirms); consumers deduplicate by message_id <schema>:<seq>.\n' +
        'HTTP: at least once (2xx answers), Standard Webhooks signatures; receivers deduplicate by webhook-id <origin>:<seq>.\n',
    )
    .action(action(lazy(() => import('./commands/serve.js'), 'relayCommand')));

  root
    .command('append')
    .description('append events: one from flags, or NDJSON from stdin; prints the seqs')
    .option('--stream <stream>', 'stream name')
    .option('--kind <kind>', 'event kind')
    .option('--key <key>', 'entity key')
    .option('--payload <json>', 'JSON object')
    .option('--headers <json>', 'JSON object')
    .option('--ndjson', 'read events ({"stream","kind","key","payload","headers"} per line) from stdin')
    .option('--batch <n>', 'with --ndjson: events per transaction', '500')
    .addHelpText(
      'after',
      examples([`npx tidemark append --stream orders --kind order.placed --key o-1 --payload '{"total":42}'`, 'cat events.ndjson | npx tidemark append --ndjson']),
    )
    .action(action(lazy(() => import('./commands/append.js'), 'appendCommand')));

  refuseRemovedFlags(root.command('watermark'))
    .description('run one watermark step')
    .option('--once', 'one step, then release the lease')
    .option('--json', 'print the progress as JSON')
    .addHelpText('after', examples(['npx tidemark watermark --once --json']))
    .action(action(lazy(() => import('./commands/watermark.js'), 'watermarkCommand')));

  root
    .command('tail')
    .description('deliver a stream to stdout, advancing a durable cursor')
    .requiredOption('--consumer <name>', 'consumer name (the cursor is per consumer and stream)')
    .requiredOption('--stream <name>', 'stream to follow')
    .option('--bootstrap', "first move the cursor to the present (a fresh snapshot point); with --partitions, every partition's cursor (refused while another member runs)")
    .option('--once', 'deliver what is visible now, then exit')
    .option('--json', 'NDJSON output, payload and headers as PostgreSQL\'s text (default: tab-separated seq, kind, key, payload, escaped as COPY text)')
    .option('--limit <n>', 'stop after n events')
    .option('--batch <n>', 'events per page', '500')
    .option('--poll <duration>', 'poll interval when no notification arrives', '1s')
    .option('--from <now|start|seq>', 'where a new consumer starts: now (skip what is published), start (what retention kept) or a seq (default: seq 0); an existing cursor is left where it is')
    .option('--partitions <n>', "run as a member of the consumer's group of n partitions (by key): every process started with the same consumer and count shares the stream, each key in order")
    .option('--member <name>', 'this member\'s name in the group (default: host:pid:random)')
    .option('--concurrency <n>', "partitions this member pages at once (default 4)")
    .option('--lease <duration>', "the member's lease: its partitions move to the others this long after it stops (default 10s)")
    .option('--no-partition-index', "do not create the group's partition index (it costs appends; pages then read past other partitions' events)")
    .addHelpText(
      'after',
      examples([
        'npx tidemark tail --consumer audit --stream orders --json',
        'npx tidemark tail --consumer audit --stream orders --once --limit 100',
        'npx tidemark tail --consumer mailer --stream orders --partitions 16 --json',
      ]) +
        DURATIONS +
        '\nExit code 3: retention removed events the consumer had not read; rebuild, then rerun with --bootstrap.\n',
    )
    .action(action(lazy(() => import('./commands/tail.js'), 'tailCommand')));

  root
    .command('prune')
    .description('delete events older than the retention (only at or below safe_seq)')
    .option('--once', 'one pass')
    .option('--retention <duration>', 'delete events older than this', '7d')
    .option('--allow-short-retention', 'accept a retention below 1h')
    .option('--json', 'print the result as JSON')
    .addHelpText('after', examples(['npx tidemark prune --once --retention 3d']) + DURATIONS)
    .action(action(lazy(() => import('./commands/prune.js'), 'pruneCommand')));

  root
    .command('status')
    .description('safe_seq, lag, lease, streams and consumers')
    .option('--json', 'JSON output')
    .addHelpText('after', examples(['npx tidemark status', 'npx tidemark status --json --schema tidemark_demo']))
    .action(action(lazy(() => import('./commands/status.js'), 'statusCommand')));

  const cursor = root.command('cursor').description('list, set or delete durable cursors (a consumer\'s position in a stream)');
  cursor
    .command('list')
    .description('every cursor: consumer, stream, seq, lag in events and seconds, last commit, the session holding it')
    .option('--json', 'JSON output')
    .addHelpText('after', examples(['npx tidemark cursor list', 'npx tidemark cursor list --json']))
    .action(action(lazy(() => import('./commands/cursor.js'), 'cursorListCommand')));
  cursor
    .command('set')
    .description('move a cursor (creating it for a new consumer); refused while a consumer holds it')
    .requiredOption('--consumer <name>', 'consumer name')
    .requiredOption('--stream <name>', 'stream')
    .requiredOption('--to <seq|now|start>', 'a seq, now (safe_seq: skip what is published) or start (the retention floor: replay what is kept)')
    .option('--json', 'JSON output')
    .addHelpText(
      'after',
      examples(['npx tidemark cursor set --consumer audit --stream orders --to now', 'npx tidemark cursor set --consumer audit --stream orders --to 1200']),
    )
    .action(action(lazy(() => import('./commands/cursor.js'), 'cursorSetCommand')));
  cursor
    .command('delete')
    .description('delete a cursor; refused while a consumer holds it')
    .requiredOption('--consumer <name>', 'consumer name')
    .requiredOption('--stream <name>', 'stream')
    .option('--json', 'JSON output')
    .addHelpText('after', examples(['npx tidemark cursor delete --consumer audit --stream orders']))
    .action(action(lazy(() => import('./commands/cursor.js'), 'cursorDeleteCommand')));

  const group = root.command('group').description("manage consumer groups (tail --partitions N): change a group's partition count");
  group
    .command('repartition')
    .description("change a group's partition count: the old split reads up to a barrier seq (safe_seq now), and once it has applied everything up to there, every partition of the new split starts there; each event once, each key in order. Running members follow; members started later give the new count")
    .requiredOption('--consumer <name>', "the group's consumer name")
    .requiredOption('--stream <name>', 'stream')
    .requiredOption('--partitions <n>', 'the new count (1-1024); the current count cancels a pending re-partition')
    .option('--no-wait', 'record the barrier and exit; the old split stops there until this command is run again (without --no-wait) to switch')
    .option('--no-partition-index', "neither create the new count's partition index nor drop the old one")
    .option('--json', 'JSON output')
    .addHelpText('after', examples(['npx tidemark group repartition --consumer mailer --stream orders --partitions 32']))
    .action(action(lazy(() => import('./commands/group.js'), 'groupRepartitionCommand')));

  const deadLetters = root
    .command('dead-letters')
    .description("list, replay or discard dead letters: events a consumer set aside after its handler's last try");
  deadLetters
    .command('list')
    .description('dead letters by consumer, stream and seq: key, kind, tries, when, whether a replay is asked for, the last error')
    .option('--consumer <name>', 'only this consumer\'s')
    .option('--stream <name>', 'only this stream\'s (with --consumer)')
    .option('--json', 'JSON output (every field, payload and headers as PostgreSQL\'s text)')
    .addHelpText('after', examples(['npx tidemark dead-letters list', 'npx tidemark dead-letters list --consumer billing --json']))
    .action(action(lazy(() => import('./commands/dead-letters.js'), 'deadLettersListCommand')));
  deadLetters
    .command('replay')
    .description("ask for a replay: the consumer's own tail (with the dead-letter policy) delivers the event to its handler again and deletes the dead letter in that transaction")
    .argument('[ids...]', 'dead letter ids, as list shows them')
    .option('--all', 'every dead letter of --consumer (and --stream)')
    .option('--consumer <name>', 'with --all, or to restrict the ids')
    .option('--stream <name>', 'with --consumer')
    .option('--json', 'JSON output')
    .addHelpText('after', examples(['npx tidemark dead-letters replay 12 13', 'npx tidemark dead-letters replay --all --consumer billing']))
    .action(actionWithArgs(lazy(() => import('./commands/dead-letters.js'), 'deadLettersReplayCommand')));
  deadLetters
    .command('discard')
    .description('delete dead letters: their events stay skipped')
    .argument('[ids...]', 'dead letter ids, as list shows them')
    .option('--all', 'every dead letter of --consumer (and --stream)')
    .option('--consumer <name>', 'with --all, or to restrict the ids')
    .option('--stream <name>', 'with --consumer')
    .option('--json', 'JSON output')
    .addHelpText('after', examples(['npx tidemark dead-letters discard 12', 'npx tidemark dead-letters discard --all --consumer billing --stream orders']))
    .action(actionWithArgs(lazy(() => import('./commands/dead-letters.js'), 'deadLettersDiscardCommand')));

  root
    .command('demo')
    .description('live demo: watermarker, concurrent writers with real gaps, a consumer, and a verdict')
    .option('--duration <duration>', 'how long writers write', '10s')
    .option('--writers <n>', 'concurrent writers', '4')
    .addHelpText('after', examples(['npx tidemark demo', 'npx tidemark demo --duration 30s --writers 8']) + DURATIONS)
    .action(action(lazy(() => import('./commands/demo.js'), 'demoCommand'), 'tidemark_demo'));

  return root;
}
