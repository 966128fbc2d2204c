import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { setTimeout as sleep } from 'node:timers/promises';
import type pg from 'pg';
import { StreamClient, Watermarker } from 'tidemark';
import { benchPool } from '../db.js';
import type { BenchContext } from '../context.js';
import { fmt, ratioText, type Cell, type Goal, type ScenarioResult } from '../report.js';
import { tidemarkContender } from '../contenders/tidemark.js';
import { messageDbContender } from '../contenders/message-db.js';
import { cursorLoop } from '../contenders/common.js';

const KEYS = 500;
const HANDLER_MS = 5;
const BATCH = 20;
const PARTITIONS = 16;
const MEMBERS = 4;
/** The lease of the members measured here: beats every third of it. */
const LEASE_MS = 2000;

/**
 * Consumer groups: a backlog handled by a 5 ms handler (a call to another
 * service), by one consumer, by a group of four members on 16 partitions
 * (one page at a time each, then four), and by a Message DB consumer group
 * of four (`get_category_messages` with `consumer_group_member`/`size`, the
 * position kept in the handler's transaction as in the other scenarios).
 * Each side starts from the beginning of the same backlog under a consumer
 * name of its own, and is timed over one window once its members hold
 * their share. Then the rebalance: a member that is a `tidemark tail
 * --partitions` process is SIGKILLed while events flow, and the time until
 * each of its partitions moves again under another member is measured.
 */
