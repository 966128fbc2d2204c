import type pg from 'pg';
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';
import type { ConsumerEvent } from '../consumer/events.js';
import type { PruneResult } from '../retention/pruner.js';
import type { WatermarkProgress } from '../watermark/progress.js';
import { readStatus } from './status.js';

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
  watermarkObserver: (progress: WatermarkProgress) => void;
  /** Pass as `Watermarker` option `onError`. */
  watermarkError: (err: unknown) => void;
  /** Pass as `Pruner` option `observer`. */
  pruneObserver: (result: PruneResult) => void;
  /** Pass as `StreamClient` option `observer`. */
  consumerObserver: (event: ConsumerEvent) => void;
}

const FENCE_BUCKETS = [0.00005, 0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25];

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
  const up = new Gauge({ name: 'tidemark_database_up', help: '1 when the last scrape could read the database.', registers, collect: () => refresh() });

  const steps = new Counter({ name: 'tidemark_watermark_steps_total', help: 'Watermark steps by outcome.', labelNames: ['outcome'], registers });
  const stepErrors = new Counter({ name: 'tidemark_watermark_step_errors_total', help: 'Steps, heartbeats or notifies that failed.', registers });
  const fenceTimeouts = new Counter({ name: 'tidemark_fence_timeouts_total', help: 'Bounded fence waits that timed out.', labelNames: ['role'], registers });
  const fenceWait = new Histogram({ name: 'tidemark_fence_wait_seconds', help: 'Wait for the exclusive fence, measured on the server.', labelNames: ['role'], buckets: FENCE_BUCKETS, registers });
  const fenceHold = new Histogram({ name: 'tidemark_fence_hold_seconds', help: 'Exclusive fence hold (grant to publication), measured on the server.', labelNames: ['role'], buckets: FENCE_BUCKETS, registers });
  const leader = new Gauge({ name: 'tidemark_watermarker_leader', help: '1 while this process holds the watermarker lease.', registers });
  const pruned = new Counter({ name: 'tidemark_pruned_events_total', help: 'Events deleted by retention in this process.', registers });
  const delivered = new Counter({ name: 'tidemark_delivered_events_total', help: 'Events delivered by this process.', labelNames: ['consumer', 'stream'], registers });
  const listenerErrors = new Counter({ name: 'tidemark_listener_errors_total', help: 'LISTEN connection failures (polling continues).', registers });

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
        up.set(1);
      } catch {
        up.set(0);
      }
    })().finally(() => setTimeout(() => (reading = undefined), 0)));

  return {
    registry,
    watermarkObserver(progress) {
      steps.inc({ outcome: progress.outcome });
      leader.set(progress.leader ? 1 : 0);
      if (progress.fenceTimedOut) fenceTimeouts.inc({ role: 'watermarker' });
      if (progress.outcome === 'advanced' || progress.fenceTimedOut) fenceWait.observe({ role: 'watermarker' }, progress.fenceWaitMs / 1000);
      if (progress.outcome === 'advanced') fenceHold.observe({ role: 'watermarker' }, progress.fenceHoldMs / 1000);
    },
    watermarkError() {
      stepErrors.inc();
    },
    pruneObserver(result) {
      pruned.inc(result.deleted);
    },
    consumerObserver(event) {
      if (event.type === 'page' && event.delivered > 0) delivered.inc({ consumer: event.consumer, stream: event.stream }, event.delivered);
      if (event.type === 'listener:error') listenerErrors.inc();
    },
  };
}
