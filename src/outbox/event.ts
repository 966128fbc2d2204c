/**
 * One event checked against {@link EVENT_LIMITS} and what PostgreSQL can
 * store, into the row `append`/`appendMany` insert. Events come as
 * JavaScript values (the library) or as JSON text (the CLI), whose payload
 * and headers text is passed to PostgreSQL exactly as written.
 */
import { InvalidEventError } from '../errors.js';
import { JsonProblem, scanJson, type JsonMember } from './json.js';
import { stringify } from './stringify.js';
import { EVENT_LIMITS, textProblem, type TextField } from './limits.js';

/** An event ready to insert: text fields checked, payload and headers as JSON text PostgreSQL will accept. */
export interface EventRow {
  stream: string;
  kind: string;
  key: string;
  payload: string;
  headers: string;
}

/** The fields an event may have. */
export const EVENT_FIELDS: readonly string[] = ['stream', 'kind', 'key', 'payload', 'headers'];

interface Json {
  text: string;
  /** UTF-8 bytes of the text as PostgreSQL renders it; with `bound`, at most this many. */
  size: number;
  /** Set when `size` is only an upper bound: {@link exactSize} measures it. */
  bound?: true;
}

const EMPTY: Json = { text: '{}', size: 2 };

/**
 * Bytes PostgreSQL's rendering of `JSON.stringify`'s text can take per
 * UTF-16 unit of it, when the text has no escape. In a string, a unit is at
 * most 3 UTF-8 bytes (a surrogate pair, 2 units, is 4). A separator gains a
 * space (`,` to `, `). A number is what JavaScript writes for a finite
 * double, which numeric renders in full: the worst is `5e-324`, 6 units
 * rendered as 326 bytes (`0.` and 323 zeros and `5`), 54.3 a unit; `1e+308`
 * is 309 bytes. 64 is above all of these (test/outbox/event-size.test.ts
 * checks the bound against the exact measure).
 */
export const MAX_RENDERED_BYTES_PER_UNIT = 64;

function problem(index: number, field: string, err: unknown): never {
  if (err instanceof JsonProblem) {
    throw new InvalidEventError(index, field, err.segments.length === 0 ? err.message : `${err.path} ${err.message}`);
  }
  throw err;
}

/** A problem in a whole event's JSON text, blamed on the event field it lies in (`payload`, at `$.items[3]`). */
function eventProblem(index: number, err: unknown): never {
  if (err instanceof JsonProblem && typeof err.segments[0] === 'string' && EVENT_FIELDS.includes(err.segments[0])) {
    problem(index, err.segments[0], new JsonProblem(err.segments.slice(1), err.message));
  }
  return problem(index, '(event)', err);
}

function checkFields(names: Iterable<string>, index: number): void {
  for (const name of names) {
    if (name === 'seq') throw new InvalidEventError(index, 'seq', 'is assigned by the database under the fence and cannot be given');
    if (!EVENT_FIELDS.includes(name)) throw new InvalidEventError(index, name, `is not an event field (expected ${EVENT_FIELDS.join(', ')})`);
  }
}

function text(index: number, field: TextField, value: unknown): string {
  const why = textProblem(field, value);
  if (why) throw new InvalidEventError(index, field, why);
  return value as string;
}

/** `json` with its exact rendered size, when it only had a bound. */
function exactSize(index: number, field: string, json: Json): Json {
  if (!json.bound) return json;
  try {
    return { text: json.text, size: scanJson(json.text).size };
  } catch (err) {
    return problem(index, field, err);
  }
}

/** Whether payload and headers of these sizes are within the limits; `maxEventBytes` bounds both together. */
function fits(payload: Json, headers: Json, maxEventBytes: number, added = 0): boolean {
  return headers.size + added <= EVENT_LIMITS.headersMaxBytes && payload.size + headers.size + added <= maxEventBytes;
}

/** Payload and headers within their limits; returns them, measured exactly when a bound did not fit. */
function sized(index: number, payload: Json, headers: Json, maxEventBytes: number): [payload: Json, headers: Json] {
  if ((payload.bound || headers.bound) && !fits(payload, headers, maxEventBytes)) {
    // A bound over a limit proves nothing: measure.
    payload = exactSize(index, 'payload', payload);
    headers = exactSize(index, 'headers', headers);
  }
  if (headers.size > EVENT_LIMITS.headersMaxBytes) {
    throw new InvalidEventError(index, 'headers', `is ${headers.size} bytes as stored, over the limit of ${EVENT_LIMITS.headersMaxBytes}`);
  }
  const size = payload.size + headers.size;
  if (size > maxEventBytes) {
    throw new InvalidEventError(index, 'payload', `payload and headers are ${size} bytes as stored, over the limit of ${maxEventBytes} (maxEventBytes)`);
  }
  return [payload, headers];
}

/**
 * Members to add to an event's headers (the W3C trace context of the active
 * span): JSON member text, `"name": value, ...`, and the UTF-8 bytes they
 * add as jsonb renders them, separators included.
 */
export interface AddedHeaders {
  text: string;
  size: number;
}

/**
 * The headers text with `added` members put first, so the caller's own
 * members keep their text exactly. Nothing is added when the caller's
 * headers name a `traceparent` or `tracestate` anywhere (their trace context
 * wins, and a pair is never mixed), or when the members would take the event
 * over a limit: the event as the caller wrote it is stored, without them.
 */
