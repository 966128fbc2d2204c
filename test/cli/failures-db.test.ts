/**
 * One line and the documented exit code for what a reachable server
 * refuses (docs/ERRORS.md, "Command line"): a database that does not
 * exist, a schema never migrated, a wrong password, an invalid event, an
 * --http address that cannot be bound. The network failures are in
 * failures.test.ts. Real processes, against this test's database.
 */
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import pg from 'pg';
import { cli } from '../support/cli.js';
import { closeAdmin, testDb } from '../support/db.js';
import { assertOneLine, DATABASE, USAGE } from './one-line.js';

after(closeAdmin);

function withUrl(url: string, change: (u: URL) => void): string {
  const u = new URL(url);
  change(u);
  return u.toString();
}

test('a missing database, a wrong password and an unmigrated schema: one line each', async (t) => {
  const db = await testDb(t);
  const [missing, unmigrated, tail] = await Promise.all([
    cli(['status', '--database-url', withUrl(db.url, (u) => (u.pathname = '/no_such_database_here'))]),
    cli(['status', '--schema', 'some_unmigrated_schema', '--database-url', db.url]),
    cli(['tail', '--consumer', 'c', '--stream', 's', '--once', '--schema', 'some_unmigrated_schema', '--database-url', db.url]),
  ]);
  assertOneLine(missing, DATABASE, /database "no_such_database_here" does not exist on .*; create it/, 'missing database');
  assertOneLine(unmigrated, USAGE, /schema "some_unmigrated_schema" in .* is not migrated .*run `tidemark migrate --schema some_unmigrated_schema`/, 'unmigrated');
  assertOneLine(tail, USAGE, /is not migrated/, 'unmigrated tail');
  // serve, with every role, and the relay: at start, not retried forever; the relay before it touches the broker.
  const [serveMissing, serveUnmigrated, relayUnmigrated] = await Promise.all([
    cli(['serve', '--roles', 'watermarker,pruner', '--database-url', withUrl(db.url, (u) => (u.pathname = '/no_such_database_here'))]),
    cli(['serve', '--schema', 'some_unmigrated_schema', '--database-url', db.url]),
    cli(['relay', '--to', 'nats://127.0.0.1:1', '--consumer', 'r', '--stream', 's', '--create-stream', '--schema', 'some_unmigrated_schema', '--database-url', db.url]),
  ]);
  assertOneLine(serveMissing, DATABASE, /database "no_such_database_here" does not exist on .*; create it/, 'serve, missing database');
  assertOneLine(serveUnmigrated, USAGE, /schema "some_unmigrated_schema" in .* is not migrated/, 'serve, unmigrated');
  assertOneLine(relayUnmigrated, USAGE, /schema "some_unmigrated_schema" in .* is not migrated/, 'relay, unmigrated, before the broker (nothing listens at :1)');

  const wrong = withUrl(db.url, (u) => (u.password = 'not-the-password'));
  const probe = new pg.Client({ connectionString: wrong });
  const accepted = await probe.connect().then(
    () => true,
    () => false,
  );
  await probe.end().catch(() => undefined);
  if (accepted) {
    t.skip('this server accepts any password (trust authentication): a wrong password cannot be tested here');
    return;
  }
  const denied = await cli(['status', '--database-url', wrong]);
  assertOneLine(denied, DATABASE, /password authentication failed for user "\w+" at .*; check the password/, 'wrong password');
  assert.doesNotMatch(denied.stderr, /not-the-password/);
  // A refused login is permanent: serve, tail and the relay exit at once (the test's timeout ends a retry loop).
  const noPassword = withUrl(db.url, (u) => (u.password = ''));
  const [serveDenied, tailDenied, relayDenied, serveNoPassword, statusNoPassword] = await Promise.all([
    cli(['serve', '--database-url', wrong]),
    cli(['tail', '--consumer', 'c', '--stream', 's', '--database-url', wrong]),
    cli(['relay', '--to', 'nats://127.0.0.1:1', '--consumer', 'r', '--stream', 's', '--database-url', wrong]),
    cli(['serve', '--database-url', noPassword]),
    cli(['status', '--database-url', noPassword]),
  ]);
  assertOneLine(serveDenied, DATABASE, /password authentication failed/, 'serve, wrong password');
  assertOneLine(tailDenied, DATABASE, /password authentication failed/, 'tail, wrong password');
  assertOneLine(relayDenied, DATABASE, /password authentication failed/, 'relay, wrong password');
  // The server asks for a password and none was given (SCRAM or md5): said so, not node-postgres' "client password must be a string".
  for (const [r, what] of [[serveNoPassword, 'serve'], [statusNoPassword, 'status']] as const) {
    assertOneLine(r, DATABASE, /password/, `${what}, no password`);
    assert.doesNotMatch(r.stderr, /must be a string/, `${what}, no password`);
  }
});

test('an invalid event exits 2 with one line, from flags or from NDJSON', async (t) => {
  const db = await testDb(t);
  const [fromFlags, fromNdjson] = await Promise.all([
    cli(['append', '--stream', 's', '--kind', 'k', '--key', '', '--database-url', db.url]),
    cli(['append', '--ndjson', '--database-url', db.url], { input: '{"stream":"s","kind":"k"}\n' }),
  ]);
  assertOneLine(fromFlags, USAGE, /--key: must be a non-empty string/, 'invalid event from flags');
  assertOneLine(fromNdjson, USAGE, /line 1: key: must be a non-empty string/, 'invalid event from NDJSON');
});

test('serve --http on an address that cannot be bound: one line, exit 2', async (t) => {
  const db = await testDb(t);
  const r = await cli(['serve', '--roles', 'pruner', '--http', '1.2.3.4:9464', '--database-url', db.url]);
  assertOneLine(r, USAGE, /--http: cannot listen on 1\.2\.3\.4:9464: /, 'unbindable --http');
});

test('serve against a schema of an older version (no owner_claims yet): one line at start, exit 2, not a retry loop', async (t) => {
  const db = await testDb(t);
  await db.observer.query('DROP TABLE tidemark.owner_claims'); // what schema version 8 lacks
  const serve = await cli(['serve', '--roles', 'watermarker', '--database-url', db.url]);
  assertOneLine(serve, USAGE, /schema "tidemark" in .* is not migrated \(relation "tidemark\.owner_claims" does not exist\); run `tidemark migrate` against this database first/, 'serve, version 8');
});
