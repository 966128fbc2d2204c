/**
 * tidemark's SQL cannot be steered from a schema on its caller's
 * search_path (migration 0007, docs/PROTOCOL.md section 5.1): every
 * function runs with search_path = pg_catalog, pg_temp, the one procedure
 * that commits resolves nothing on its caller's path, and the attack that
 * made the step publish past a writer in flight no longer works.
 */
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { quoteIdent } from '../../src/db/queryable.js';
import { closeAdmin, insertEvent, safeSeq, testDb, testRole } from '../support/db.js';

after(closeAdmin);

const FIXED = 'search_path=pg_catalog, pg_temp';

/** SQL words that look an operator up by name (`=` mostly), or evaluate one. */
const OPERATOR_WORDS = /\b(CASE|IN|BETWEEN|LIKE|ILIKE|SIMILAR|DISTINCT|NULLIF|ANY|ALL|SOME|OVERLAPS|IS\s+(NOT\s+)?(TRUE|FALSE|UNKNOWN|DOCUMENT))\b/i;

/**
 * Why a procedure body (one that may not carry a SET clause because it
 * commits) could resolve a name on its caller's search_path: an operator,
 * a construct that looks one up, an unqualified call, or a variable whose
 * type is named without its schema. Comments and string literals are
 * ignored. Empty when every statement is a qualified call, an assignment,
 * COMMIT, or plain control flow on booleans.
 */
