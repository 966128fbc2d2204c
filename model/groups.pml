/*
 * tidemark's consumer groups (docs/PROTOCOL.md sections 6.4 and 6.5) as a
 * Promela model: members that beat, leave, page and replay dead letters
 * of a partition, every interleaving of them with the clock. `npm run
 * model` checks it with spin, and checks that spin finds a violation in
 * each mutant:
 *   -DNO_FENCE          advance_partition and the COMMIT trigger do not look
 *                       at the lease (holder and compare-and-set only)
 *   -DCLAIM_FROM_LIVE   a beat takes its partition from a holder whose lease
 *                       has not ended
 *   -DNO_HOLDER_CHECK   lock_partition checks neither holder = me (before
 *                       or after the lock); the lease and split checks stay
 *   -DNO_ROW_LOCK       lock_partition reads the row without FOR NO KEY UPDATE
 *   -DREPLAY_UNFENCED   partition_replay does not write seq = seq (the COMMIT
 *                       fence is not armed, the row is not written)
 *   -DREAD_COMMITTED -DNO_ROW_LOCK -DNO_CAS, with only (1) checked
 *                       (-DNO_P2 -DNO_P3 -DNO_P4; two members, two events,
 *                       TTL 2): a page at READ COMMITTED, without the row
 *                       lock and without seq = cursor_read
 * What each breaks (the checks are listed below): NO_FENCE and
 * REPLAY_UNFENCED (2) only; CLAIM_FROM_LIVE (3) only (it reaches no state
 * the design does not: a live holder's own beat would have given the
 * partition up the same way, and its next page is refused); NO_HOLDER_CHECK
 * (4), and (2) through a replay (its write has no holder condition, and
 * the COMMIT trigger checks the holder's lease, not the replayer's);
 * NO_ROW_LOCK (4) only: (1) to (3) still hold, since a REPEATABLE READ
 * page's write of a row that a commit wrote after its snapshot raises
 * 40001 (first updater wins), with or without the compare-and-set. Exactly
 * once (1) needs one of the snapshot, the row lock, the compare-and-set:
 * without all three, a member that loses the partition and takes it back
 * commits its old page's events a second time. NO_CAS alone changes no
 * state the design reaches.
 * Flags that are not mutants of the SQL but of the model's assumptions or
 * checks: -DNO_CAS (advance without seq = cursor_read), -DREAD_COMMITTED
 * (statement snapshots instead of the page's REPEATABLE READ snapshot, so
 * no 40001), -DNO_P2/-DNO_P3/-DNO_P4 (leave that property unchecked),
 * -DNOSTRADDLE (beats grant exactly TTL).
 *
 * What is modelled:
 * - NM members (default 3), each with a beat process and a page process.
 *   None has joined at the start: each joins at its first beat, which may
 *   come at any time (a member that joins later).
 * - The clock, in ticks, which may advance between any two steps. Leases
 *   are kept as ticks left (0: ended by the clock, or no row), so time is
 *   unbounded with finitely many states: every comparison in the SQL is
 *   "lease_expires_at > clock" and a lease end, once passed, stays passed.
 * - group_beat, atomic (the group's advisory lock makes beats one at a
 *   time; its writes are seen at its commit): renew the own lease to TTL
 *   ticks, or TTL - 1 when the beat's clock read came a tick before its
 *   commit (never shorter than the lease the last beat granted); the live
 *   members by name, the split (partition p to live member p % count);
 *   give up the own partition when not mine, take it when mine and free
 *   or its holder is not live; both skip the row when a transaction has it
 *   locked (SKIP LOCKED; the member's own page is another session, so its
 *   row is skipped too). Every committed write of the row makes the row
 *   newer than every other open snapshot.
 * - leave_group, atomic: delete the own member row (lease ended), give up
 *   the own row unless locked.
 * - A page: one REPEATABLE READ transaction. Its first statement takes the
 *   snapshot and runs lock_partition: holder = me, my lease live, p mine by
 *   the split among the live members, then FOR NO KEY UPDATE (40001 if the
 *   row changed since the snapshot), holder = me again, the cursor read.
 *   Then the handler applies cursor+1 .. to (any to the page returned), or,
 *   as record_partition_dead_letter, sets the next event aside in a page of
 *   one event; then advance_partition: the UPDATE waits for another writer
 *   of the row, raises 40001 if the row changed since the snapshot, else
 *   checks seq = cursor_read, holder = me and my lease as the snapshot has
 *   it > clock (TM008: roll back); then COMMIT: the deferred trigger checks
 *   the lease of the row's holder as the snapshot has it > clock; the
 *   effects and the cursor become visible at once and the lock goes.
 * - A replay (partition_replay): lock_partition as a page, UPDATE seq = seq
 *   (arms the COMMIT fence), the oldest dead letter at or below the cursor,
 *   applied and deleted at COMMIT under the same fence.
 * - Any open transaction may roll back between any two steps: SIGKILL (the
 *   session ends), idle_in_transaction_session_timeout after a SIGSTOP,
 *   lock_timeout, a lost connection, a failing handler.
 * Faults need nothing more: a member SIGKILLed is one whose transaction
 * rolled back and that takes no further step, and a SIGSTOP is a member
 * that takes no step while the clock goes on; both are interleavings of
 * the model. So is a member that does not beat in time: its lease ends,
 * and it may still page, be refused, and beat again later.
 *
 * Abstracted, and why it is sound:
 * - One partition (PART among NP): the checks below are of one row. Pages
 *   and replays of other partitions lock and write other rows only; a beat
 *   decides for each row from that row, the lock on it and the members. So
 *   every run of the whole group, seen from one row, is a run of this
 *   model (a member's transactions on other rows are steps it skips).
 *   check.sh checks PART 1 and PART 0 of 2.
 * - The partition's events: NE events, committed and at or below safe_seq
 *   (above it the watermark model's gap-freedom applies), numbered 1..NE
 *   within the partition. The cursor is an event number; the quiet
 *   partition's move of the cursor to safe_seq passes no event of the
 *   partition and is left out, as are retention and the horizon check.
 * - A handler's effects are in the page's transaction, seen by no one
 *   before COMMIT: they are applied at COMMIT.
 * - One page process per member: the TypeScript member pages a partition
 *   in one loop, one page after the other. Member names are unique (a
 *   default name has the pid and random bytes): a replacement process is
 *   another member.
 * - lock_partition's unlocked checks and its FOR NO KEY UPDATE are one
 *   step. In the design, when the checks pass (holder = me) no other
 *   transaction holds the row (only its holder's page locks it, and a beat
 *   cannot move a locked row), and every step another process can take
 *   between the two either does not touch the row (it commutes with the
 *   lock) or writes it (the lock then raises 40001: a roll back).
 * - Dead letter rows' own locks (FOR UPDATE SKIP LOCKED) are left out: a
 *   replay holds the partition's row, written, before it reads them.
 *
 * Checked (assertions; -E: a process blocked forever is a stopped member):
 * (1) exactly once: no event's effect commits twice (pages and replays),
 *     and each page commits from the committed cursor (the pages of the
 *     partition cover consecutive ranges, in seq order);
 * (2) the fence: a page or replay commits only while its member is the
 *     holder and the lease its last beat granted has not ended by the
 *     clock (leave_group deletes the lease, but a page of the member open
 *     on the row may still commit within it: section 6.4, Leaving);
 * (3) handover: a beat gives the partition to a member only if it was free
 *     (never held, given up) or its holder's lease ended (or it left);
 * (4) mutual exclusion: at most one transaction has passed lock_partition
 *     on the row, it is its holder's, and no beat or leave moves the row
 *     while it is open.
 * Not checked: liveness (every event is eventually committed once the
 * faults stop). It needs fairness and a model of beat timing (a member
 * beats before its lease ends, a page ends within its lease), which this
 * model leaves free; the tests measure it (docs/PROTOCOL.md 6.4).
 */

