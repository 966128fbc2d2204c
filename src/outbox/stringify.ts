/**
 * JavaScript values to JSON text without silent changes: what
 * `JSON.stringify` would turn into something else is refused, naming the
 * path of the value.
 */
import { JsonProblem, type Segment } from './json.js';

/**
 * Serialises a JavaScript value as `JSON.stringify` does, refusing what it
 * would silently change or cannot write: `NaN` and `±Infinity` (it writes
 * `null`), BigInt and cycles (it throws). Returns undefined for a value JSON
 * has no text for (undefined, a function).
 */
export function stringify(value: unknown): string | undefined {
  let text: string | undefined;
  try {
    text = JSON.stringify(value);
  } catch (err) {
    findUnstorable(value);
    throw new JsonProblem([], `is not serialisable as JSON (${(err as Error).message.split('\n')[0]})`);
  }
  // Fast path: without a `null` in the text, no number was turned into one.
  if (text !== undefined && text.includes('null')) findUnstorable(value);
  return text;
}

/** Walks `value` as JSON.stringify does and throws for the first NaN, ±Infinity or BigInt, naming its path. */
function findUnstorable(value: unknown): void {
  const paths = new Map<object, Segment[]>();
  try {
    JSON.stringify(value, function (this: object, key: string, v: unknown) {
      const parent = paths.get(this);
      const path = parent === undefined ? [] : [...parent, Array.isArray(this) ? Number(key) : key];
      if (typeof v === 'number' && !Number.isFinite(v)) {
        throw new JsonProblem(path, `holds ${String(v)}, which JSON cannot represent (JSON.stringify would write null)`);
      }
      if (typeof v === 'bigint') throw new JsonProblem(path, 'holds a BigInt, which JSON cannot represent; convert it to a string or a number');
      if (typeof v === 'object' && v !== null) paths.set(v, path);
      return v;
    });
  } catch (err) {
    if (err instanceof JsonProblem) throw err;
    // A cycle: the caller reports JSON.stringify's own error.
  }
}
