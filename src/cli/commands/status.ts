import { readStatus, type TidemarkStatus } from '../../observability/status.js';
import { json, openDatabase, type GlobalOptions } from '../context.js';
import { shellWord } from '../shell-word.js';

/** Columns padded to their widest cell, two spaces apart. */
export function table(headers: string[], rows: string[][]): string {
  const widths = headers.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i]!.length)));
  const line = (cells: string[]) => cells.map((c, i) => c.padEnd(widths[i]!)).join('  ').trimEnd();
  return [line(headers), ...rows.map(line)].join('\n');
}

/** The writers safe_seq waits for, or nothing when none holds it back. */
function blockingLines(s: TidemarkStatus): string[] {
  if (!s.blockingWritersVisible) return ['the writers safe_seq may wait for: visible to the schema owner only', ''];
  const writers = s.blockingWriters;
  if (writers.length === 0) return [];
  const since = writers[0]!.waitingSince;
  return [
    `safe_seq waits for ${writers.length} writer${writers.length === 1 ? '' : 's'} to finish (seq ${writers[0]!.pendingSeq} pending since ${since.toISOString()}):`,
    table(
      ['pid', 'application', 'client', 'xact age', 'state', 'query'],
      writers.map((w) => [
        w.pid === null ? `prepared ${JSON.stringify(w.preparedGid)}` : String(w.pid),
        w.applicationName ?? '-',
        w.clientAddr ?? (w.pid === null ? '-' : 'local'),
        w.ageSeconds === null ? '-' : `${w.ageSeconds.toFixed(1)} s`,
        w.state ?? '-',
        (w.query ?? '-').replace(/\s+/g, ' ').slice(0, 60),
      ]),
    ),
    '',
  ];
}

/** The streams with their horizons, or why this role sees none. */
function streamsTable(s: TidemarkStatus): string {
  if (!s.streamsVisible) return 'streams: visible to the schema owner and consumer roles only';
  if (s.streams.length === 0) return '(no streams)';
  return table(['stream', 'events', 'max seq', 'pruned through'], s.streams.map((r) => [r.stream, String(r.events), String(r.maxSeq ?? '-'), String(r.prunedThroughSeq)]));
}

/** The cursors this role may see, or why it sees none. */
function consumersTable(s: TidemarkStatus): string {
  if (!s.consumersVisible) return 'consumers: visible to the schema owner and consumer roles only';
  if (s.consumers.length === 0) return '(no consumers)';
  return table(
    ['consumer', 'stream', 'cursor', 'lag', 'resyncs', 'updated'],
    s.consumers.map((c) => [c.consumer, c.stream, String(c.seq), String(c.lagEvents), String(c.resyncCount), c.updatedAt.toISOString()]),
  );
}

/** The partitions of the consumer groups, when there are any. */
function groupLines(s: TidemarkStatus): string[] {
  if (s.groups.length === 0) return [];
  return [
    '',
    table(
      ['group', 'stream', 'partition', 'holder', 'cursor', 'lag', 'moves', 'updated'],
      s.groups.map((g) => [
        g.consumer,
        g.stream,
        `${g.partition}/${g.partitions}`,
        g.holder === null ? '-' : g.holderLive ? g.holder : `${g.holder} (lease ended)`,
        String(g.seq),
        String(g.lagEvents),
        String(g.moves),
        g.updatedAt.toISOString(),
      ]),
    ),
    ...s.repartitions.map(
      (r) =>
        `re-partition pending: ${r.consumer} on ${r.stream}, ${r.partitions} -> ${r.nextPartitions} partitions at seq ${r.barrier}; the pages read up to there until \`tidemark group repartition --consumer ${shellWord(r.consumer)} --stream ${shellWord(r.stream)} --partitions ${r.nextPartitions}\` switches`,
    ),
  ];
}

/** Renders a status as the readable report `tidemark status` prints. */
export function renderStatus(s: TidemarkStatus): string {
  const lease = s.lease.owner ? `${s.lease.owner} (${s.lease.live ? `until ${s.lease.expiresAt!.toISOString()}` : 'expired'})` : 'none';
  const out = [
    `schema     ${s.schema}`,
    `safe_seq   ${s.safeSeq}`,
    `max seq    ${s.maxSeq ?? '-'}`,
    `lag        ${s.lagEvents} events, ${s.lagSeconds.toFixed(1)} s`,
    `lease      ${lease}`,
    '',
    ...blockingLines(s),
    streamsTable(s),
    '',
    consumersTable(s),
    ...groupLines(s),
  ];
  return out.join('\n');
}

/**
 * The shape of `status --json` (README, "Command line"): every seq and
 * every count of events (`safeSeq`, `maxSeq`, `lagEvents`, a stream's
 * `events`, a cursor's or a group partition's `seq` and `lagEvents`,
 * `pendingSeq`) is a decimal
 * string, since seqs are bigints and may pass 2^53; durations and ages
 * (`lagSeconds`, `ageSeconds`) and small counts (`resyncCount`, `pid`) are
 * numbers; times are ISO 8601 strings.
 */
export function statusJson(s: TidemarkStatus): string {
  return json({
    ...s,
    consumers: s.consumers.map((c) => ({ ...c, lagEvents: BigInt(c.lagEvents) })),
    groups: s.groups.map((g) => ({ ...g, lagEvents: BigInt(g.lagEvents) })),
  });
}

/** `tidemark status [--json]`. */
export async function statusCommand(options: GlobalOptions & { json?: boolean }): Promise<number> {
  const db = await openDatabase(options);
  try {
    const status = await readStatus(db.pool, options.schema);
    console.log(options.json ? statusJson(status) : renderStatus(status));
    return 0;
  } finally {
    await db.close();
  }
}