#ifndef NM
#define NM 3          /* members */
#endif
#ifndef NP
#define NP 2          /* partitions of the group: the split's modulus */
#endif
#ifndef PART
#define PART 1        /* the partition modelled */
#endif
#ifndef NE
#define NE 3          /* its events */
#endif
#ifndef TTL
#define TTL 3         /* the lease, in ticks */
#endif

#ifdef NO_P2
#define P2(c) skip
#else
#define P2(c) assert(c)
#endif
#ifdef NO_P3
#define P3(c) skip
#else
#define P3(c) assert(c)
#endif
#ifdef NO_P4
#define P4(c) skip
#else
#define P4(c) assert(c)
#endif

#define BIT(m) (1 << (m))

/* group_members: ticks until each member's lease ends by the clock (0: ended, or no row) */
byte rem[NM];
/* partition_cursors' row: holder (0: NULL, m + 1: member m), cursor, the
 * transaction holding its row lock (0: none, m + 1: member m's page) */
byte holder;
byte cur;
byte lock;
bool dlt[NE];        /* dead_letters: event i + 1 is set aside */

/* Each member's open transaction (its page process). */
bool opn[NM];        /* has a snapshot */
bool chg[NM];        /* the row was written by a commit after that snapshot */
byte snap[NM];       /* the lease of the row's holder as the snapshot has it, ticks left */
bool snull[NM];      /* the row's holder was NULL in the snapshot */

