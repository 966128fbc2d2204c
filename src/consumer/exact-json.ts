/**
 * A delivered event's payload and headers as PostgreSQL wrote them
 * (`payload::text`), and parsed from that text, never with a number
 * changed: a number a JavaScript number cannot hold exactly (an id
 * of 20 digits, `1e400`, `1e-400`) makes the parse throw
 * {@link InexactNumberError}, naming it, instead of handing the handler a
 * rounded value, `Infinity` or `0`. The text is always there
 * (`payloadText`, `headersText`) for a parser that keeps such numbers.
 */
import type { JsonObject } from '../outbox/append.js';
import { InexactNumberError } from '../errors.js';
import type { Handler, StreamEvent } from './events.js';

/** An event's fields as read: payload and headers as PostgreSQL's text. */
export interface EventText {
  seq: bigint;
  stream: string;
  kind: string;
  key: string;
  payloadText: string;
  headersText: string;
  occurredAt: Date;
}

/**
 * The event a handler receives, `payload` and `headers` parsed from the
 * text. Where one of them holds a number the parsed value would change, it
 * is an accessor that throws {@link InexactNumberError} when read, on that
 * event alone: the event is still delivered (the relay and `tail` read only
 * the text), and a handler that reads the value learns why it cannot have
 * it. Otherwise plain data properties, in one shape for every event (an
 * object literal: a parse costs what node-postgres's own jsonb parse did,
 * and a lazy accessor on every event would cost more than the parse).
 */
export function streamEvent(fields: EventText): StreamEvent {
  const { seq, payloadText, headersText } = fields;
  const payload = tryParseExact(payloadText, seq, 'payload');
  const headers = tryParseExact(headersText, seq, 'headers');
  const event = {
    seq,
    stream: fields.stream,
    kind: fields.kind,
    key: fields.key,
    payload: payload instanceof InexactNumberError ? {} : payload,
    payloadText,
    headers: headers instanceof InexactNumberError ? {} : headers,
    headersText,
    occurredAt: fields.occurredAt,
  };
  for (const [field, parsed] of [['payload', payload], ['headers', headers]] as const) {
    if (parsed instanceof InexactNumberError) {
      Object.defineProperty(event, field, {
        enumerable: true,
        get: () => {
          throw new InexactNumberError(parsed.seq, parsed.field, parsed.number, parsed.offset);
        },
      });
    }
  }
  return event;
}

/**
 * Handlers of tidemark's own that read only `payloadText` and
 * `headersText` (the relay's page collector): their events parse `payload`
 * and `headers` on first read instead, so a page whose payloads nobody
 * reads parses none. Not for applications' handlers: an event whose
 * `payload` is a getter of its class drops it from `{ ...event }`.
 */
const textReaders = new WeakSet<Handler>();

/** Marks `handler` as one that reads only the text of payload and headers (see {@link textReaders}). */
export function readsText<H extends Handler>(handler: H): H {
  textReaders.add(handler);
  return handler;
}

/** The event for `handler`: {@link streamEvent}, or a {@link TextFirstEvent} for a handler marked with {@link readsText}. */
export function streamEventFor(handler: Handler, fields: EventText): StreamEvent {
  return textReaders.has(handler) ? new TextFirstEvent(fields) : streamEvent(fields);
}

/**
 * An event whose `payload` and `headers` are parsed from the text on first
 * read and kept (getters of the class, so one shape for every event); a
 * number the parsed value would change throws {@link InexactNumberError}
 * on that read, as {@link streamEvent}'s accessor does.
 */
class TextFirstEvent implements StreamEvent {
  seq: bigint;
  stream: string;
  kind: string;
  key: string;
  payloadText: string;
  headersText: string;
  occurredAt: Date;
  #payload: JsonObject | InexactNumberError | undefined;
  #headers: JsonObject | InexactNumberError | undefined;

  constructor(fields: EventText) {
    this.seq = fields.seq;
    this.stream = fields.stream;
    this.kind = fields.kind;
    this.key = fields.key;
    this.payloadText = fields.payloadText;
    this.headersText = fields.headersText;
    this.occurredAt = fields.occurredAt;
  }

