import type pg from 'pg';

/**
 * The server gave no answer to a statement of tidemark's own within its
 * bound: the connection is treated as dead (a half-open path, a stalled
 * server) and was destroyed. Carries the socket code `ETIMEDOUT`, so
 * `isRetryable` counts it as a connection failure.
 */
export class NoResponseError extends Error {
  readonly code = 'ETIMEDOUT';
  readonly syscall = 'read';

  constructor(what: string, ms: number) {
    super(`${what}: no answer from the server within ${ms} ms; the connection was dropped`);
    this.name = 'NoResponseError';
  }
}

/**
 * Runs `run` (statements on `client`) with a deadline. When `ms` passes
 * first, the client's socket is destroyed, so the statement in flight fails
 * at once and the connection can never be reused, and `run` rejects with a
 * {@link NoResponseError}. This is how tidemark notices a connection that
 * stopped answering without closing: TCP keepalive alone can take minutes.
 * The bound is on tidemark's own statements, never on a handler's.
 */
export async function withDeadline<T>(client: pg.ClientBase, ms: number, what: string, run: () => Promise<T>): Promise<T> {
  let expired = false;
  const timer = setTimeout(() => {
    expired = true;
    destroySocket(client);
  }, ms);
  try {
    return await run();
  } catch (err) {
    if (expired) throw new NoResponseError(what, ms);
    throw err;
  } finally {
    clearTimeout(timer);
  }
}

/** Destroys the client's socket: every statement in flight fails, and the client emits `error`/`end`. */
export function destroySocket(client: pg.ClientBase): void {
  const stream = (client as unknown as { connection?: { stream?: { destroy(err?: Error): void } } }).connection?.stream;
  stream?.destroy();
}

/**
 * One statement on its own pooled connection, answered within `ms` or the
 * connection is destroyed ({@link NoResponseError}). A connection whose
 * statement failed without a SQLSTATE is destroyed, not reused. `types`
 * parses its columns instead of pg's global parsers.
 */
export async function boundedQuery<R extends pg.QueryResultRow = pg.QueryResultRow>(
  pool: pg.Pool,
  ms: number,
  what: string,
  text: string,
  values?: unknown[],
  types?: pg.CustomTypesConfig,
): Promise<pg.QueryResult<R>> {
  const client = await pool.connect();
  const ignore = () => undefined; // the query's own rejection carries the failure
  client.on('error', ignore);
  let broken: Error | undefined;
  try {
    return await withDeadline(client, ms, what, () => client.query<R>({ text, values, types }));
  } catch (err) {
    if (!(typeof err === 'object' && err !== null && 'code' in err) || err instanceof NoResponseError) broken = err as Error;
    throw err;
  } finally {
    client.off('error', ignore);
    client.release(broken);
  }
}