export async function groupsScenario(ctx: BenchContext): Promise<ScenarioResult> {
  const t0 = performance.now();
  const backlog = ctx.pick(8_000, 60_000);
  const windowMs = ctx.pick(2_000, 10_000);
  const rows: Cell[][] = [];
  const goals: Goal[] = [];
  const notes: string[] = [];
  const url = await ctx.server.freshDatabase('groups');
  const pool = benchPool(url, 4);
  const rates = new Map<string, number>();
  try {
    await tidemarkContender().install(pool);
    ctx.progress.step(`groups: preloading ${backlog.toLocaleString('en-US')} events`);
    await pool.query(
      `INSERT INTO tidemark.events (stream, kind, key, payload) SELECT 'bench', 'e', 'k' || (g % ${KEYS}), jsonb_build_object('id', g) FROM generate_series(1, $1::int) g`,
      [backlog],
    );
    await pool.query(`SELECT tidemark.partition_index_ddl(${PARTITIONS}) AS ddl`).then((r) => pool.query(r.rows[0].ddl));
    await pool.query('VACUUM ANALYZE tidemark.events');
    await new Watermarker(pool, { owner: 'bench' }).step();

    // The consumers' pools, ended after each side.
    const pools: pg.Pool[] = [];
    const consumerPool = (max: number) => {
      const p = benchPool(url, max, 'tidemark-bench-consumer');
      pools.push(p);
      return p;
    };
    const handled = { n: 0 };
    const handler = async () => {
      await sleep(HANDLER_MS);
      handled.n += 1;
    };
    /** Runs `start` until the window ends; returns events/s over the window, timed from `ready`. */
    const timed = async (side: string, start: (signal: AbortSignal) => Promise<() => Promise<boolean>>) => {
      ctx.progress.step(`groups: ${side}`);
      const stop = new AbortController();
      const ready = await start(stop.signal);
      const deadline = performance.now() + 30_000;
      while (!(await ready()) && performance.now() < deadline) await sleep(20);
      handled.n = 0;
      const from = performance.now();
      await sleep(windowMs);
      const events = handled.n;
      const rate = (events / (performance.now() - from)) * 1000;
      stop.abort();
      await sleep(HANDLER_MS * BATCH + 500);
      await Promise.all(pools.splice(0).map((p) => p.end().catch(() => undefined)));
      rates.set(side, rate);
      return rate;
    };

    const single = await timed('tidemark, one consumer', async (signal) => {
      const client = new StreamClient(consumerPool(3), { batchSize: BATCH });
      void client.tail('single', 'bench', handler, { signal }).catch(() => undefined);
      signal.addEventListener('abort', () => void client.close(), { once: true });
      return async () => handled.n > 0;
    });
    rows.push(['tidemark', 'one consumer', 1, fmt(single, 0), '1.00', null]);

    for (const concurrency of [1, 4]) {
      const side = `tidemark, group of ${MEMBERS} (concurrency ${concurrency})`;
      const held = new Map<string, number>();
      const rate = await timed(side, async (signal) => {
        for (let m = 0; m < MEMBERS; m += 1) {
          const member = `m${m}`;
          const client = new StreamClient(consumerPool(concurrency + 3), {
            batchSize: BATCH,
            observer: (e) => e.type === 'group:assignment' && held.set(e.member, e.partitions.length),
          });
          void client
            .tailGroup(`group-${concurrency}`, 'bench', handler, { partitions: PARTITIONS, member, concurrency, leaseTtlMs: LEASE_MS, signal })
            .catch(() => undefined);
          signal.addEventListener('abort', () => void client.close(), { once: true });
        }
        return async () => held.size === MEMBERS && [...held.values()].every((n) => n === PARTITIONS / MEMBERS);
      });
      rows.push(['tidemark', `group of ${MEMBERS}, ${PARTITIONS} partitions, concurrency ${concurrency}`, MEMBERS * concurrency, fmt(rate, 0), fmt(rate / single, 2), null]);
    }

    if (ctx.contenders.some((c) => c.id === 'message-db')) {
      const mdbUrl = await ctx.server.freshDatabase('groups-mdb');
      const mdb = benchPool(mdbUrl, 2);
      try {
        await messageDbContender.install(mdb);
        await mdb.query(
          `SELECT message_store.write_message(gen_random_uuid()::text, 'bench-k' || (g % ${KEYS}), 'E', jsonb_build_object('id', g)) FROM generate_series(1, $1::int) g`,
          [backlog],
        );
        const rate = await timed(`Message DB, consumer group of ${MEMBERS}`, async (signal) => {
          for (let m = 0; m < MEMBERS; m += 1) {
            void cursorLoop(mdbUrl, async (_tx, events) => {
              for (const _ of events) await handler();
            }, { name: `mdb-${m}`, batchSize: BATCH, signal, initial: [0n, 1n] }, async (tx, [, position], limit) => {
              const r = await tx.query('SELECT global_position FROM message_store.get_category_messages($1, $2, $3, NULL, $4, $5)', ['bench', position, limit, m, MEMBERS]);
              const last = r.rows[r.rows.length - 1];
              return { events: r.rows.map((row) => ({ id: Number(row.global_position), key: '' })), next: [0n, last ? BigInt(last.global_position) + 1n : position] };
            }).catch(() => undefined);
          }
          return async () => handled.n > 0;
        });
        rows.push(['message-db', `consumer group of ${MEMBERS} (consumer_group_member/size)`, MEMBERS, fmt(rate, 0), fmt(rate / single, 2), null]);
      } finally {
        await mdb.end();
      }
    }

    const group1 = rates.get(`tidemark, group of ${MEMBERS} (concurrency 1)`)!;
    const group4 = rates.get(`tidemark, group of ${MEMBERS} (concurrency 4)`)!;
    const mdbRate = rates.get(`Message DB, consumer group of ${MEMBERS}`);
    goals.push({ goal: `groups: ${MEMBERS} members / one consumer, ${HANDLER_MS} ms handler`, target: '>= 3.5', measured: `${ratioText(group1 / single, 3.5)} (one page at a time a member); ${fmt(group4 / single, 2)} at concurrency 4`, met: ctx.quick ? null : group1 / single >= 3.5 });
    goals.push({
      goal: `groups: ${MEMBERS} members on ${PARTITIONS} partitions / Message DB consumer group of ${MEMBERS}`,
      target: '>= 1.0',
      measured: mdbRate === undefined ? 'Message DB not run' : `${ratioText(group1 / mdbRate, 1)} (one page at a time a member)`,
      met: ctx.quick || mdbRate === undefined ? null : group1 / mdbRate >= 1,
    });

    // The rebalance, with events flowing: three members here, the fourth a CLI process that is SIGKILLed.
    ctx.progress.step('groups: rebalance after SIGKILL');
    const rebalance = await rebalanceAfterKill(url, pool);
    rows.push(['tidemark', `rebalance: SIGKILL of 1 of ${MEMBERS} members, lease ${LEASE_MS} ms`, MEMBERS, null, null, fmt(rebalance.worstMs, 0)]);
    notes.push(`Rebalance: the killed member held partitions ${rebalance.partitions.join(', ')}; each moved again under another member after ${rebalance.perPartitionMs.map((ms) => fmt(ms, 0)).join(', ')} ms (lease ${LEASE_MS} ms: its lease ends 2/3 to 3/3 of it after its last beat, and the live members beat again as it ends).`);
    goals.push({ goal: 'groups: SIGKILL of a member -> its partitions flowing again', target: `<= lease + 1 s (${LEASE_MS + 1000} ms)`, measured: `${fmt(rebalance.worstMs, 0)} ms`, met: ctx.quick ? null : rebalance.worstMs <= LEASE_MS + 1000 });
  } finally {
    await pool.end();
  }
  return {
    id: 'groups',
    title: 'Consumer groups',
    method: `A backlog of ${backlog.toLocaleString('en-US')} events over ${KEYS} keys, each handled by a ${HANDLER_MS} ms handler (pages of ${BATCH}); each side from the start of the backlog, timed over ${windowMs / 1000} s once every member holds its share. Then a member that is a tidemark tail --partitions process is SIGKILLed while 400 events/s flow.`,
    columns: ['contender', 'shape', 'handlers at once', 'events/s', 'vs one consumer', 'rebalance ms'],
    rows,
    notes,
    goals,
    elapsedMs: performance.now() - t0,
  };
}

