/**
 * Calling user callbacks from a loop that must go on: an observer that
 * throws is reported to `onError`; an `onError` that throws is ignored.
 */

/** Passes `err` to `onError`, if any; never throws. */
export function reportError(onError: ((err: unknown) => void) | undefined, err: unknown): void {
  try {
    onError?.(err);
  } catch {
    // An error handler that throws must not break the caller's loop.
  }
}

/** Passes `value` to `observer`, if any; what it throws goes to `onError`. */
export function notifyObserver<T>(observer: ((value: T) => void) | undefined, value: T, onError: ((err: unknown) => void) | undefined): void {
  try {
    observer?.(value);
  } catch (err) {
    reportError(onError, err);
  }
}