export function shellProblems(body: string, schema: string): string[] {
  const code = body
    .replace(/--[^\n]*/g, '')
    .replace(/'(?:[^']|'')*'/g, "''");
  const problems: string[] = [];
  const operators = code.replace(/:=/g, ' ').match(/[-+*/<>=~!@#%^&|?]+/g);
  if (operators) problems.push(`operators ${[...new Set(operators)].join(' ')}`);
  const words = code.match(new RegExp(OPERATOR_WORDS.source, 'gi'));
  if (words) problems.push(`constructs that look an operator up: ${[...new Set(words)].join(', ')}`);
  const qualifiers = new Set([quoteIdent(schema), schema, 'pg_catalog']);
  for (const m of code.matchAll(/([\w$"]+\s*\.\s*)?([\w$"]+)\s*\(/g)) {
    const qualifier = m[1]?.replace(/\s*\.\s*$/, '');
    if (qualifier === undefined) problems.push(`unqualified call ${m[2]}(`);
    else if (!qualifiers.has(qualifier)) problems.push(`call into schema ${qualifier}: ${qualifier}.${m[2]}(`);
  }
  const declare = /\bDECLARE\b([\s\S]*?)\bBEGIN\b/i.exec(code)?.[1] ?? '';
  for (const line of declare.split(';').map((l) => l.trim()).filter(Boolean)) {
    const type = line.split(/\s+/).slice(1).join(' ');
    if (!type.includes('.')) problems.push(`variable of unqualified type: ${line}`);
  }
  return problems;
}

test('every function and procedure of the schema runs with search_path pg_catalog, pg_temp, or is a shell that resolves nothing on its caller\'s path', async (t) => {
  const db = await testDb(t);
  const routines = (
    await db.observer.query<{ sig: string; kind: string; config: string[] | null; body: string }>(
      `SELECT p.oid::regprocedure::text AS sig, p.prokind AS kind, p.proconfig AS config, p.prosrc AS body
         FROM pg_catalog.pg_proc p WHERE p.pronamespace = $1::regnamespace ORDER BY 1`,
      [quoteIdent(db.schema)],
    )
  ).rows;
  assert.ok(routines.length >= 29, `the schema's functions are listed (found ${routines.length})`);
  const refused: string[] = [];
  const shells: string[] = [];
  for (const r of routines) {
    if (r.config?.includes(FIXED)) continue;
    // Only a procedure may go without (PostgreSQL refuses COMMIT in one
    // that has a SET clause), and only if nothing in it can be resolved
    // through the caller's search_path.
    const problems = r.kind === 'p' ? shellProblems(r.body, db.schema) : ['no fixed search_path'];
    if (problems.length === 0) shells.push(r.sig.replace(/\(.*/, ''));
    else refused.push(`${r.sig}: ${problems.join('; ')}`);
  }
  assert.deepEqual(refused, [], `functions that a role creating objects on the caller's search_path could steer`);
  assert.deepEqual(shells, ['tidemark.run_watermarker']);
});

test('the shell check refuses what would resolve on the caller\'s path', () => {
  const ok = `DECLARE r "tidemark".watermarker_loop; BEGIN r := "tidemark".watermarker_tick(r); COMMIT; EXIT WHEN r.done; -- a comment: x + y
    PERFORM pg_catalog.pg_sleep(r.sleep_s); reason := r.reason; END`;
  assert.deepEqual(shellProblems(ok, 'tidemark'), []);
  const cases: [string, RegExp][] = [
    ['BEGIN x := a + 1; END', /operators \+/],
    ['BEGIN EXIT WHEN r.done IS DISTINCT FROM true; END', /DISTINCT/],
    ['BEGIN x := CASE r.a WHEN 1 THEN 2 END; END', /CASE/],
    ['BEGIN PERFORM pg_sleep(1); END', /unqualified call pg_sleep\(/],
    ['BEGIN PERFORM public.pg_sleep(1); END', /call into schema public/],
    ['DECLARE t timestamptz; BEGIN NULL; END', /unqualified type: t timestamptz/],
  ];
  for (const [body, expected] of cases) assert.match(shellProblems(body, 'tidemark').join('\n'), expected, body);
});

test('a role that may create in public cannot make the step publish past a writer in flight (the reproduction of issue 20)', async (t) => {
  const db = await testDb(t);
  const { observer } = db;
  const writer = testRole(t, 'w');
  const app = testRole(t, 'app');
  await observer.query(`SELECT tidemark.grant_writer($1)`, [writer]);
  await observer.query(`CREATE ROLE ${quoteIdent(app)} LOGIN`);
  await observer.query(`GRANT ${quoteIdent(writer)} TO ${quoteIdent(app)}`);
  await observer.query(`GRANT CREATE ON SCHEMA public TO ${quoteIdent(app)}`);

  // The application role plants an exact (text[], text[]) match for the
  // step's holder check, which counts its calls.
  const appSession = await db.session('app');
  await appSession.query(`SET ROLE ${quoteIdent(app)}`);
  await appSession.query('CREATE SEQUENCE public.planted_calls');
  await appSession.query(`CREATE FUNCTION public.no_overlap(text[], text[]) RETURNS boolean LANGUAGE sql AS $$ SELECT pg_catalog.nextval('public.planted_calls') < 0 $$`);
  await appSession.query('CREATE OPERATOR public.&& (LEFTARG = text[], RIGHTARG = text[], FUNCTION = public.no_overlap)');
  await appSession.query('GRANT USAGE ON SEQUENCE public.planted_calls TO PUBLIC');

  // W1 draws seq 1 and stays open; W2 commits seq 2.
  const w1 = await db.session('w1');
  await w1.query(`SET ROLE ${quoteIdent(app)}`);
  await w1.query('BEGIN');
  assert.equal(await insertEvent(w1), 1n);
  const w2 = await db.session('w2');
  await w2.query(`SET ROLE ${quoteIdent(app)}`);
  assert.equal(await insertEvent(w2), 2n);

  // The watermarker and a consumer on the default search_path ("$user", public).
  const wm = await db.session('watermarker');
  assert.equal((await wm.query('SHOW search_path')).rows[0].search_path, '"$user", public');
  await wm.query(`UPDATE tidemark.watermark SET lease_owner = 'wm', lease_expires_at = clock_timestamp() + interval '10 minutes'`);
  const step = async () => (await wm.query(`SELECT outcome, safe_seq FROM tidemark.watermark_step('wm')`)).rows[0];
  assert.deepEqual(await step(), { outcome: 'pending', safe_seq: '0' });
  assert.deepEqual(await step(), { outcome: 'pending', safe_seq: '0' }, 'the second step must not publish 2 while seq 1 is in flight');
  const loop = (await wm.query(`CALL tidemark.run_watermarker('wm', p_run_ms => 200)`)).rows[0];
  assert.deepEqual([loop.reason, loop.safe_seq], ['timeout', '0'], 'nor may the loop');
  assert.equal(await safeSeq(observer), 0n);

  const consumer = await db.session('consumer');
  const page = async () => {
    await consumer.query('BEGIN ISOLATION LEVEL REPEATABLE READ');
    const seqs = (await consumer.query(`SELECT seq::int FROM tidemark.read_page('c', 's', 100)`)).rows.map((r) => r.seq as number);
    if (seqs.length > 0) await consumer.query(`SELECT tidemark.advance_cursor('c', 's', $1)`, [seqs.at(-1)]);
    await consumer.query('COMMIT');
    return seqs;
  };
  assert.deepEqual(await page(), []);

  // W1 commits: the next step publishes both, and the consumer gets both.
  await w1.query('COMMIT');
  assert.deepEqual(await step(), { outcome: 'advanced', safe_seq: '2' });
  assert.deepEqual(await page(), [1, 2]);
  const calls = (await observer.query('SELECT is_called FROM public.planted_calls')).rows[0];
  assert.equal(calls.is_called, false, 'the planted operator never ran, with anyone\'s rights');
});