function withAdded(index: number, payload: Json, headers: Json, added: AddedHeaders, maxEventBytes: number): string {
  const text = headers.text;
  if (text.includes('"traceparent"') || text.includes('"tracestate"')) return text;
  // JSON.stringify's text: `{` first, `{}` when empty.
  const empty = text === '{}';
  const size = added.size - (empty ? 2 : 0); // no `, ` after the last member
  if (!fits(payload, headers, maxEventBytes, size)) {
    if (!payload.bound && !headers.bound) return text;
    if (!fits(exactSize(index, 'payload', payload), exactSize(index, 'headers', headers), maxEventBytes, size)) return text;
  }
  return `{${added.text}${empty ? '}' : `, ${text.slice(1)}`}`;
}

/** A JavaScript value for `payload` or `headers`: a plain object, serialised without loss. */
function valueJson(index: number, field: string, value: unknown): Json {
  if (value === undefined) return EMPTY;
  const proto: unknown = typeof value === 'object' && value !== null ? Object.getPrototypeOf(value) : undefined;
  if (proto !== Object.prototype && proto !== null) throw new InvalidEventError(index, field, 'must be a plain JSON object');
  try {
    const json = stringify(value);
    // Text with no backslash has no escape, so none of what jsonb refuses
    // (`\u0000`, a lone surrogate: JSON.stringify escapes both), and the
    // numbers of finite doubles, which numeric holds: only its size is
    // left to measure, and a bound does until it reaches a limit. `{`
    // first: an object (JSON.stringify writes no leading space).
    if (json !== undefined && json.charCodeAt(0) === 0x7b && !json.includes('\\')) {
      return { text: json, size: json.length * MAX_RENDERED_BYTES_PER_UNIT, bound: true };
    }
    const scan = json === undefined ? undefined : scanJson(json);
    if (json === undefined || !scan?.object) throw new InvalidEventError(index, field, 'must be a plain JSON object (its toJSON() returned something else)');
    return { text: json, size: scan.size };
  } catch (err) {
    return problem(index, field, err);
  }
}

/** Checks an event given as JavaScript values; `added` members go into its headers when they fit (see {@link AddedHeaders}). */
export function eventFromValue(input: unknown, index: number, maxEventBytes: number, added?: AddedHeaders): EventRow {
  if (typeof input !== 'object' || input === null || Array.isArray(input)) {
    throw new InvalidEventError(index, '(event)', 'must be an object with stream, kind and key');
  }
  const event = input as Record<string, unknown>;
  checkFields(Object.keys(event), index);
  const row = {
    stream: text(index, 'stream', event.stream),
    kind: text(index, 'kind', event.kind),
    key: text(index, 'key', event.key),
  };
  const [payload, headers] = sized(index, valueJson(index, 'payload', event.payload), valueJson(index, 'headers', event.headers), maxEventBytes);
  const headersText = added === undefined ? headers.text : withAdded(index, payload, headers, added, maxEventBytes);
  // Spelled out: an object spread here cost more than every check above.
  return { stream: row.stream, kind: row.kind, key: row.key, payload: payload.text, headers: headersText };
}

/** A member given as JSON text for `payload` or `headers`: an object, passed on as written. */
function memberJson(source: string, index: number, field: string, member: JsonMember | undefined): Json {
  if (member === undefined) return EMPTY;
  if (member.kind !== '{') throw new InvalidEventError(index, field, 'must be a JSON object');
  return { text: source.slice(member.start, member.end), size: member.size };
}

/**
 * Checks an event given as the JSON text of one object (an NDJSON line).
 * Payload and headers keep their text exactly as written, so PostgreSQL
 * parses the user's numbers (`1e400`, `12345678901234567890`) itself.
 */
export function eventFromJson(source: string, index: number, maxEventBytes: number): EventRow {
  let members: Map<string, JsonMember> | undefined;
  try {
    const scan = scanJson(source, true);
    members = scan.object ? scan.members : undefined;
  } catch (err) {
    eventProblem(index, err);
  }
  if (!members) throw new InvalidEventError(index, '(event)', 'must be a JSON object with stream, kind and key');
  checkFields(members.keys(), index);
  const field = (name: TextField) => {
    const member = members.get(name);
    return text(index, name, member?.kind === '"' ? member.text : undefined);
  };
  const row = { stream: field('stream'), kind: field('kind'), key: field('key') };
  const payload = memberJson(source, index, 'payload', members.get('payload'));
  const headers = memberJson(source, index, 'headers', members.get('headers'));
  sized(index, payload, headers, maxEventBytes);
  return { stream: row.stream, kind: row.kind, key: row.key, payload: payload.text, headers: headers.text };
}

/**
 * Checks an event given as separate parts (the CLI's flags): text fields as
 * strings, payload and headers as JSON text, passed on as written.
 */
export function eventFromParts(
  parts: { stream: unknown; kind: unknown; key: unknown; payload?: string; headers?: string },
  maxEventBytes: number,
): EventRow {
  const row = { stream: text(0, 'stream', parts.stream), kind: text(0, 'kind', parts.kind), key: text(0, 'key', parts.key) };
  const json = (field: 'payload' | 'headers'): Json => {
    const source = parts[field];
    if (source === undefined) return EMPTY;
    try {
      const scan = scanJson(source);
      if (!scan.object) throw new InvalidEventError(0, field, 'expected a JSON object');
      return { text: source, size: scan.size };
    } catch (err) {
      return problem(0, field, err);
    }
  };
  const payload = json('payload');
  const headers = json('headers');
  sized(0, payload, headers, maxEventBytes);
  return { stream: row.stream, kind: row.kind, key: row.key, payload: payload.text, headers: headers.text };
}
