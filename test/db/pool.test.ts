import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { createPool } from '../../src/index.js';
import { closeAdmin, testDb } from '../support/db.js';

after(closeAdmin);

test("createPool keeps its keepalive settings when the caller passes server options of its own", async (t) => {
  const db = await testDb(t);
  const pool = createPool({ connectionString: db.url, options: '-c search_path=public -c tcp_keepalives_count=4' });
  t.after(() => pool.end());
  const r = await pool.query<{ idle: string; count: string; path: string }>(
    "SELECT current_setting('tcp_keepalives_idle') AS idle, current_setting('tcp_keepalives_count') AS count, current_setting('search_path') AS path",
  );
  // Over TCP the server applies them (on a Unix socket it reports 0).
  assert.deepEqual(r.rows[0], { idle: '10', count: '4', path: 'public' }, 'ours, then the caller\'s (a later -c wins)');
});
