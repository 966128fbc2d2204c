import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { openSync, closeSync } from 'node:fs';
import { after, test } from 'node:test';
import { Watermarker } from '../../src/index.js';
import { closeAdmin, testDb, type TestDb } from '../support/db.js';
import { cliShell, exited, startCli } from '../support/cli.js';

after(closeAdmin);


/** `n` published events on stream `s`. */
async function seed(db: TestDb, n: number): Promise<void> {
  await db.observer.query(`INSERT INTO tidemark.events (stream, kind, key, payload) SELECT 's', 'k', 'key-' || i, jsonb_build_object('i', i) FROM generate_series(1, $1) i`, [n]);
  const watermarker = new Watermarker(db.pool());
  assert.equal((await watermarker.step()).outcome, 'advanced');
  await watermarker.close();
}

async function cursor(db: TestDb, consumer: string): Promise<number> {
  const r = await db.observer.query(`SELECT seq FROM tidemark.cursors WHERE consumer = $1`, [consumer]);
  return r.rows[0] ? Number(r.rows[0].seq) : 0;
}

/** Runs a shell command line in which `TIDEMARK` stands for the CLI; resolves with exit code and stderr. */
function sh(line: string, env: NodeJS.ProcessEnv): Promise<{ code: number; stderr: string }> {
  const child = spawn('sh', ['-c', line.replace('TIDEMARK', cliShell)], {
    env: { ...process.env, ...env },
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  let stderr = '';
  child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  return new Promise((resolve) => child.once('close', (code) => resolve({ code: code ?? -1, stderr })));
}

test('tail --once to a full disk exits 1 with one line and leaves the cursor where it was', async (t) => {
  const db = await testDb(t);
  await seed(db, 50);
  const full = openSync('/dev/full', 'w');
  const child = startCli(['tail', '--consumer', 'c', '--stream', 's', '--once', '--batch', '20'], { env: { DATABASE_URL: db.url }, stdout: full });
  child.stdin!.end();
  closeSync(full);
  let stderr = '';
  child.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
  assert.equal(await exited(child), 1);
  assert.match(stderr, /^tidemark: cannot write to stdout: .*ENOSPC.*the cursor stays at the last line written\n$/);
  assert.equal(await cursor(db, 'c'), 0, 'nothing was written, nothing committed');
});

test('tail whose reader closed the pipe before reading anything commits nothing and exits 0', async (t) => {
  const db = await testDb(t);
  await seed(db, 50);
  for (const mode of [['--once'], []]) {
    const consumer = `c${mode.length}`;
    const child = startCli(['tail', '--consumer', consumer, '--stream', 's', '--batch', '20', ...mode], { env: { DATABASE_URL: db.url } });
    child.stdout!.destroy(); // the reader is gone before the first line
    let stderr = '';
    child.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
    assert.equal(await exited(child), 0, stderr);
    assert.match(stderr, /stdout was closed by its reader/);
    assert.equal(await cursor(db, consumer), 0, `${mode.join(' ') || 'follow'}: the cursor did not pass what was written`);
  }
});

test('tail | head -n N: the cursor stops at a page stdout accepted, never at a line it could not write', async (t) => {
  const db = await testDb(t);
  await seed(db, 3000);
  const r = await sh('TIDEMARK tail --consumer h --stream s --batch 100 | head -n 250 > /dev/null', { DATABASE_URL: db.url });
  assert.equal(r.code, 0, r.stderr);
  assert.match(r.stderr, /^tidemark: stdout was closed by its reader; the cursor stays at the last line written \(seq \d+\)\n$/, 'one line, no raw EPIPE');
  const at = await cursor(db, 'h');
  assert.ok(at >= 250, `head read 250 lines; the cursor is at ${at}`);
  assert.equal(at % 100, 0, `commits are per page of 100 written lines; the cursor is at ${at}`);
  assert.ok(at < 3000, `the pages after the reader left were rolled back; the cursor is at ${at}`);
});

test('tail with a closed stdout (>&-) or stdout on /dev/null refuses to start: exit 2, cursor untouched', async (t) => {
  const db = await testDb(t);
  await seed(db, 10);
  for (const redirect of ['>&-', '> /dev/null']) {
    const r = await sh(`exec TIDEMARK tail --consumer n --stream s --once ${redirect}`, { DATABASE_URL: db.url });
    assert.equal(r.code, 2, `${redirect}: ${r.stderr}`);
    assert.equal(r.stderr, 'tidemark: stdout is /dev/null or closed: tail would advance the cursor past lines nobody can read; to skip to the present, run: tidemark cursor set --consumer n --stream s --to now\n');
    assert.equal(await cursor(db, 'n'), 0);
  }
});
