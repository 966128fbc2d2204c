import type pg from 'pg';
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';
import type { ConsumerEvent } from '../consumer/events.js';
import type { PruneResult } from '../retention/options.js';
import type { RelayEvent } from '../relay/events.js';
import type { Relay } from '../relay/relay.js';
import { stepBucketMs, type WatermarkerEvent } from '../watermark/progress.js';
import { readStatus } from './status.js';
import { InvalidOptionsError } from '../errors.js';
import { checkKnownOptions } from '../options.js';

/** Options for {@link createMetrics}. */
export interface MetricsOptions {
  /** Pool used at scrape time to read safe_seq, lag, horizons and cursors. */
  pool: pg.Pool;
  /** Schema holding tidemark's tables. Default `tidemark`. */
  schema?: string;
  /** Registry to register in. Default: a new one. */
  registry?: Registry;
  /** Also export Node process metrics (CPU, memory, event loop). Default true. */
  processMetrics?: boolean;
}

/** Prometheus metrics for a tidemark process; wire its observers into the components you run. */
export interface TidemarkMetrics {
  /** The prom-client registry: serve `await registry.metrics()` with `registry.contentType`. */
  registry: Registry;
  /** Pass as `Watermarker` option `observer`. */
  watermarkObserver: (event: WatermarkerEvent) => void;
  /** Pass as `Watermarker` option `onError`. */
  watermarkError: (err: unknown) => void;
  /** Pass as `Pruner` option `observer`. */
  pruneObserver: (result: PruneResult) => void;
  /** Pass as `Pruner` option `onError`: counts failed passes (each retried after a back-off). */
  pruneError: (err: unknown) => void;
  /** Pass as `StreamClient` option `observer`. */
  consumerObserver: (event: ConsumerEvent) => void;
  /** Pass as `Relay` option `observer`. */
  relayObserver: (event: RelayEvent) => void;
  /** Exports `relay`'s lag (events and seconds per stream, read from the database at scrape time). */
  trackRelay: (relay: Relay) => void;
}

const STEP_BUCKETS = [0.00002, 0.00005, 0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25];

/**
 * Creates tidemark's Prometheus metrics. Counters and histograms are fed by
 * the observers; gauges of database state (safe_seq, max seq, watermark
 * lag, lease, horizons, cursor lag) are read at scrape time, so any process
 * (even one running no component) exports them. A failed read sets
 * `tidemark_database_up` to 0 and leaves the other metrics scrapeable.
 *
 * @example
 * const metrics = createMetrics({ pool });
 * const watermarker = new Watermarker(pool, { observer: metrics.watermarkObserver });
 * // GET /metrics -> await metrics.registry.metrics()
 */
