import pg from 'pg';
import { recordDelivered } from '../checker.js';
import { installedDatabase, settle, type BenchContext } from '../context.js';
import { Histogram } from '../histogram.js';
import { epochMs, runLoad, takeIds } from '../load.js';
import { ratioText, type ScenarioResult } from '../report.js';
import type { Contender, Service, Writer } from '../contenders/types.js';

const PHASES = ['steady', 'idle writer, other database', 'long read-only snapshot', 'long outbox writer'] as const;
type Phase = (typeof PHASES)[number];

interface Probe {
  contender: Contender;
  url: string;
  pool: pg.Pool;
  services?: Service;
  stopConsumer: AbortController;
  consuming: Promise<void>;
  commits: Map<number, { at: number; phase: Phase }>;
  delivery: Map<Phase, Histogram>;
  writer: Map<Phase, Histogram>;
  undelivered: Map<Phase, number>;
  blocker?: { client?: pg.Client; writer?: Writer; done?: Promise<void> };
  /** The warm-up event's id; cleared once the consumer handled it. */
  warmUp?: number;
}

/**
 * A steady trickle of events per contender (all at once, each on its own
 * database) through four phases: steady; a transaction in another database
 * of the same cluster that wrote a row and idles; a long REPEATABLE READ
 * snapshot in the contender's database that only reads; a writer of the
 * contender's own events that keeps its transaction open. Per phase: commit
 * -> handler latency of events committed in it, and writer latency.
 */