  get payload(): JsonObject {
    return parsed((this.#payload ??= tryParseExact(this.payloadText, this.seq, 'payload')));
  }

  get headers(): JsonObject {
    return parsed((this.#headers ??= tryParseExact(this.headersText, this.seq, 'headers')));
  }
}

/** The parsed value, or a fresh throw of the refusal (each read gets its own stack). */
function parsed(value: JsonObject | InexactNumberError): JsonObject {
  if (value instanceof InexactNumberError) throw new InexactNumberError(value.seq, value.field, value.number, value.offset);
  return value;
}

function tryParseExact(text: string, seq: bigint, field: 'payload' | 'headers'): JsonObject | InexactNumberError {
  try {
    return parseExact(text, { seq, field });
  } catch (err) {
    if (err instanceof InexactNumberError) return err;
    throw err;
  }
}

/**
 * `JSON.parse(text)`, refusing a number that the parsed value would not
 * hold exactly. Equal in value is enough: `1.50` parses to 1.5, and
 * `-0` to -0; `12345678901234567890` (12345678901234567000 as a number),
 * `1e400` (Infinity) and `1e-400` (0) throw.
 */
export function parseExact(text: string, where: { seq: bigint; field: 'payload' | 'headers' }): JsonObject {
  const value = JSON.parse(text) as JsonObject;
  const inexact = firstInexactNumber(text);
  if (inexact !== undefined) throw new InexactNumberError(where.seq, where.field, inexact.text, inexact.at);
  return value;
}

/** The first number token of JSON `text` whose JavaScript number differs in value, with its offset. */
export function firstInexactNumber(text: string): { text: string; at: number } | undefined {
  // No 16 digits and points in a row, and nothing like an exponent: every
  // number has 15 digits or fewer and none has an exponent (below), so the
  // text needs no scan. Most payloads end here.
  if (!MAYBE_INEXACT.test(text)) return undefined;
  const n = text.length;
  let i = 0;
  while (i < n) {
    const c = text.charCodeAt(i);
    if (c === 0x22 /* " */) {
      // Skip a string: to the next quote not escaped.
      i += 1;
      while (i < n) {
        const d = text.charCodeAt(i);
        if (d === 0x5c /* \ */) i += 2;
        else if (d === 0x22) break;
        else i += 1;
      }
      i += 1;
    } else if (c === 0x2d /* - */ || (c >= 0x30 && c <= 0x39)) {
      const start = i;
      let digits = 0;
      i += 1;
      if (c !== 0x2d) digits = 1;
      let exponent = false;
      while (i < n) {
        const d = text.charCodeAt(i);
        if (d >= 0x30 && d <= 0x39) digits += exponent ? 0 : 1;
        else if (d === 0x65 || d === 0x45) exponent = true; // e E
        else if (d !== 0x2e && d !== 0x2b && d !== 0x2d) break; // . + -
        i += 1;
      }
      // Fifteen digits or fewer, with no exponent: within the range of a
      // double and within its 15 significant decimal digits (DBL_DIG), so
      // the number reads back as written. PostgreSQL writes jsonb numbers
      // without exponents, so nearly every number takes this path.
      if (digits <= 15 && !exponent) continue;
      const token = text.slice(start, i);
      if (!sameValue(token, String(Number(token)))) return { text: token, at: start };
    } else {
      i += 1;
    }
  }
  return undefined;
}

const MAYBE_INEXACT = /\d[\d.]{15}|[eE][+-]?\d/;

/** Whether two decimal numerals (JSON's, or JavaScript's `String(number)`) denote the same value. */
function sameValue(a: string, b: string): boolean {
  const x = decimal(a);
  const y = decimal(b);
  if (x === undefined || y === undefined) return false; // `Infinity`, `NaN`
  if (x.digits === '' || y.digits === '') return x.digits === y.digits; // zero: -0 is 0
  return x.negative === y.negative && x.digits === y.digits && x.exponent === y.exponent;
}

/** A numeral as sign, digits without leading or trailing zeros, and the power of ten of the last digit. */
function decimal(numeral: string): { negative: boolean; digits: string; exponent: number } | undefined {
  const m = /^(-)?(\d+)(?:\.(\d+))?(?:[eE]([+-]?\d+))?$/.exec(numeral);
  if (!m) return undefined;
  const fraction = m[3] ?? '';
  let digits = (m[2]! + fraction).replace(/^0+/, '');
  let exponent = Number(m[4] ?? '0') - fraction.length;
  const trimmed = digits.replace(/0+$/, '');
  exponent += digits.length - trimmed.length;
  digits = trimmed;
  return { negative: m[1] === '-', digits, exponent };
}
