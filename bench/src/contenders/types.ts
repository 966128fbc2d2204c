import type pg from 'pg';

/** One event of the benchmark load: a unique id and its entity key (one key per writer). */
export interface BenchEvent {
  id: number;
  key: string;
  /** The contender's sequence number, where it has one the bench looks at (tidemark's latency breakdown). */
  seq?: bigint;
}

/** How one writer transaction behaves. */
export interface WriteOptions {
  /** Keep the transaction open this long before the events go in (after the application's own write). */
  holdBeforeMs?: number;
  /** Keep the transaction open this long after the events are in. */
  holdMs?: number;
  /** Roll back instead of committing. */
  rollback?: boolean;
  /** Record the ids in bench_committed in the same transaction (the gap checker's ground truth). */
  record?: boolean;
}

/** One connection's worth of writing: each call is one transaction. */
export interface Writer {
  write(events: BenchEvent[], options?: WriteOptions): Promise<void>;
  close(): Promise<void>;
}

/** Something with a node-postgres `query`, open in the handler's transaction when the contender has one. */
export interface BenchTx {
  query(text: string, values?: unknown[]): Promise<unknown>;
}

export type BatchHandler = (tx: BenchTx, events: BenchEvent[]) => Promise<void>;

export interface ConsumeOptions {
  /** The durable cursor's name. */
  name: string;
  batchSize: number;
  signal: AbortSignal;
}

/** A running background component (a watermarker), stopped by `stop`. */
export interface Service {
  stop(): Promise<void>;
}

export type ContenderKind = 'tidemark' | 'npm' | 'baseline';

export interface Contender {
  id: string;
  title: string;
  kind: ContenderKind;
  /** What the reader must know next to the row (known upstream defects, what the adapter re-implements). */
  notes: string[];
  /** Creates the contender's schema in a fresh database. */
  install(pool: pg.Pool): Promise<void>;
  /** The table `append cost` compares against: an identical, unfenced copy. Returns the INSERT for n rows of it. */
  plainTable(pool: pg.Pool): Promise<PlainInsert>;
  /** Background machinery the contender needs for delivery (a watermarker). */
  services?(url: string): Promise<Service>;
  writer(url: string): Promise<Writer>;
  /** Runs a consumer until `signal` aborts; `handler` runs in the contender's delivery transaction. */
  consume(url: string, handler: BatchHandler, options: ConsumeOptions): Promise<void>;
}

/** Inserts `events` into the plain comparison table, as one statement. */
export type PlainInsert = (client: pg.ClientBase, events: BenchEvent[]) => Promise<void>;

/** Thrown by an adapter whose package is not installed or cannot run here. */
export class ContenderUnavailable extends Error {}
