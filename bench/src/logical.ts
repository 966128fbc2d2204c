/**
 * The physical limit of commit -> consumer latency on one PostgreSQL: a
 * logical replication slot (test_decoding) streamed over the replication
 * protocol, as `pg_recvlogical` does. It needs a server with
 * `wal_level=logical`, so it gets one of its own (the embedded package),
 * whatever server the rest of the bench uses.
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Duplex } from 'node:stream';
import pg from 'pg';
import * as copyStreams from 'pg-copy-streams';

type CopyBoth = (text: string, options?: { alignOnCopyDataFrame?: boolean }) => Duplex & pg.Submittable;
/** pg-copy-streams' copy-both stream (its published types name only `to` and `from`). */
const both = (copyStreams as unknown as { both: CopyBoth }).both;

export interface LogicalServer {
  url: string;
  stop(): Promise<void>;
}

/** A throwaway embedded server with `wal_level=logical`. */
export async function startLogicalServer(): Promise<LogicalServer> {
  const { startEmbeddedPostgres } = await import('tidemark/embedded');
  const dataDir = await mkdtemp(join(tmpdir(), 'tidemark-bench-logical-'));
  try {
    const server = await startEmbeddedPostgres({ dataDir, ephemeral: true, settings: { wal_level: 'logical', max_wal_senders: 4, max_replication_slots: 4 } });
    return {
      url: server.url,
      stop: async () => {
        await server.stop();
        await rm(dataDir, { recursive: true, force: true });
      },
    };
  } catch (err) {
    await rm(dataDir, { recursive: true, force: true });
    throw err;
  }
}

/** Microseconds between the Unix epoch and PostgreSQL's (2000-01-01). */
const PG_EPOCH_US = 946_684_800_000_000n;

/**
 * Streams the slot's changes from its creation on and calls `onInsert` with
 * each inserted row's text as test_decoding prints it, as the message
 * arrives. The slot is created here, so every change after this resolves
 * is streamed.
 */
export async function streamInserts(url: string, slot: string, onInsert: (row: string) => void): Promise<{ close: () => Promise<void> }> {
  const admin = new pg.Client({ connectionString: url });
  await admin.connect();
  try {
    await admin.query("SELECT pg_create_logical_replication_slot($1, 'test_decoding')", [slot]);
  } finally {
    await admin.end();
  }
  const client = new pg.Client({ connectionString: url, replication: 'database' } as pg.ClientConfig);
  await client.connect();
  const stream = client.query(both(`START_REPLICATION SLOT ${slot} LOGICAL 0/0 ("include-xids" '0', "skip-empty-xacts" '1')`, { alignOnCopyDataFrame: true }));
  let flushed = 0n;
  // Standby status update: the position applied, so the server may recycle WAL.
  const status = (replyRequested: boolean) => {
    const b = Buffer.alloc(34);
    b.write('r', 0);
    b.writeBigUInt64BE(flushed, 1);
    b.writeBigUInt64BE(flushed, 9);
    b.writeBigUInt64BE(flushed, 17);
    b.writeBigInt64BE(BigInt(Date.now()) * 1000n - PG_EPOCH_US, 25);
    b.writeUInt8(replyRequested ? 1 : 0, 33);
    stream.write(b);
  };
  stream.on('data', (chunk: Buffer) => {
    if (chunk[0] === 0x77) {
      // XLogData: 'w', start LSN, end LSN, send time, then the plugin's text.
      const end = chunk.readBigUInt64BE(9);
      if (end > flushed) flushed = end;
      const text = chunk.toString('utf8', 25);
      if (text.startsWith('table ') && text.includes(': INSERT: ')) onInsert(text);
    } else if (chunk[0] === 0x6b) {
      // Keepalive: 'k', end LSN, time, reply requested.
      const end = chunk.readBigUInt64BE(1);
      if (end > flushed) flushed = end;
      if (chunk[17] === 1) status(false);
    }
  });
  const failed = new Promise<void>((resolve) => stream.once('error', () => resolve()));
  const timer = setInterval(() => status(false), 1000);
  return {
    close: async () => {
      clearInterval(timer);
      // Ending the connection ends the stream; its error then is expected.
      stream.on('error', () => undefined);
      await Promise.race([client.end().catch(() => undefined), failed]);
    },
  };
}