/* Ghosts. */
byte glease[NM];     /* ticks left of the lease each member's last beat granted */
bool applied[NE];    /* the event's effect is committed */
byte passed;         /* members with a transaction past lock_partition */

/* A committed write of the row: every other open snapshot is now older than it. */
inline touched(self) {
  for (i : 0 .. NM - 1) {
    if
    :: i != self && opn[i] -> chg[i] = 1
    :: else
    fi
  }
}

/* A beat or leave sets the row's holder (it has the row: not locked). */
inline move(to) {
  P4(passed == 0);                                     /* (4) */
  P3(to == 0 || holder == 0 || rem[holder - 1] == 0);  /* (3) */
  holder = to;
  touched(NM)
}

/* The live members: how many, and how many before mm by name. */
inline members(mm) {
  cnt = 0; idx = 0;
  for (i : 0 .. NM - 1) {
    if
    :: rem[i] > 0 -> cnt++; if :: i < mm -> idx++ :: else fi
    :: else
    fi
  }
}

proctype beater(byte m) {
  byte i, cnt, idx;
  bool take;
  do
  :: atomic {   /* group_beat */
       if
       :: rem[m] = TTL
#ifndef NOSTRADDLE
       :: glease[m] < TTL -> rem[m] = TTL - 1   /* its clock read a tick before its commit */
#endif
       fi;
       glease[m] = rem[m];
       members(m);     /* those whose lease ended are deleted: rem 0 either way */
       if
       :: holder == m + 1 && PART % cnt != idx && lock == 0 -> move(0)   /* give up */
       :: else
       fi;
       take = (PART % cnt == idx && holder != m + 1 && lock == 0);
#ifndef CLAIM_FROM_LIVE
       take = take && (holder == 0 || rem[holder - 1] == 0);
#endif
       if
       :: take -> move(m + 1)
       :: else
       fi;
       i = 0; cnt = 0; idx = 0; take = 0
     }
  :: d_step {   /* leave_group */
       rem[m] = 0;
       if
       :: holder == m + 1 && lock == 0 -> move(0)
       :: else
       fi;
       i = 0
     }
  od
}

/* The transaction ends without committing (or after, to reset): its lock
 * goes; locals back to 0 (fewer states). */
inline rollback() {
  if :: lock == m + 1 -> lock = 0 :: else fi;
  passed = passed & ~BIT(m);
  opn[m] = 0; chg[m] = 0; snap[m] = 0; snull[m] = 0;
  cr = 0; to = 0; e = 0; i = 0; cnt = 0; idx = 0; ok = 0; replay = 0; dead = 0
}

