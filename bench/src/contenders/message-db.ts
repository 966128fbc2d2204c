import { readFile } from 'node:fs/promises';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { randomUUID } from 'node:crypto';
import type pg from 'pg';
import { quoteIdent } from '../db.js';
import { CURSOR_TABLE, clientWriter, cursorLoop } from './common.js';
import { ContenderUnavailable, type Contender } from './types.js';

/** The install order of message-db's own install.sh, install-functions.sh and install-indexes.sh. */
const FILES = [
  'schema/message-store.sql',
  'extensions/pgcrypto.sql',
  'tables/messages.sql',
  'types/message.sql',
  'functions/message-store-version.sql',
  'functions/hash-64.sql',
  'functions/acquire-lock.sql',
  'functions/category.sql',
  'functions/is-category.sql',
  'functions/id.sql',
  'functions/cardinal-id.sql',
  'functions/stream-version.sql',
  'functions/write-message.sql',
  'functions/get-stream-messages.sql',
  'functions/get-category-messages.sql',
  'functions/get-last-stream-message.sql',
  'indexes/messages-id.sql',
  'indexes/messages-stream.sql',
  'indexes/messages-category.sql',
];

async function databaseDir(): Promise<string> {
  try {
    return join(dirname(createRequire(import.meta.url).resolve('@eventide/message-db/package.json')), 'database');
  } catch {
    throw new ContenderUnavailable('@eventide/message-db is not installed (npm install --save-dev @eventide/message-db)');
  }
}

/**
 * Eventide's Message DB, installed from its npm package's own SQL and driven
 * through its public functions: `write_message` in the caller's transaction,
 * `get_category_messages` to read. Message DB keeps no consumer cursor in
 * the database (Eventide's Ruby consumers write position messages); the
 * adapter keeps the position in a table updated in the handler's transaction.
 */
export const messageDbContender: Contender = {
  id: 'message-db',
  title: '@eventide/message-db 1.3.1',
  kind: 'npm',
  notes: [
    'write_message takes a per-category advisory lock until commit, so writers to one category run one at a time; the bench writes one category',
    'position kept by the adapter in the handler transaction (Message DB has no server-side cursor)',
  ],
  async install(pool: pg.Pool) {
    const dir = await databaseDir();
    for (const file of FILES) await pool.query(await readFile(join(dir, file), 'utf8'));
    const db = (await pool.query('SELECT current_database() AS d')).rows[0].d as string;
    await pool.query(`ALTER DATABASE ${quoteIdent(db)} SET search_path = public, message_store`);
    await pool.query('SET search_path = public, message_store');
    await pool.query(CURSOR_TABLE);
  },
  async plainTable(pool) {
    await pool.query('CREATE TABLE IF NOT EXISTS bench_plain (LIKE message_store.messages INCLUDING ALL)');
    return async (client, events) => {
      await client.query(
        `INSERT INTO bench_plain (id, stream_name, position, type, data)
         SELECT gen_random_uuid(), 'bench-' || k, i, 'E', jsonb_build_object('id', i) FROM unnest($1::text[], $2::bigint[]) AS t(k, i)`,
        [events.map((e) => e.key), events.map((e) => e.id)],
      );
    };
  },
  writer: (url) =>
    clientWriter(url, async (client, events) => {
      for (const e of events) {
        await client.query('SELECT message_store.write_message($1, $2, $3, $4)', [randomUUID(), `bench-${e.key}`, 'E', JSON.stringify({ id: e.id })]);
      }
    }),
  consume: (url, handler, options) =>
    cursorLoop(url, handler, { ...options, initial: [0n, 1n] }, async (tx, [, position], limit) => {
      const r = await tx.query('SELECT global_position, stream_name, data FROM message_store.get_category_messages($1, $2, $3)', ['bench', position, limit]);
      const events = r.rows.map((row) => ({ id: Number(JSON.parse(row.data).id), key: String(row.stream_name).slice('bench-'.length) }));
      const last = r.rows[r.rows.length - 1];
      return { events, next: [0n, last ? BigInt(last.global_position) + 1n : position] };
    }),
};
