import type pg from 'pg';

/**
 * Checks a connection out of `pool`, giving up when `signal` aborts. A
 * connection that arrives after the caller gave up goes straight back, so an
 * abort while the pool is exhausted never leaks one.
 */
export async function acquire(pool: pg.Pool, signal?: AbortSignal): Promise<pg.PoolClient> {
  signal?.throwIfAborted();
  const pending = pool.connect();
  if (!signal) return pending;
  let onAbort: (() => void) | undefined;
  const aborted = new Promise<never>((_, reject) => {
    onAbort = () => reject(signal.reason);
    signal.addEventListener('abort', onAbort, { once: true });
  });
  try {
    return await Promise.race([pending, aborted]);
  } catch (err) {
    pending.then((client) => client.release(), () => undefined);
    throw err;
  } finally {
    signal.removeEventListener('abort', onAbort!);
  }
}

/** Resolves after `ms`, or rejects with the abort reason. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal!.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}
