/** One goal from the issue, with what this run measured. */
export interface Goal {
  goal: string;
  target: string;
  measured: string;
  /** null when the run could not measure it (a contender unavailable, a --quick run). */
  met: boolean | null;
}

export type Cell = string | number | null;

/** What one scenario reports: a table, notes, goals, and raw data for the JSON. */
export interface ScenarioResult {
  id: string;
  title: string;
  /** How it was measured, in one or two sentences. */
  method: string;
  columns: string[];
  rows: Cell[][];
  notes: string[];
  goals: Goal[];
  elapsedMs: number;
}

export interface BenchReport {
  date: string;
  command: string;
  quick: boolean;
  machine: { cpus: number; node: string; platform: string };
  postgres: Record<string, string>;
  contenders: { id: string; title: string; kind: string; notes: string[]; unavailable?: string }[];
  scenarios: ScenarioResult[];
  elapsedMs: number;
}

/** The middle value (the mean of the two middle ones for an even count). */
export function median(values: readonly number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  const mid = Math.floor(sorted.length / 2);
  return sorted.length % 2 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2;
}

/** A ratio for a goal's figure: three decimals, or four when three would round it across the target. */
export function ratioText(value: number, target: number): string {
  const short = value.toFixed(3);
  return (Number(short) >= target) === (value >= target) ? short : value.toFixed(4);
}

export function fmt(value: number | null | undefined, digits = 2): string {
  if (value === null || value === undefined || Number.isNaN(value)) return '-';
  if (!Number.isFinite(value)) return '∞';
  if (Math.abs(value) >= 1000) return Math.round(value).toLocaleString('en-US');
  return value.toFixed(digits);
}

function cell(c: Cell): string {
  if (c === null) return '-';
  if (typeof c === 'number') return Number.isInteger(c) ? c.toLocaleString('en-US') : fmt(c);
  return c.replaceAll('|', '\\|');
}

export function markdownTable(columns: string[], rows: Cell[][]): string {
  const lines = [`| ${columns.join(' | ')} |`, `|${columns.map((_, i) => (i === 0 ? '---' : '---:')).join('|')}|`];
  for (const row of rows) lines.push(`| ${row.map(cell).join(' | ')} |`);
  return lines.join('\n');
}

export function goalsTable(goals: Goal[]): string {
  return markdownTable(
    ['goal', 'target', 'measured', 'met'],
    goals.map((g) => [g.goal, g.target, g.measured, g.met === null ? 'not measured' : g.met ? 'yes' : 'no']),
  );
}

/** The whole report as markdown. */
export function renderMarkdown(report: BenchReport): string {
  const out: string[] = [];
  out.push(`# tidemark bench, ${report.date}${report.quick ? ' (--quick: smoke run, figures not meaningful)' : ''}`);
  out.push('');
  out.push(`Command: \`${report.command}\`. ${report.machine.cpus} CPUs, Node ${report.machine.node}, PostgreSQL ${report.postgres.server_version ?? '?'}.`);
  out.push(
    `PostgreSQL settings: ${Object.entries(report.postgres)
      .filter(([k]) => k !== 'server_version')
      .map(([k, v]) => `${k}=${v}`)
      .join(', ')}. Total ${(report.elapsedMs / 1000).toFixed(0)} s.`,
  );
  out.push('');
  out.push('## Goals');
  out.push('');
  out.push(goalsTable(report.scenarios.flatMap((s) => s.goals)));
  out.push('');
  out.push('## Contenders');
  out.push('');
  for (const c of report.contenders) {
    out.push(`- **${c.title}** (${c.kind})${c.unavailable ? `: **could not run**: ${c.unavailable}` : ''}${c.notes.length ? `. ${c.notes.join('; ')}` : ''}`);
  }
  for (const s of report.scenarios) {
    out.push('');
    out.push(`## ${s.title}`);
    out.push('');
    out.push(s.method);
    out.push('');
    out.push(markdownTable(s.columns, s.rows));
    for (const note of s.notes) out.push(`\n${note}`);
  }
  out.push('');
  return out.join('\n');
}
