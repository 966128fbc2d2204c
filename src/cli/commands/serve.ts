import { createServer, type Server } from 'node:http';
import { Pruner } from '../../retention/pruner.js';
import { resolvePrunerOptions, type PrunerOptions } from '../../retention/options.js';
import { Watermarker } from '../../watermark/watermarker.js';
import { resolveWatermarkerOptions, type WatermarkerOptions } from '../../watermark/options.js';
import { createMetrics } from '../../observability/metrics.js';
import { configured, openDatabase, positiveInt, type GlobalOptions } from '../context.js';
import { CliError, EXIT } from '../cli-error.js';
import { explain } from '../explain.js';
import { parseDuration } from '../duration.js';
import { Relay } from '../../relay/relay.js';
import { refusedAs } from './cursor.js';
import { setCursor } from '../../consumer/cursors.js';
import { DEFAULT_SCHEMA, quoteIdent } from '../../db/queryable.js';
import { isRetryable, ResyncRequiredError, sqlState } from '../../errors.js';
import { relaySetup, type RelayFlags, type RelaySetup } from './relay.js';
import { shellWord } from '../shell-word.js';

export interface ServeCommandOptions extends GlobalOptions, RelayFlags {
  roles: string;
  http?: string;
  owner?: string;
  leaseTtl?: string;
  maxStepsPerSecond?: string;
  leaseRenew?: string;
  retention?: string;
  pruneInterval?: string;
  allowShortRetention?: boolean;
  shutdownTimeout: string;
}

const ROLES = ['watermarker', 'pruner', 'relay'] as const;
type Role = (typeof ROLES)[number];

function parseRoles(text: string): Set<Role> {
  const roles = new Set<Role>();
  for (const name of text.split(',').map((r) => r.trim())) {
    if (!(ROLES as readonly string[]).includes(name)) throw new CliError(`--roles: unknown role ${JSON.stringify(name)}; expected some of ${ROLES.join(', ')}`);
    roles.add(name as Role);
  }
  return roles;
}

function parseListen(text: string): { host: string; port: number } {
  const match = /^(.+):(\d{1,5})$/.exec(text);
  const port = Number(match?.[2]);
  if (!match || port > 65_535) throw new CliError(`--http: expected HOST:PORT, e.g. 127.0.0.1:9464, got ${JSON.stringify(text)}`);
  return { host: match[1]!.replace(/^\[(.*)\]$/, '$1'), port };
}

/** `tidemark relay`: `serve` with the relay role alone. */
export async function relayCommand(options: ServeCommandOptions): Promise<number> {
  return serveCommand({ ...options, roles: 'relay' }, 'relay');
}

/**
 * `tidemark serve --roles watermarker,pruner,relay [--http HOST:PORT]`: the
 * daemon. Several processes may run the same roles; the lease keeps one
 * watermarker active, the cursor one relay per (consumer, stream).
 * SIGINT/SIGTERM stop the loops (the relay finishes the acknowledgements in
 * flight and commits its cursor), release the lease and exit 0, or exit 1
 * if that takes longer than `--shutdown-timeout`. A relay error that
 * retrying cannot fix (a message the broker can never take, a resync)
 * stops every role and exits with that error's code.
 */