/** Three in-process members and one CLI member of a group over a stream fed at 400 events/s; SIGKILLs the CLI one once the split is even. */
async function rebalanceAfterKill(url: string, pool: pg.Pool): Promise<{ partitions: number[]; perPartitionMs: number[]; worstMs: number }> {
  // The repository's CLI, as the relay scenario runs it.
  const bin = fileURLToPath(new URL('../../../bin/tidemark.js', import.meta.url));
  const stop = new AbortController();
  const watermarker = new Watermarker(benchPool(url, 3, 'tidemark-bench-watermarker'), { owner: 'bench-groups' });
  const watermarking = watermarker.run(stop.signal).catch(() => undefined);
  const writing = (async () => {
    let i = 0;
    while (!stop.signal.aborted) {
      await pool.query(
        `INSERT INTO tidemark.events (stream, kind, key, payload) SELECT 'live', 'e', 'k' || (g % ${KEYS}), jsonb_build_object('id', g) FROM generate_series($1::int, $2::int) g`,
        [i, i + 3],
      );
      i += 4;
      await sleep(10);
    }
  })().catch(() => undefined);
  const clients: StreamClient[] = [];
  const pools: pg.Pool[] = [];
  for (let m = 0; m < MEMBERS - 1; m += 1) {
    const memberPool = benchPool(url, 7, 'tidemark-bench-consumer');
    pools.push(memberPool);
    const client = new StreamClient(memberPool, { batchSize: BATCH });
    clients.push(client);
    void client.tailGroup('rebalance', 'live', async () => undefined, { partitions: PARTITIONS, member: `m${m}`, leaseTtlMs: LEASE_MS, signal: stop.signal }).catch(() => undefined);
  }
  const victim = spawn(process.execPath, [bin, 'tail', '--consumer', 'rebalance', '--stream', 'live', '--partitions', String(PARTITIONS), '--member', 'victim', '--lease', `${LEASE_MS}ms`, '--json'], {
    env: { ...process.env, DATABASE_URL: url },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  victim.stdout!.resume(); // read and dropped (tail refuses a stdout nobody reads)
  let victimErr = '';
  victim.stderr!.on('data', (d: Buffer) => (victimErr = (victimErr + d.toString()).slice(-2000)));
  try {
    const holders = async () => (await pool.query<{ partition: number; holder: string | null; seq: string }>(`SELECT partition, holder, seq FROM tidemark.partition_cursors WHERE consumer = 'rebalance' ORDER BY partition`)).rows;
    const deadline = performance.now() + 60_000;
    let mine: { partition: number; seq: string }[] = [];
    for (;;) {
      const rows = await holders();
      const counts = new Map<string | null, number>();
      for (const r of rows) counts.set(r.holder, (counts.get(r.holder) ?? 0) + 1);
      if (rows.length === PARTITIONS && counts.size === MEMBERS && [...counts.values()].every((n) => n === PARTITIONS / MEMBERS) && counts.has('victim')) {
        mine = rows.filter((r) => r.holder === 'victim');
        break;
      }
      if (performance.now() > deadline) throw new Error(`the group's split did not settle: ${rows.map((r) => `${r.partition}:${r.holder}`).join(' ')}; the CLI member said: ${victimErr}`);
      await sleep(50);
    }
    await sleep(1000); // flowing under the victim
    const at = new Map((await holders()).map((r) => [r.partition, r.seq]));
    const killedAt = performance.now();
    victim.kill('SIGKILL');
    const moved = new Map<number, number>();
    while (moved.size < mine.length && performance.now() < killedAt + 60_000) {
      for (const r of await holders()) {
        if (mine.some((x) => x.partition === r.partition) && !moved.has(r.partition) && r.holder !== 'victim' && r.holder !== null && BigInt(r.seq) > BigInt(at.get(r.partition)!)) {
          moved.set(r.partition, performance.now() - killedAt);
        }
      }
      await sleep(10);
    }
    const perPartitionMs = mine.map((x) => moved.get(x.partition) ?? Number.NaN);
    return { partitions: mine.map((x) => x.partition), perPartitionMs, worstMs: Math.max(...perPartitionMs) };
  } finally {
    victim.kill('SIGKILL');
    stop.abort();
    await Promise.all([writing, watermarking, ...clients.map((c) => c.close())]);
    await watermarker.close();
    await Promise.all(pools.map((p) => p.end().catch(() => undefined)));
  }
}
