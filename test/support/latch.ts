/** A promise opened by hand: handlers await it to hold a page open at a chosen step. */
export interface Latch<T = void> {
  promise: Promise<T>;
  open(value: T): void;
  fail(err: unknown): void;
}

export function latch<T = void>(): Latch<T> {
  let open!: (value: T) => void;
  let fail!: (err: unknown) => void;
  const promise = new Promise<T>((resolve, reject) => {
    open = resolve;
    fail = reject;
  });
  return { promise, open, fail };
}

/** Records everything a callback receives, and waits for a matching entry. */
export class Recorder<T> {
  readonly items: T[] = [];
  private readonly watchers = new Set<() => void>();

  readonly push = (item: T): void => {
    this.items.push(item);
    for (const w of [...this.watchers]) w();
  };

  /** Resolves with the first recorded item (from index `from`) matching `match`; fails after `timeoutMs`. */
  next(match: (item: T) => boolean, from = 0, timeoutMs = 20_000): Promise<T> {
    return new Promise((resolve, reject) => {
      const check = () => {
        const found = this.items.slice(from).find(match);
        if (found === undefined) return false;
        clearTimeout(timer);
        this.watchers.delete(check);
        resolve(found);
        return true;
      };
      const timer = setTimeout(() => {
        this.watchers.delete(check);
        reject(new Error('timed out waiting for a recorded item'));
      }, timeoutMs);
      if (!check()) this.watchers.add(check);
    });
  }
}