export async function serveCommand(options: ServeCommandOptions, command = 'serve'): Promise<number> {
  // Everything is validated before connecting.
  const roles = parseRoles(options.roles);
  const listen = options.http ? parseListen(options.http) : undefined;
  const shutdownMs = parseDuration(options.shutdownTimeout, '--shutdown-timeout');
  const watermarkerOptions: WatermarkerOptions = {
    schema: options.schema,
    owner: options.owner,
    leaseTtlMs: parseDuration(options.leaseTtl ?? '10s', '--lease-ttl'),
    leaseRenewMs: options.leaseRenew === undefined ? undefined : parseDuration(options.leaseRenew, '--lease-renew'),
    maxStepsPerSecond: options.maxStepsPerSecond === undefined ? undefined : positiveInt(options.maxStepsPerSecond, '--max-steps-per-second'),
  };
  const prunerOptions: PrunerOptions = {
    schema: options.schema,
    owner: options.owner,
    retentionMs: parseDuration(options.retention ?? '7d', '--retention'),
    intervalMs: parseDuration(options.pruneInterval ?? '1m', '--prune-interval'),
    allowShortRetention: options.allowShortRetention ?? false,
  };
  if (roles.has('watermarker')) configured(() => resolveWatermarkerOptions(watermarkerOptions));
  if (roles.has('pruner')) configured(() => resolvePrunerOptions(prunerOptions));
  const relaying: RelaySetup | undefined = roles.has('relay') ? await relaySetup(options, options.schema) : undefined;
  if (!relaying) {
    const given = (
      ['to', 'consumer', 'stream', 'subject', 'natsStream', 'createStream', 'exchange', 'routingKey', 'createExchange', 'from', 'webhookSecretFile', 'concurrency', 'webhookBatch', 'onRefused'] as const
    ).find((k) => options[k] !== undefined);
    if (given) throw new CliError(`--${given.replace(/[A-Z]/g, (c) => `-${c.toLowerCase()}`)}: applies to the relay role; add relay to --roles`);
  }

  const db = await openDatabase(options, 6 + 2 * (relaying?.options.streams.length ?? 0)); // a relayed stream: its page and its read ahead
  // What cannot pass by itself ends serve at start, with its exit code (a
  // database that does not exist, a login refused, a schema not migrated),
  // before a broker's stream is created; what can pass (the server down or
  // starting, a database not accepting connections for now: 55000) is
  // retried by the roles, as while running.
  try {
    await db.pool.query(`SELECT safe_seq FROM ${quoteIdent(options.schema)}.watermark`);
    // The newest object the watermarker needs (schema version 9): an older schema is "not migrated".
    if (roles.has('watermarker')) await db.pool.query(`SELECT 1 FROM ${quoteIdent(options.schema)}.owner_claims LIMIT 0`);
  } catch (err) {
    if (!isRetryable(err) && sqlState(err) !== '55000') {
      await db.close();
      throw err;
    }
  }
  // prom-client's process metrics sample the event loop every 10 ms: idle,
  // serve took 1.25-1.40% of a core with them and 0.55-0.75% without (20 s
  // each, this 2-core machine), for nobody when there is no /metrics.
  const metrics = createMetrics({ pool: db.pool, schema: options.schema, processMetrics: listen !== undefined });
  const stop = new AbortController();
  const health = {
    watermarker: { lastStepAt: 0, safeSeq: null as string | null },
    pruner: { lastRunAt: 0, lastError: null as string | null },
    relay: { sinkUp: false, lastError: null as string | null, lastPublishedAt: 0, cursors: {} as Record<string, string> },
  };
  const log = (message: string) => console.error(`tidemark ${command}: ${message}`);
  /** A role's lines name it, unless the command is that role alone (`tidemark relay: publishing to ...`, not `relay: relay: ...`). */
  const as = (role: string) => (command === role ? '' : `${role}: `);
  const oneLine = (err: unknown) => explain(err, { url: db.url, schema: options.schema }).message;
  let announced: boolean | undefined; // the leadership last logged

  const watermarker = roles.has('watermarker')
    ? new Watermarker(db.pool, {
        ...watermarkerOptions,
        observer: (event) => {
          metrics.watermarkObserver(event);
          if (event.type === 'retry') {
            log(`watermarker: ${oneLine(event.error)}; retrying in ${event.delayMs} ms`);
            announced = undefined; // announce the lease again once the loop is back
            return;
          }
          if (event.type === 'wake') return;
          const p = event.type === 'run' ? event.summary : event.progress;
          if (p.leader !== announced) log(p.leader ? 'watermarker lease acquired: active' : `watermarker standby (lease held by ${p.leaseOwner ?? 'nobody'})`);
          announced = p.leader;
          health.watermarker = { lastStepAt: Date.now(), safeSeq: p.safeSeq.toString() };
        },
        onError: (err) => {
          // A failed loop run is reported here and then as a retry event: log it once, there.
          metrics.watermarkError(err);
        },
      })
    : undefined;
  const pruner = roles.has('pruner')
    ? new Pruner(db.pool, {
        ...prunerOptions,
        observer: (result) => {
          metrics.pruneObserver(result);
          health.pruner = { lastRunAt: Date.now(), lastError: null };
        },
        onError: (err) => {
          health.pruner.lastError = oneLine(err);
          metrics.pruneError(err);
          log(`pruner: ${health.pruner.lastError}; retrying`);
        },
      })
    : undefined;

  const relay = relaying
    ? new Relay(db.pool, relaying.sink, {
        ...relaying.options,
        observer: (event) => {
          metrics.relayObserver(event);
          const h = health.relay;
          if (event.type === 'open') {
            h.sinkUp = true;
            h.lastError = null;
            log(`${as('relay')}publishing to ${event.description}`);
          } else if (event.type === 'published') {
            h.sinkUp = true;
            h.lastError = null;
            h.lastPublishedAt = Date.now();
            h.cursors[event.stream] = event.cursor.toString();
          } else if (event.type === 'retry') {
            if (event.source === 'sink') h.sinkUp = false;
            h.lastError = oneLine(event.error);
            log(`${as('relay')}${event.stream ? `stream ${JSON.stringify(event.stream)}: ` : ''}${h.lastError}; retrying ${event.seq === undefined ? '' : `seq ${event.seq} `}in ${event.delayMs} ms`);
          } else if (event.type === 'dead-letter') {
            log(`${as('relay')}stream ${JSON.stringify(event.stream)}: seq ${event.seq} refused (${oneLine(event.error)}); recorded as dead letter ${event.id}, going on`);
          } else if (event.type === 'dead-letter:replay') {
            log(`${as('relay')}stream ${JSON.stringify(event.stream)}: dead letter ${event.id} (seq ${event.seq}) ${event.error === undefined ? 'replayed: published' : `replay refused (${oneLine(event.error)}); it stays`}`);
          }
        },
        onError: (err) => log(`${as('relay')}${oneLine(err)}`),
      })
    : undefined;
  if (relay) {
    metrics.trackRelay(relay);
    // A stream not relayed before starts where --from says; one relayed
    // before goes on from its cursor. Done before the relay starts, or the
    // command fails: a --from not applied would relay from seq 0.
    if (relaying?.from !== undefined) {
      try {
        // Checked for every stream first: a seq refused for one creates no cursor for the others.
        for (const check of [true, false]) {
          for (const stream of relaying.options.streams) {
            await setCursor(db.pool, relaying.options.consumer, stream, relaying.from, { schema: options.schema, onlyIfNew: true, check }).catch(refusedAs('--from'));
          }
        }
      } catch (err) {
        await relay.close().catch(() => undefined);
        await db.close();
        throw err;
      }
    }
    // Fail fast on a broker that is misconfigured; one that is down is waited for (run retries).
    // `tidemark relay` (the relay alone) fails fast on both.
    try {
      await relay.open();
    } catch (err) {
      if (!isRetryable(err) || roles.size === 1) {
        await relay.close().catch(() => undefined);
        await db.close();
        throw err;
      }
      log(`${as('relay')}${oneLine(err)}; retrying`);
    }
  }

  const healthz = async () => {
    let database: { ok: boolean; error?: string } = { ok: true };
    try {
      await db.pool.query('SELECT 1');
    } catch (err) {
      database = { ok: false, error: oneLine(err) };
    }
    const body: Record<string, unknown> = { database };
    let ok = database.ok;
    if (watermarker) {
      const age = Date.now() - health.watermarker.lastStepAt;
      const healthy = age < watermarker.options.leaseTtlMs;
      ok &&= healthy;
      // leader: as of the last summary, and only until that lease could have expired.
      body.watermarker = { healthy, leader: watermarker.isLeader, lastStepAgoMs: age, safeSeq: health.watermarker.safeSeq, owner: watermarker.options.owner };
    }
    if (pruner) {
      const healthy = health.pruner.lastError === null;
      ok &&= healthy;
      body.pruner = { healthy, lastRunAgoMs: health.pruner.lastRunAt ? Date.now() - health.pruner.lastRunAt : null, lastError: health.pruner.lastError };
    }
    if (relay) {
      const h = health.relay;
      ok &&= h.sinkUp;
      body.relay = { healthy: h.sinkUp, sink: relay.sink.description, lastPublishedAgoMs: h.lastPublishedAt ? Date.now() - h.lastPublishedAt : null, cursors: h.cursors, lastError: h.lastError };
    }
    return { ok, body: { status: ok ? 'ok' : 'unhealthy', ...body } };
  };

  let server: Server | undefined;
  if (listen) {
    server = createServer((req, res) => {
      const path = (req.url ?? '/').split('?')[0];
      const respond = async () => {
        if (req.method === 'GET' && path === '/healthz') {
          const h = await healthz();
          res.writeHead(h.ok ? 200 : 503, { 'content-type': 'application/json' }).end(JSON.stringify(h.body));
        } else if (req.method === 'GET' && path === '/metrics') {
          res.writeHead(200, { 'content-type': metrics.registry.contentType }).end(await metrics.registry.metrics());
        } else {
          res.writeHead(404, { 'content-type': 'text/plain' }).end('not found: try /healthz or /metrics\n');
        }
      };
      respond().catch((err: unknown) => res.writeHead(500).end(String(err)));
    });
    await new Promise<void>((resolve, reject) => {
      server!.once('error', (err) => reject(new CliError(`--http: cannot listen on ${options.http}: ${err.message}`, EXIT.usage)));
      server!.listen(listen.port, listen.host, resolve);
    });
    const address = server.address();
    log(`http on ${typeof address === 'object' && address ? `${address.address}:${address.port}` : options.http} (/healthz, /metrics)`);
  }

  let fatal: { error: unknown } | undefined;
  let stopping!: () => void;
  const stopped = new Promise<void>((resolve) => (stopping = resolve));
  const relayRun = relay?.run(stop.signal).catch((err: unknown) => {
    fatal = { error: err instanceof ResyncRequiredError ? relayResync(err, options.schema) : err };
    log(`relay stopped: ${oneLine(err)}`);
    stopping();
  });
  // The watermarker refuses to run beside a live process with its owner
  // (OwnerInUseError, exit 2); it retries everything else by itself.
  const watermarkerRun = watermarker?.run(stop.signal).catch((err: unknown) => {
    fatal = { error: err }; // its one line is the exit's
    stopping();
  });
  const running = [watermarkerRun, pruner?.run(stop.signal), relayRun].filter(Boolean);
  log(`running ${[...roles].join(', ')}${watermarker ? ` as ${watermarker.options.owner}` : ''}`);
  const onSignal = (signal: string) => {
    log(`${signal}: stopping`);
    stopping();
  };
  const onSigint = () => onSignal('SIGINT');
  const onSigterm = () => onSignal('SIGTERM');
  process.once('SIGINT', onSigint);
  process.once('SIGTERM', onSigterm);
  await stopped;
  process.off('SIGINT', onSigint);
  process.off('SIGTERM', onSigterm);

  const deadline = setTimeout(() => {
    log(`shutdown took longer than ${shutdownMs} ms; exiting`);
    process.exit(1);
  }, shutdownMs);
  deadline.unref();
  stop.abort();
  await Promise.all(running);
  // Releases the lease: a standby takes over at once. With the database
  // unreachable the lease simply expires; that is no reason to fail.
  await watermarker?.close().catch((err: unknown) => log(`could not release the lease (${oneLine(err)}); it expires within ${watermarker.options.leaseTtlMs} ms`));
  await relay?.close().catch((err: unknown) => log(`${as('relay')}closing the broker connection failed (${oneLine(err)})`));
  await new Promise<void>((resolve) => {
    if (!server) return resolve();
    server.close(() => resolve());
    server.closeAllConnections(); // keep-alive scrapers must not hold the exit
  });
  await db.close();
  clearTimeout(deadline);
  if (fatal) throw fatal.error;
  log('stopped');
  return 0;
}

/**
 * A relay's resync in its own terms: unlike a projection, a relay cannot
 * rebuild from a snapshot; the events are gone from the database, and only
 * the operator can decide to go on without them.
 */
function relayResync(err: ResyncRequiredError, schema: string): CliError {
  return new CliError(
    `relay: retention removed events of stream ${JSON.stringify(err.stream)} through seq ${err.prunedThrough} before they were relayed ` +
      `(consumer ${JSON.stringify(err.consumer)} is at seq ${err.cursor}); they can no longer be published. Republish them from elsewhere if they matter; ` +
      `to go on without them: tidemark cursor set --consumer ${shellWord(err.consumer)} --stream ${shellWord(err.stream)} --to start${schema === DEFAULT_SCHEMA ? '' : ` --schema ${shellWord(schema)}`}`,
    EXIT.resync,
  );
}
