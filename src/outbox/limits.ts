/**
 * The limits every event is held to, in one place. `append`/`appendMany`
 * (and so the CLI) check them before anything is sent; migration
 * `0005_event_limits.sql` holds every other writer to the same numbers with
 * CHECK constraints, so nothing a plain-SQL writer stores can be refused by
 * a consumer later. Change a number here only together with a new migration.
 */

/**
 * The limits of one event. Lengths of `stream`, `kind` and `key` count
 * UTF-16 code units, as JavaScript's `String.length` does: the rule
 * `StreamClient` and `tidemark tail` apply to stream names, so every stream
 * that can be written can be followed. Sizes count the UTF-8 bytes of the
 * JSON text PostgreSQL returns for the column (`payload::text`), which is
 * what a consumer receives.
 *
 * At these lengths `stream`, `kind` and `key` together (at most 1,968 UTF-8
 * bytes) fit in one B-tree index row (PostgreSQL's limit is 2,704 bytes on
 * 8 KiB pages), so no index over them can fail on an over-long value.
 */
export const EVENT_LIMITS = Object.freeze({
  /** Longest `stream`: 200 UTF-16 code units, the same as consumer and stream names everywhere in tidemark. */
  streamMaxLength: 200,
  /** Longest `kind`: 200 UTF-16 code units. */
  kindMaxLength: 200,
  /** Longest `key`: 256 UTF-16 code units. */
  keyMaxLength: 256,
  /** Largest `headers`, as stored JSON text: 64 KiB (65536 bytes). */
  headersMaxBytes: 64 * 1024,
  /** Largest `payload` plus `headers`, as stored JSON text: 1 MiB (1048576 bytes). */
  eventMaxBytes: 1024 * 1024,
});

/** The text fields of an event and their longest allowed length. */
export const TEXT_FIELDS = Object.freeze({
  stream: EVENT_LIMITS.streamMaxLength,
  kind: EVENT_LIMITS.kindMaxLength,
  key: EVENT_LIMITS.keyMaxLength,
});

/** A text field's name. */
export type TextField = keyof typeof TEXT_FIELDS;

/** A UTF-16 surrogate without its partner: node-postgres would send it as U+FFFD, changing the value. */
const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

/** Whether `text` holds a UTF-16 surrogate without its partner. */
export function hasLoneSurrogate(text: string): boolean {
  return LONE_SURROGATE.test(text);
}

/**
 * Why `value` is not a valid `stream`, `kind` or `key`, or undefined when it
 * is: a non-empty string within the field's length, without NUL (PostgreSQL
 * text cannot hold it) or a lone surrogate (it would be stored as U+FFFD).
 */
export function textProblem(field: TextField, value: unknown): string | undefined {
  const max = TEXT_FIELDS[field];
  if (typeof value !== 'string' || value.length === 0) return `must be a non-empty string of at most ${max} characters`;
  if (value.length > max) return `is ${value.length} characters (UTF-16 code units) long, over the limit of ${max}`;
  if (value.includes('\u0000')) return 'must not contain NUL characters';
  if (hasLoneSurrogate(value)) return 'must not contain a lone UTF-16 surrogate (PostgreSQL would store U+FFFD instead)';
  return undefined;
}