export function createMetrics(options: MetricsOptions): TidemarkMetrics {
  if (typeof options !== 'object' || options === null) throw new InvalidOptionsError('options', `expected an object, got ${String(options)}`);
  checkKnownOptions(options, { pool: true, schema: true, registry: true, processMetrics: true } satisfies Record<keyof MetricsOptions, true>, 'createMetrics');
  const registry = options.registry ?? new Registry();
  const schema = options.schema ?? 'tidemark';
  if (options.processMetrics ?? true) collectDefaultMetrics({ register: registry });
  const registers = [registry];

  const safeSeq = new Gauge({ name: 'tidemark_safe_seq', help: 'Published safe_seq (the tidemark).', registers, collect: () => refresh() });
  const maxSeq = new Gauge({ name: 'tidemark_max_seq', help: 'Greatest visible event seq.', registers, collect: () => refresh() });
  const lagEvents = new Gauge({ name: 'tidemark_watermark_lag_events', help: 'max_seq - safe_seq.', registers, collect: () => refresh() });
  const lagSeconds = new Gauge({ name: 'tidemark_watermark_lag_seconds', help: 'Seconds since safe_seq last advanced while events wait above it.', registers, collect: () => refresh() });
  const leaseLive = new Gauge({ name: 'tidemark_lease_live', help: '1 when some watermarker holds a live lease.', registers, collect: () => refresh() });
  const horizon = new Gauge({ name: 'tidemark_horizon_seq', help: 'Greatest seq removed by retention, per stream.', labelNames: ['stream'], registers, collect: () => refresh() });
  const cursorSeq = new Gauge({ name: 'tidemark_consumer_cursor_seq', help: 'Cursor position.', labelNames: ['consumer', 'stream'], registers, collect: () => refresh() });
  const cursorLag = new Gauge({ name: 'tidemark_consumer_lag_events', help: 'Events at or below safe_seq not yet delivered.', labelNames: ['consumer', 'stream'], registers, collect: () => refresh() });
  const resyncs = new Gauge({ name: 'tidemark_consumer_resyncs', help: 'Resyncs recorded on the cursor.', labelNames: ['consumer', 'stream'], registers, collect: () => refresh() });
  const groupLag = new Gauge({ name: 'tidemark_group_lag_events', help: 'Events at or below safe_seq a consumer group has not delivered, over its partitions.', labelNames: ['consumer', 'stream'], registers, collect: () => refresh() });
  const groupMoves = new Gauge({ name: 'tidemark_group_partition_moves', help: 'Times the partitions of a consumer group changed hands (rebalances), since it was created.', labelNames: ['consumer', 'stream'], registers, collect: () => refresh() });
  const groupUnheld = new Gauge({ name: 'tidemark_group_partitions_unheld', help: 'Partitions of a consumer group with no holder under a live lease.', labelNames: ['consumer', 'stream'], registers, collect: () => refresh() });
  const partitionLag = new Gauge({ name: 'tidemark_group_partition_lag_events', help: 'Events at or below safe_seq of one partition of a consumer group not yet delivered.', labelNames: ['consumer', 'stream', 'partition'], registers, collect: () => refresh() });
  const up = new Gauge({ name: 'tidemark_database_up', help: '1 when the last scrape could read the database.', registers, collect: () => refresh() });
  // A role that may not read a part (streams, cursors, the blocking
  // writers) gets no series of it: this says so, rather than leaving alerts
  // on those series silent.
  const visible = new Gauge({
    name: 'tidemark_status_visible',
    help: '1 when the metrics role may read this part of the status (streams, consumers, blocking_writers); 0: its series are absent.',
    labelNames: ['part'],
    registers,
    collect: () => refresh(),
  });
  const blocking = new Gauge({ name: 'tidemark_watermark_blocking_writers', help: 'Writers in flight that safe_seq waits for.', registers, collect: () => refresh() });
  const blockerAge = new Gauge({
    name: 'tidemark_watermark_oldest_blocker_seconds',
    help: 'Transaction age of the oldest writer safe_seq waits for (0 when none).',
    registers,
    collect: () => refresh(),
  });

  const steps = new Counter({ name: 'tidemark_watermark_steps_total', help: 'Watermark steps by outcome.', labelNames: ['outcome'], registers });
  const stepErrors = new Counter({ name: 'tidemark_watermark_step_errors_total', help: 'Steps, heartbeats or notifies that failed.', registers });
  const stepSeconds = new Histogram({ name: 'tidemark_watermark_step_seconds', help: 'Watermark step time (to its COMMIT), measured on the server.', buckets: STEP_BUCKETS, registers });
  const holderReads = new Counter({ name: 'tidemark_watermark_holder_reads_total', help: 'How steps learned the writers in flight: path try_lock or pg_locks.', labelNames: ['path'], registers });
  const lockReadSeconds = new Counter({
    name: 'tidemark_watermark_pg_locks_read_seconds_total',
    help: 'Server time of the steps\' pg_locks reads (each holds every lock-manager partition meanwhile).',
    registers,
  });
  const retries = new Counter({ name: 'tidemark_watermarker_retries_total', help: 'Failed runs of the watermark loop, each retried after a back-off.', registers });
  const wakeups = new Counter({
    name: 'tidemark_watermarker_wakeups_total',
    help: "Ends of the idle loop's sleeps, by cause: notified (a writer's wake-up), timeout (summaryIntervalMs without one) or closed (its connection ended).",
    labelNames: ['cause'],
    registers,
  });
  // The lease as last reported, valid until leaderUntil by this process's clock: with
  // no news from the server (an outage), the gauge drops to 0 before a standby can take over.
  let leaderUntil: Date | null = null;
  const leader: Gauge = new Gauge({
    name: 'tidemark_watermarker_leader',
    help: '1 while this process holds the watermarker lease (as of its last step or loop summary, until that lease could expire).',
    registers,
    collect(): void {
      leader.set(leaderUntil !== null && Date.now() < leaderUntil.getTime() ? 1 : 0);
    },
  });
  const consumerRetries = new Counter({
    name: 'tidemark_consumer_retries_total',
    help: 'Tails that failed with a retryable error and went on after a back-off.',
    labelNames: ['consumer', 'stream'],
    registers,
  });
  const handlerRetries = new Counter({
    name: 'tidemark_consumer_handler_retries_total',
    help: 'Events tried again alone after their handler failed (the failures option).',
    labelNames: ['consumer', 'stream'],
    registers,
  });
  const deadLetters = new Counter({
    name: 'tidemark_consumer_dead_letters_total',
    help: 'Events set aside as dead letters after their last try, by this process.',
    labelNames: ['consumer', 'stream'],
    registers,
  });
  const pruneErrors = new Counter({ name: 'tidemark_pruner_errors_total', help: 'Prune passes that failed, each retried after a back-off.', registers });
  const pruned = new Counter({ name: 'tidemark_pruned_events_total', help: 'Events deleted by retention in this process.', registers });
  const delivered = new Counter({ name: 'tidemark_delivered_events_total', help: 'Events delivered by this process.', labelNames: ['consumer', 'stream'], registers });
  const listenerErrors = new Counter({ name: 'tidemark_listener_errors_total', help: 'LISTEN connection failures (polling continues).', registers });

  const relayPublished = new Counter({ name: 'tidemark_relay_published_events_total', help: 'Events the broker acknowledged (the cursor commit follows; after a failed commit they are published, and counted, again).', labelNames: ['stream'], registers });
  const relayFailed = new Counter({ name: 'tidemark_relay_failed_events_total', help: 'Events in pages the broker did not acknowledge (each page is published again or stops the relay).', labelNames: ['stream'], registers });
  const relayRetries = new Counter({ name: 'tidemark_relay_retries_total', help: 'Relay failures retried after a back-off, by source: sink (the broker) or database.', labelNames: ['stream', 'source'], registers });
  const relayAck = new Histogram({ name: 'tidemark_relay_ack_seconds', help: 'Time from sending a page to the broker to its last acknowledgement.', buckets: [0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10], registers });
  const relaySinkUp = new Gauge({ name: 'tidemark_relay_sink_up', help: '1 while the relay\'s broker takes its publishes; 0 from a failure until the next success.', registers });
  const relays: Relay[] = [];
  const readRelayLag = async (): Promise<void> => {
    relayLagEvents.reset();
    relayLagSeconds.reset();
    for (const relay of relays) {
      try {
        for (const lag of await relay.lag()) {
          relayLagEvents.set({ stream: lag.stream }, lag.events);
          relayLagSeconds.set({ stream: lag.stream }, lag.seconds);
        }
      } catch {
        // The database is down: tidemark_database_up says so; the lag is unknown.
      }
    }
  };
  let relayLagReading: Promise<void> | undefined;
  const refreshRelayLag = (): Promise<void> => (relayLagReading ??= readRelayLag().finally(() => setTimeout(() => (relayLagReading = undefined), 0)));
  const relayLagEvents = new Gauge({ name: 'tidemark_relay_lag_events', help: 'Events at or below safe_seq the relay has not published yet.', labelNames: ['stream'], registers, collect: () => refreshRelayLag() });
  const relayLagSeconds = new Gauge({ name: 'tidemark_relay_lag_seconds', help: 'Age of the oldest event at or below safe_seq the relay has not published yet (0 when none).', labelNames: ['stream'], registers, collect: () => refreshRelayLag() });

  // Database gauges are read once per scrape, by the first of them that
  // prom-client collects (it awaits each gauge's async collect()).
  let reading: Promise<void> | undefined;
  const refresh = (): Promise<void> =>
    (reading ??= (async () => {
      try {
        const status = await readStatus(options.pool, schema, { streamCounts: false });
        safeSeq.set(Number(status.safeSeq));
        maxSeq.set(Number(status.maxSeq ?? 0n));
        lagEvents.set(Number(status.lagEvents));
        lagSeconds.set(status.lagSeconds);
        leaseLive.set(status.lease.live ? 1 : 0);
        blocking.set(status.blockingWriters.length);
        blockerAge.set(Math.max(0, ...status.blockingWriters.map((b) => b.ageSeconds ?? 0)));
        horizon.reset();
        for (const h of status.streams) horizon.set({ stream: h.stream }, Number(h.prunedThroughSeq));
        cursorSeq.reset();
        cursorLag.reset();
        resyncs.reset();
        for (const c of status.consumers) {
          const labels = { consumer: c.consumer, stream: c.stream };
          cursorSeq.set(labels, Number(c.seq));
          cursorLag.set(labels, c.lagEvents);
          resyncs.set(labels, c.resyncCount);
        }
        for (const gauge of [groupLag, groupMoves, groupUnheld, partitionLag]) gauge.reset();
        for (const g of status.groups) {
          const labels = { consumer: g.consumer, stream: g.stream };
          groupLag.inc(labels, g.lagEvents);
          groupMoves.inc(labels, g.moves);
          groupUnheld.inc(labels, g.holderLive ? 0 : 1);
          partitionLag.set({ ...labels, partition: String(g.partition) }, g.lagEvents);
        }
        visible.set({ part: 'streams' }, status.streamsVisible ? 1 : 0);
        visible.set({ part: 'consumers' }, status.consumersVisible ? 1 : 0);
        visible.set({ part: 'blocking_writers' }, status.blockingWritersVisible ? 1 : 0);
        up.set(1);
      } catch {
        up.set(0);
      }
    })().finally(() => setTimeout(() => (reading = undefined), 0)));

  return {
    registry,
    watermarkObserver(event) {
      if (event.type === 'step') {
        const p = event.progress;
        steps.inc({ outcome: p.outcome });
        leaderUntil = p.leaderUntil;
        if (p.holderPath) holderReads.inc({ path: p.holderPath });
        if (p.holderReadMs !== null) lockReadSeconds.inc(p.holderReadMs / 1000);
        if (p.outcome !== 'not_leader') stepSeconds.observe(p.stepMs / 1000);
      } else if (event.type === 'run') {
        const r = event.summary;
        leaderUntil = r.leaderUntil;
        const outcomes = { advanced: r.advanced, pending: r.pending, idle: r.idle };
        for (const [outcome, n] of Object.entries(outcomes)) if (n > 0) steps.inc({ outcome }, n);
        if (r.tryLockReads > 0) holderReads.inc({ path: 'try_lock' }, r.tryLockReads);
        if (r.pgLocksReads > 0) holderReads.inc({ path: 'pg_locks' }, r.pgLocksReads);
        if (r.pgLocksReadMsTotal > 0) lockReadSeconds.inc(r.pgLocksReadMsTotal / 1000);
        // The run reports log buckets; each step is counted at its bucket's middle.
        for (const [i, n] of r.stepHistogram.entries()) for (let k = 0; k < n; k += 1) stepSeconds.observe(stepBucketMs(i) / 1000);
      } else if (event.type === 'wake') {
        wakeups.inc({ cause: event.cause });
      } else {
        leaderUntil = null;
        retries.inc();
      }
    },
    watermarkError() {
      stepErrors.inc();
    },
    pruneObserver(result) {
      pruned.inc(result.deleted);
    },
    pruneError() {
      pruneErrors.inc();
    },
    consumerObserver(event) {
      if (event.type === 'page' && event.delivered > 0) delivered.inc({ consumer: event.consumer, stream: event.stream }, event.delivered);
      if (event.type === 'listener:error') listenerErrors.inc();
      if (event.type === 'retry') consumerRetries.inc({ consumer: event.consumer, stream: event.stream });
      if (event.type === 'handler:retry') handlerRetries.inc({ consumer: event.consumer, stream: event.stream });
      if (event.type === 'dead-letter') deadLetters.inc({ consumer: event.consumer, stream: event.stream });
    },
    relayObserver(event) {
      if (event.type === 'published') {
        relayPublished.inc({ stream: event.stream }, event.count);
        relayAck.observe(event.ackMs / 1000);
        relaySinkUp.set(1);
      } else if (event.type === 'open') {
        relaySinkUp.set(1);
      } else if (event.type === 'failed') {
        relayFailed.inc({ stream: event.stream }, event.count);
        relaySinkUp.set(0);
      } else if (event.type === 'retry') {
        relayRetries.inc({ stream: event.stream, source: event.source });
        if (event.source === 'sink') relaySinkUp.set(0);
      }
    },
    trackRelay(relay) {
      relays.push(relay);
    },
  };
}
