#!/usr/bin/env python3
"""Follow a tidemark stream from Python, exactly once, through the SQL contract.

Copies each event of STREAM into the table event_log, in the page's own
transaction, so the copy and the cursor commit together: a page that fails
or is killed halfway leaves neither, and is read again. Any language with a
PostgreSQL driver consumes the same way (docs/PROTOCOL.md, section 6).

Run: DATABASE_URL=postgres://... python3 examples/consumer.py CONSUMER STREAM
Needs psycopg2 (Debian: apt-get install python3-psycopg2). Stops on SIGTERM or
SIGINT after the page in progress.
"""
import os
import select
import signal
import sys
import time

import psycopg2
import psycopg2.extras

PAGE_SIZE = 100
CONTENTION = 'TM001'  # another session holds this cursor: try again later
RESYNC = 'TM002'  # retention removed events above the cursor: rebuild
# Retry the page after these; anything else is a bug or a broken handler.
RETRYABLE = {CONTENTION, '40001', '40P01', '55P03', '57P01', '57P03', '53300'}

stopping = False


def stop(signum, frame):
    global stopping
    stopping = True


def apply_page(conn, consumer, stream):
    """One page: returns how many events it applied (and committed)."""
    with conn:  # COMMIT when the block ends, ROLLBACK if it raises
        with conn.cursor() as cur:
            cur.execute(
                'SELECT seq, kind, key, payload, headers FROM tidemark.read_page(%s, %s, %s)',
                (consumer, stream, PAGE_SIZE),
            )
            events = cur.fetchall()
            for seq, kind, key, payload, headers in events:
                cur.execute(
                    'INSERT INTO event_log (seq, kind, key, payload, headers) VALUES (%s, %s, %s, %s, %s)',
                    (seq, kind, key, psycopg2.extras.Json(payload), psycopg2.extras.Json(headers)),
                )
            if events:
                cur.execute('SELECT tidemark.advance_cursor(%s, %s, %s)', (consumer, stream, events[-1][0]))
    return len(events)


def main():
    if len(sys.argv) != 3:
        sys.exit('usage: consumer.py CONSUMER STREAM')
    consumer, stream = sys.argv[1], sys.argv[2]
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)

    conn = psycopg2.connect(os.environ['DATABASE_URL'], application_name='tidemark-python')
    conn.set_session(isolation_level='REPEATABLE READ')
    with conn, conn.cursor() as cur:
        cur.execute(
            '''CREATE TABLE IF NOT EXISTS event_log (
                 position bigint GENERATED ALWAYS AS IDENTITY,
                 seq bigint PRIMARY KEY, kind text NOT NULL, key text NOT NULL,
                 payload jsonb NOT NULL, headers jsonb NOT NULL)'''
        )
    # The watermarker NOTIFYs tidemark_watermark when safe_seq moves: wait for
    # that after a short page instead of polling hard.
    listen = psycopg2.connect(os.environ['DATABASE_URL'], application_name='tidemark-python-listen')
    listen.autocommit = True
    listen.cursor().execute('LISTEN tidemark_watermark')

    delay = 0.05
    while not stopping:
        try:
            applied = apply_page(conn, consumer, stream)
        except psycopg2.Error as err:
            if err.pgcode == RESYNC:
                with conn, conn.cursor() as cur:
                    cur.execute('SELECT cursor, pruned_through FROM tidemark.note_resync(%s, %s)', (consumer, stream))
                print(f'resync required: {err.diag.message_primary}; rebuild, then start again', file=sys.stderr)
                sys.exit(3)
            if err.pgcode not in RETRYABLE:
                raise
            print(f'page rolled back ({err.pgcode}), retrying: {err.diag.message_primary}', file=sys.stderr, flush=True)
            time.sleep(delay)
            delay = min(delay * 2, 5)
            continue
        delay = 0.05
        if applied:
            print(f'applied {applied} events', flush=True)
        if applied < PAGE_SIZE and not stopping:
            if select.select([listen], [], [], 1.0)[0]:
                listen.poll()
                listen.notifies.clear()
    conn.close()
    listen.close()


if __name__ == '__main__':
    main()
