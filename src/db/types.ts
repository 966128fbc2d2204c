/**
 * How tidemark's own reads of events turn PostgreSQL's text into values,
 * whatever type parsers the application set on `pg` (`pg.types.setTypeParser`
 * is global: an application that parses bigint as a number, or timestamptz as
 * a string, must not change the seq a consumer advances to or break a sink's
 * `occurredAt.toISOString()`).
 *
 * Every column stays PostgreSQL's text but `integer` (a number) and
 * `timestamptz` (a `Date`, to the millisecond, as node-postgres gives it).
 */
import type pg from 'pg';

const INT4 = 23;
const TIMESTAMPTZ = 1184;

const text = (value: string): string => value;
const int4 = (value: string): number => Number(value);

/** The `types` of a query that reads events: see the module comment. */
export const EVENT_TYPES: pg.CustomTypesConfig = {
  getTypeParser: ((oid: number) => (oid === TIMESTAMPTZ ? parseTimestamptz : oid === INT4 ? int4 : text)) as pg.CustomTypesConfig['getTypeParser'],
};

/** Digit `i` of `s` as a number (0-9), or NaN. */
function digit(s: string, i: number): number {
  const c = s.charCodeAt(i) - 48;
  return c >= 0 && c <= 9 ? c : Number.NaN;
}

/** The number of the `n` digits of `s` from `i`; NaN when one is not a digit. */
function digits(s: string, i: number, n: number): number {
  let value = 0;
  for (let k = 0; k < n; k += 1) value = value * 10 + digit(s, i + k);
  return value;
}

/** PostgreSQL's ISO output in full: any year, BC, a fraction, an offset to the second. */
const ISO = /^(\d{4,})-(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)(?:\.(\d+))?([+-])(\d\d)(?::(\d\d))?(?::(\d\d))?( BC)?$/;

/**
 * A `timestamptz` in PostgreSQL's ISO output (DateStyle ISO, the default):
 * `YYYY-MM-DD HH:MM:SS[.ffffff]±HH[:MM[:SS]][ BC]`, as a `Date` truncated to
 * the millisecond. The usual shape (a four-digit year from 1000, no BC) is
 * read by position; the rest by a pattern; what is neither (`infinity`,
 * another DateStyle) is an invalid Date.
 */
export function parseTimestamptz(value: string): Date {
  const n = value.length;
  // 'YYYY-MM-DD HH:MM:SS' then '.f...' and/or '±HH...': the usual case, no pattern.
  if (n >= 22 && value.charCodeAt(4) === 45 && value.charCodeAt(10) === 32 && value.charCodeAt(n - 3) !== 32 /* ' BC' */) {
    const year = digits(value, 0, 4);
    let i = 19;
    let ms = 0;
    if (value.charCodeAt(i) === 46 /* . */) {
      i += 1;
      let scale = 100;
      for (; i < n && digit(value, i) >= 0; i += 1, scale /= 10) if (scale >= 1) ms += digit(value, i) * scale;
    }
    const sign = value.charCodeAt(i);
    const tail = n - i;
    if (year >= 1000 && (sign === 43 || sign === 45) && (tail === 3 || tail === 6 || tail === 9)) {
      const offset = digits(value, i + 1, 2) * 3600 + (tail >= 6 ? digits(value, i + 4, 2) * 60 : 0) + (tail === 9 ? digits(value, i + 7, 2) : 0);
      const utc = Date.UTC(year, digits(value, 5, 2) - 1, digits(value, 8, 2), digits(value, 11, 2), digits(value, 14, 2), digits(value, 17, 2), ms);
      const at = utc - (sign === 45 ? -offset : offset) * 1000;
      if (!Number.isNaN(at)) return new Date(at);
    }
  }
  const m = ISO.exec(value);
  if (!m) return new Date(Number.NaN);
  let year = Number(m[1]);
  if (m[12]) year = 1 - year; // 1 BC is year 0
  const ms = m[7] ? Number(m[7].slice(0, 3).padEnd(3, '0')) : 0;
  const offset = Number(m[9]) * 3600 + Number(m[10] ?? 0) * 60 + Number(m[11] ?? 0);
  const date = new Date(Date.UTC(2000, 0, 1, Number(m[4]), Number(m[5]), Number(m[6]), ms));
  date.setUTCFullYear(year, Number(m[2]) - 1, Number(m[3])); // Date.UTC would take years 0 to 99 as 1900 to 1999
  return new Date(date.getTime() - (m[8] === '-' ? -offset : offset) * 1000);
}