export async function stallBlastRadius(ctx: BenchContext): Promise<ScenarioResult> {
  const t0 = performance.now();
  const phaseMs: Record<Phase, number> = {
    steady: ctx.pick(1000, 5000),
    'idle writer, other database': ctx.pick(2000, 30000),
    'long read-only snapshot': ctx.pick(1500, 20000),
    'long outbox writer': ctx.pick(1500, 20000),
  };
  ctx.progress.step('stall blast radius: setup');
  const otherUrl = await ctx.server.freshDatabase('stall_other');
  const other = new pg.Client({ connectionString: otherUrl, application_name: 'tidemark-bench-unrelated' });
  await other.connect();
  await other.query('CREATE TABLE unrelated (id int)');

  const probes: Probe[] = [];
  let warmUpNote: string | undefined;
  for (const contender of ctx.contenders) {
    const { url, pool } = await installedDatabase(ctx.server, contender, `stall_${contender.id}`);
    const probe: Probe = {
      contender,
      url,
      pool,
      services: await contender.services?.(url),
      stopConsumer: new AbortController(),
      consuming: Promise.resolve(),
      commits: new Map(),
      delivery: new Map(PHASES.map((p) => [p, new Histogram()])),
      writer: new Map(PHASES.map((p) => [p, new Histogram()])),
      undelivered: new Map(PHASES.map((p) => [p, 0])),
    };
    probe.consuming = contender
      .consume(
        url,
        async (tx, events) => {
          await recordDelivered(tx, 'c1', events);
          const now = epochMs();
          for (const e of events) {
            if (e.id === probe.warmUp) probe.warmUp = undefined;
            const c = probe.commits.get(e.id);
            if (!c) continue;
            probe.delivery.get(c.phase)!.recordMs(Math.max(0, now - c.at));
            probe.commits.delete(e.id);
          }
        },
        { name: 'c1', batchSize: 100, signal: probe.stopConsumer.signal },
      )
      .catch(() => undefined);
    probes.push(probe);
  }

  try {
    // Every contender's services and consumer are running and have
    // delivered one event before the steady phase starts: its latencies
    // are steady state, not ten contenders starting at once on one server.
    ctx.progress.step('stall blast radius: warm-up');
    for (const probe of probes) {
      const [id] = takeIds(1);
      probe.warmUp = id;
      const writer = await probe.contender.writer(probe.url);
      try {
        await writer.write([{ id: id!, key: 'warm-up' }]);
      } finally {
        await writer.close();
      }
    }
    const warm = await settle(
      async () => {
        const left = probes.filter((p) => p.warmUp !== undefined).length;
        return { done: left === 0, progress: left };
      },
      // The quick run (the smoke test) shares its server with the test
      // suite in CI, whose tests hold transactions open for seconds on
      // purpose: the xid-horizon contenders wait for every one of them.
      ctx.pick(15000, 10000),
      30000,
    );
    if (!warm) warmUpNote = `Not warmed up within the bound: ${probes.filter((p) => p.warmUp !== undefined).map((p) => p.contender.title).join(', ')}.`;
    await new Promise((r) => setTimeout(r, 1000));
    for (const phase of PHASES) {
      ctx.progress.step(`stall blast radius: ${phase}`);
      if (phase === 'idle writer, other database') {
        await other.query('BEGIN');
        await other.query('INSERT INTO unrelated VALUES (1)');
      }
      for (const probe of probes) {
        if (phase === 'long read-only snapshot') {
          const client = new pg.Client({ connectionString: probe.url, application_name: 'tidemark-bench-report' });
          await client.connect();
          await client.query('BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY');
          await client.query('SELECT count(*) FROM pg_class');
          probe.blocker = { client };
        }
        if (phase === 'long outbox writer') {
          const writer = await probe.contender.writer(probe.url);
          const done = writer.write([{ id: 1e12 + 1, key: 'long' }], { holdMs: phaseMs[phase] }).catch(() => undefined);
          probe.blocker = { writer, done };
        }
      }
      await Promise.all(
        probes.map(async (probe) => {
          const load = await runLoad(probe.contender, probe.url, {
            writers: 2,
            durationMs: phaseMs[phase],
            txPerSec: 50,
            keyPrefix: `${phase.slice(0, 4)}-`,
            onCommit: (events, at) => {
              for (const e of events) probe.commits.set(e.id, { at, phase });
            },
          });
          probe.writer.get(phase)!.merge(load.latency);
        }),
      );
      if (phase === 'idle writer, other database') await other.query('ROLLBACK');
      for (const probe of probes) {
        await probe.blocker?.client?.query('COMMIT');
        await probe.blocker?.client?.end();
        await probe.blocker?.done;
        await probe.blocker?.writer?.close();
        probe.blocker = undefined;
      }
    }
    ctx.progress.step('stall blast radius: draining');
    await settle(
      async () => {
        const left = probes.reduce((n, p) => n + p.commits.size, 0);
        return { done: left === 0, progress: left };
      },
      ctx.pick(2000, 5000),
      ctx.pick(8000, 30000),
    );
    for (const probe of probes) for (const c of probe.commits.values()) probe.undelivered.set(c.phase, probe.undelivered.get(c.phase)! + 1);
  } finally {
    await other.end().catch(() => undefined);
    for (const probe of probes) {
      probe.stopConsumer.abort();
      await probe.consuming;
      await probe.services?.stop();
      await probe.pool.end();
    }
  }

  const rows = probes.flatMap((p) =>
    PHASES.map((phase) => {
      const d = p.delivery.get(phase)!.summary();
      const w = p.writer.get(phase)!.summary();
      return [p.contender.title, phase, d.max, d.p99, p.undelivered.get(phase)!, w.p99, w.max];
    }),
  );
  const tm = probes.find((p) => p.contender.id === 'tidemark');
  const tmWriterSteady = tm?.writer.get('steady')!.summary();
  const tmWriterLong = tm?.writer.get('long outbox writer')!.summary();
  const tmOther = tm?.delivery.get('idle writer, other database')!.summary();
  const tmSnap = tm?.delivery.get('long read-only snapshot')!.summary();
  return {
    id: 'stall',
    title: '2. Stall blast radius',
    method:
      `Two writers per contender at 50 transactions/s in all; phases of ${PHASES.map((p) => `${p} ${phaseMs[p] / 1000} s`).join(', ')}. ` +
      'The idle writer is one transaction in another database of the same cluster; the snapshot and the long writer are in each contender\'s own database. ' +
      'Latency is from COMMIT returning to the handler running, for events committed in the phase; "never delivered" counts events of the phase still undelivered after the drain. ' +
      'All contenders run at once, so every one sees the same blockers at the same moments. Before the steady phase each contender delivers one warm-up event (not measured), then 1 s passes: ' +
      'the steady phase measures running consumers, not their start-up.',
    columns: ['contender', 'phase', 'longest commit→handler ms', 'p99 commit→handler ms', 'never delivered', 'writer p99 ms', 'writer max ms'],
    rows,
    notes: warmUpNote ? [warmUpNote] : [],
    goals: tm
      ? [
          {
            goal: 'stall: tidemark unaffected by an idle writer in another database (longest commit→handler)',
            target: 'well under the idle time',
            measured: `${tmOther?.max.toFixed(1)} ms against ${phaseMs['idle writer, other database'] / 1000} s idle`,
            met: (tmOther?.max ?? Infinity) < phaseMs['idle writer, other database'] / 4,
          },
          {
            goal: 'stall: tidemark unaffected by a long read-only snapshot (longest commit→handler)',
            target: 'well under the snapshot time',
            measured: `${tmSnap?.max.toFixed(1)} ms against ${phaseMs['long read-only snapshot'] / 1000} s`,
            met: (tmSnap?.max ?? Infinity) < phaseMs['long read-only snapshot'] / 4,
          },
          {
            goal: 'stall: tidemark writer p99 during a long outbox writer / steady phase',
            target: '<= 1.5',
            measured: ratioText(tmWriterLong!.p99 / tmWriterSteady!.p99, 1.5),
            met: tmWriterLong!.p99 / tmWriterSteady!.p99 <= 1.5,
          },
        ]
      : [],
    elapsedMs: performance.now() - t0,
  };
}
