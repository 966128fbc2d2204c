import { InvalidOptionsError } from '../errors.js';

/**
 * Anything with a node-postgres style `query(text, values)`: a pg `Client`,
 * a `PoolClient` inside the caller's transaction, or an ORM's raw connection.
 */
export interface Queryable {
  /** Runs one parametrised statement. */
  query(text: string, values?: unknown[]): Promise<{ rows: unknown[]; rowCount?: number | null }>;
}

/** The default schema for tidemark's tables and functions. */
export const DEFAULT_SCHEMA = 'tidemark';

const IDENTIFIER = /^[a-z_][a-z0-9_]*$/;

/**
 * Validates a schema name: lower-case letters, digits and underscores, not
 * starting with a digit, at most 48 characters (so derived names such as the
 * notification channel stay under PostgreSQL's 63-byte identifier limit).
 */
export function validateSchema(schema: unknown, option = 'schema'): string {
  if (typeof schema !== 'string' || !IDENTIFIER.test(schema) || schema.length > 48) {
    throw new InvalidOptionsError(
      option,
      `expected a lower-case SQL identifier of at most 48 characters ([a-z_][a-z0-9_]*), got ${JSON.stringify(schema)}`,
    );
  }
  return schema;
}

/** Quotes an identifier. The only way identifiers enter tidemark's SQL. */
export function quoteIdent(name: string): string {
  return `"${name.replaceAll('"', '""')}"`;
}

/**
 * The fence's advisory-lock key for a schema: a stable signed 64-bit FNV-1a
 * hash of `tidemark.fence:<schema>`. Two schemas in one database get two
 * independent fences; the key is written into the schema's SQL at migration.
 */
export function fenceKey(schema: string): bigint {
  return advisoryKey(`tidemark.fence:${schema}`);
}

/**
 * A string as an SQL text expression, for the page statements that travel
 * in one simple-protocol message (which takes no parameters). Names of
 * letters, digits and `_ . : / @ -` go as plain literals, readable in
 * pg_stat_activity; any other name goes as its UTF-8 bytes in hex,
 * `convert_from(decode('…', 'hex'), 'UTF8')`: nothing in it can be read
 * differently under another client encoding, `standard_conforming_strings`
 * or `backslash_quote`.
 */
export function sqlText(value: string): string {
  if (value.includes('\u0000')) throw new InvalidOptionsError('name', 'a name with NUL cannot be sent to PostgreSQL');
  if (PLAIN_TEXT.test(value)) return `'${value}'`;
  return `pg_catalog.convert_from(pg_catalog.decode('${Buffer.from(value, 'utf8').toString('hex')}', 'hex'), 'UTF8')`;
}

const PLAIN_TEXT = /^[A-Za-z0-9_.:/@-]*$/;

/** Signed 64-bit FNV-1a of a label's UTF-8 bytes: a bigint advisory-lock key. */
function advisoryKey(label: string): bigint {
  let hash = 0xcbf29ce484222325n;
  for (const byte of Buffer.from(label, 'utf8')) {
    hash ^= BigInt(byte);
    hash = (hash * 0x100000001b3n) & 0xffffffffffffffffn;
  }
  return BigInt.asIntN(64, hash);
}

/** The channel the watermarker NOTIFYs after each advancement. */
export function notifyChannel(schema: string): string {
  return `${schema}_watermark`;
}

/** The channel a writer NOTIFYs while the watermark loop sleeps (docs/PROTOCOL.md §3.13). */
export function wakeChannel(schema: string): string {
  return `${schema}_wake`;
}