proctype pager(byte m) {
  byte cr, to, e, i, cnt, idx;
  bool ok, replay, dead;
idle:
  atomic {
    /* a page, or (when the partition has a dead letter) a replay */
    ok = 0;
    for (i : 0 .. NE - 1) { ok = ok || dlt[i] };
    if
    :: ok -> replay = 1
    :: replay = 0
    fi;
    /* BEGIN ISOLATION LEVEL REPEATABLE READ; the first statement takes the
     * snapshot: lock_partition's checks read it, with the clock now */
    opn[m] = 1; chg[m] = 0;
    snull[m] = (holder == 0);
    snap[m] = (holder == 0 -> 0 : rem[holder - 1]);
    ok = 0;
    if
    :: rem[m] > 0 ->
       members(m);
       ok = (PART % cnt == idx)
    :: else
    fi;
#ifndef NO_HOLDER_CHECK
    ok = ok && holder == m + 1;
#endif
    if
    :: !ok -> rollback(); goto idle      /* TM008 */
    :: else
    fi;
#ifndef NO_ROW_LOCK
    lock == 0;                           /* FOR NO KEY UPDATE: free in the design (see the header) */
#ifndef READ_COMMITTED
    if :: chg[m] -> rollback(); goto idle :: else fi;     /* 40001 */
#endif
    lock = m + 1;
#endif
    cr = cur;     /* the row as locked (without the lock: as the snapshot has it, the same here) */
#ifndef NO_HOLDER_CHECK
    if :: holder != m + 1 -> rollback(); goto idle :: else fi;   /* TM008 */
#endif
    P4(passed == 0 && holder == m + 1);  /* (4) */
    passed = passed | BIT(m)
  };
  /* The handler, then the transaction's write of the row: advance_partition,
   * or the replay's seq = seq. */
  if
  :: atomic {
#ifdef REPLAY_UNFENCED
       replay || lock == 0 || lock == m + 1 ->
       if :: !replay && chg[m] -> rollback(); goto idle :: else fi;
#else
       lock == 0 || lock == m + 1 ->     /* waits for another writer of the row */
#ifndef READ_COMMITTED
       if :: chg[m] -> rollback(); goto idle :: else fi;     /* 40001 */
#endif
#endif
       if
       :: replay ->
          /* the oldest dead letter at or below the cursor */
          e = 0;
          for (i : 1 .. NE) {
            if :: e == 0 && i <= cr && dlt[i - 1] -> e = i :: else fi
          };
          ok = (e != 0)
       :: else ->
          if :: cr == NE -> rollback(); goto idle :: else fi;   /* nothing to read */
          select(to : cr + 1 .. NE);
          if
          :: to == cr + 1 -> dead = 1    /* record_partition_dead_letter */
          :: dead = 0
          fi;
          ok = holder == m + 1;
#ifndef NO_CAS
          ok = ok && cur == cr;
#endif
#ifndef NO_FENCE
#ifdef READ_COMMITTED
          ok = ok && rem[m] > 0;
#else
          ok = ok && !snull[m] && snap[m] > 0;
#endif
#endif
       fi;
       if :: !ok -> rollback(); goto idle :: else fi;   /* TM008, or no dead letter */
#ifdef REPLAY_UNFENCED
       if :: !replay -> lock = m + 1 :: else fi
#else
       lock = m + 1
#endif
     }
  :: atomic { rollback(); goto idle }
  fi;
  if
  :: atomic {   /* COMMIT */
#ifndef NO_FENCE
#ifdef READ_COMMITTED
       ok = holder == 0 || rem[holder - 1] > 0;
#else
       ok = snull[m] || snap[m] > 0;   /* the deferred trigger: NEW.holder's lease, as the snapshot has it */
#endif
#ifdef REPLAY_UNFENCED
       ok = ok || replay;              /* a replay that wrote nothing: no trigger */
#endif
       if :: !ok -> rollback(); goto idle :: else fi;
#endif
       P2(holder == m + 1 && glease[m] > 0);            /* (2) */
       if
       :: replay ->
          assert(!applied[e - 1]);                      /* (1) */
          applied[e - 1] = 1;
          dlt[e - 1] = 0
       :: else ->
          assert(cur == cr);                            /* (1): from the committed cursor */
          for (i : cr + 1 .. to) {
            if
            :: dead && i == cr + 1 -> dlt[i - 1] = 1
            :: else ->
               assert(!applied[i - 1]);                 /* (1) */
               applied[i - 1] = 1
            fi
          };
          cur = to
       fi;
#ifdef REPLAY_UNFENCED
       if
       :: !replay -> touched(m)
       :: else -> skip                  /* wrote nothing */
       fi;
#else
       touched(m);
#endif
       rollback();
       goto idle
     }
  :: atomic { rollback(); goto idle }
  fi
}

active proctype clock() {
  byte i;
  do
  :: d_step {   /* a tick */
       for (i : 0 .. NM - 1) {
         if :: rem[i] > 0 -> rem[i]-- :: else fi;
         if :: glease[i] > 0 -> glease[i]-- :: else fi;
         if :: snap[i] > 0 -> snap[i]-- :: else fi
       };
       i = 0
     }
  od
}

init {
  byte m;
  atomic {
    for (m : 0 .. NM - 1) { run beater(m); run pager(m) };
    m = 0
  }
}
