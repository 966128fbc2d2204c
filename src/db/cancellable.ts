import pg from 'pg';
import { NoResponseError, withDeadline } from './deadline.js';

/**
 * Runs one statement on its own pooled connection and cancels it on the
 * server (pg_cancel_backend, sent over a fresh connection so an exhausted
 * pool cannot delay it) when `signal` aborts. The pooled connection is
 * released only after the cancel request has finished, so a late cancel can
 * never hit the next user of that connection.
 */
export async function cancellableQuery(
  pool: pg.Pool,
  text: string,
  values: unknown[],
  signal?: AbortSignal,
  boundMs?: number,
): Promise<pg.QueryResult> {
  signal?.throwIfAborted();
  const client = await pool.connect();
  // A checked-out client has no error listener of the pool's: without one, a
  // connection that dies under the query (a server restart) would crash the
  // process. The query's own rejection carries the failure.
  const ignore = () => undefined;
  client.on('error', ignore);
  let cancelling: Promise<void> | undefined;
  const onAbort = () => {
    cancelling = cancelBackend(pool, (client as unknown as { processID: number }).processID);
  };
  signal?.addEventListener('abort', onAbort, { once: true });
  let broken: Error | undefined;
  try {
    const run = () => client.query(text, values);
    return await (boundMs === undefined ? run() : withDeadline(client, boundMs, 'a tidemark statement', run));
  } catch (err) {
    if (!(typeof err === 'object' && err !== null && 'code' in err) || err instanceof NoResponseError) broken = err as Error;
    throw err;
  } finally {
    signal?.removeEventListener('abort', onAbort);
    if (cancelling) await cancelling;
    client.off('error', ignore);
    client.release(broken);
  }
}

/** Cancels backend `pid`'s statement (pg_cancel_backend over a fresh connection); best effort, never throws. */
export async function cancelBackend(pool: pg.Pool, pid: number): Promise<void> {
  const options = (pool as unknown as { options: pg.ClientConfig }).options;
  const client = new pg.Client({ ...options, application_name: 'tidemark-cancel' });
  client.on('error', () => undefined);
  try {
    await client.connect();
    await client.query('SELECT pg_catalog.pg_cancel_backend($1::integer)', [pid]);
  } catch {
    // Best effort: the statement still ends by itself (it is bounded).
  } finally {
    await client.end().catch(() => undefined);
  }
}
