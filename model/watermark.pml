/*
 * tidemark's watermark step as a Promela model: writers, the watermarker
 * and a consumer, every interleaving of them. `npm run model` checks it
 * with spin, and checks that spin finds the violation in each mutant:
 *   -DNO_HOLDER_CHECK     publish S without looking at the writers in flight
 *   -DNO_CANDIDATE_CHECK  publish a remembered observation while its writers run
 *   -DNO_ORPHAN_RULE      let a holder without a backend clear an observation
 *   -DH_BEFORE_S          read the writers in flight before S
 *
 * What is modelled (docs/PROTOCOL.md section 3):
 * - three writers, one transaction each (more transactions per writer
 *   are the same as more writers: a new transaction has a new id); each
 *   takes the shared fence (becomes a holder under its virtualtransaction
 *   id) before it draws a number; writer 0 may draw two; then it commits
 *   (its numbers become visible, then it stops holding), aborts (its
 *   numbers will never exist, then it stops holding), or, writer 0 only,
 *   prepares (it keeps holding, same id, no backend) and is committed
 *   later; a restart may rename a prepared holder (-1/<xid>) meanwhile;
 * - a step reads S, then H (pg_locks is one atomic snapshot; a granted
 *   try-lock is the same as an empty snapshot), publishes S when nobody
 *   holds, else remembers (S, H) and publishes the oldest remembered
 *   observations none of whose holders remain, unless a holder without a
 *   backend exists; publication is monotonic;
 * - a consumer page reads safe_seq and the visible events in one snapshot,
 *   delivers those above its cursor in order, and moves its cursor.
 * Checked: no page ever finds an event in flight at or below safe_seq. A
 * page delivers the committed events in (cursor, safe_seq] in order and
 * moves its cursor to safe_seq, so this is what makes every committed
 * event delivered exactly once: one in flight there would commit below the
 * cursor, never to be read.
 */

#ifndef NW
#define NW 3          /* writers */
#endif
#ifndef T
#define T 1           /* transactions per writer */
#endif
#define MAXSEQ (NW * T * 2)   /* numbers the writers can draw */
#define NC 2          /* remembered observations */

/* A virtualtransaction id, unique per writer, transaction and name (a
 * restart renames a prepared one); 0 means none. */
#define VXID(w, t, renamed) (1 + (w) * 2 * T + (t) * 2 + (renamed))

#define NEVER 0
#define INFLIGHT 1
#define COMMITTED 2
#define ABORTED 3

byte seq = 0;                 /* the identity's last value */
byte st[MAXSEQ + 1];          /* each number's fate */
byte holder[NW];              /* virtualtransaction holding the shared fence, 0: none */
bool orphan[NW];              /* that holder has no backend (a prepared transaction) */
byte safe = 0;                /* the published safe_seq */

/* The watermark row's remembered observations, oldest first. */
byte nc = 0;
byte cS[NC];
byte cH[NC * NW];

inline draw(k) {
  atomic { seq < MAXSEQ -> seq++; mine[k] = seq; st[seq] = INFLIGHT; n++ }
}

inline settle(fate) {
  atomic {
    i = 0;
    do
    :: i < n -> st[mine[i]] = fate; i++
    :: else -> break
    od
  }
}

proctype writer(byte w) {
  byte t = 0, i, n;
  byte mine[2];
  do
  :: t < T ->
     n = 0;
     holder[w] = VXID(w, t, 0);                /* the statement trigger: shared fence first */
     draw(0);
     if
     :: w == 0 -> draw(1)      /* writer 0 may draw twice (a second statement) */
     :: skip
     fi;
     if
     :: settle(COMMITTED); holder[w] = 0      /* visible, then the locks go */
     :: settle(ABORTED); holder[w] = 0
     :: w == 0 -> orphan[w] = 1;              /* PREPARE (writer 0): same id, no backend */
        if
        :: holder[w] = VXID(w, t, 1)                 /* a restart renames it -1/<xid> */
        :: skip
        fi;
        settle(COMMITTED);                    /* COMMIT PREPARED */
        atomic { holder[w] = 0; orphan[w] = 0 }
     fi;
     atomic { t++; n = 0; i = 0; mine[0] = 0; mine[1] = 0 }   /* forget locals: fewer states */
  :: else -> break
  od
}

inline overlaps(c, result) {
  result = false;
  j = 0;
  do
  :: j < NW -> if :: cH[c * NW + j] != 0 && cH[c * NW + j] == h[j] -> result = true :: else -> skip fi; j++
  :: else -> break
  od
}

inline shift() {
  /* drop the oldest observation */
  i = 0;
  do
  :: i + 1 < nc ->
     cS[i] = cS[i + 1];
     j = 0;
     do
     :: j < NW -> cH[i * NW + j] = cH[(i + 1) * NW + j]; j++
     :: else -> break
     od;
     i++
  :: else -> break
  od;
  nc--
}

/* pg_locks: one atomic snapshot of the holders, and whether one has no backend */
inline snapshot() {
  atomic {
    orph = false;
    i = 0;
    do
    :: i < NW -> h[i] = holder[i]; orph = orph || orphan[i]; i++
    :: else -> break
    od;
    i = 0
  }
}

proctype watermarker() {
  byte S, publish, i, j;
  byte h[NW];
  bool orph, busy, blocked;
  do
  :: /* one step */
#ifdef H_BEFORE_S
     snapshot();
     S = seq;
#else
     S = seq;       /* (1) */
     snapshot();    /* (2) */
#endif
     /* What follows reads only S, H and the remembered observations, which
      * no writer touches: one deterministic block, ending in the monotonic
      * publication. (Writers acting before it commits could only end more
      * of the transactions it waits for.) */
     d_step {
       publish = 0;
       busy = false;
       i = 0;
       do
       :: i < NW -> busy = busy || h[i] != 0; i++
       :: else -> break
       od;
#ifdef NO_HOLDER_CHECK
       busy = false;
#endif
#ifdef NO_ORPHAN_RULE
       orph = false;
#endif
       if
       :: S <= safe -> skip                                         /* idle */
       :: else ->
          if
          :: !busy -> publish = S; nc = 0
          :: else ->
             if
             :: !orph ->
                do
                :: nc > 0 ->
                   overlaps(0, blocked);
#ifdef NO_CANDIDATE_CHECK
                   blocked = false;
#endif
                   if
                   :: !blocked -> publish = cS[0]; shift()
                   :: else -> break
                   fi
                :: else -> break
                od
             :: else -> skip
             fi;
             if
             :: nc == 0 || cS[nc - 1] < S ->
                if
                :: nc == NC -> nc--                                 /* the newest slot takes it */
                :: else -> skip
                fi;
                cS[nc] = S;
                i = 0;
                do
                :: i < NW -> cH[nc * NW + i] = h[i]; i++
                :: else -> break
                od;
                nc++
             :: else -> skip
             fi
          fi;
          if :: publish > safe -> safe = publish :: else -> skip fi
       fi;
       /* unused slots and locals back to 0: fewer states */
       i = nc * NW;
       do
       :: i < NC * NW -> cH[i] = 0; i++
       :: else -> break
       od;
       i = nc;
       do
       :: i < NC -> cS[i] = 0; i++
       :: else -> break
       od;
       i = 0;
       do
       :: i < NW -> h[i] = 0; i++
       :: else -> break
       od;
       S = 0; publish = 0; i = 0; j = 0; orph = false; busy = false; blocked = false
     }
  od
}

proctype consumer() {
  byte s;
  do
  :: d_step {   /* one page: safe_seq and the events in one snapshot */
       /* The page delivers the committed events above its cursor up to
        * safe_seq, in order, and moves the cursor to safe_seq; an event at
        * or below safe_seq still in flight would commit below the cursor,
        * never to be read. (The cursor itself is left out of the state: it
        * is safe_seq as of the last page, and checking every number at or
        * below safe_seq covers every cursor.) */
       s = 1;
       do
       :: s <= safe -> assert(st[s] != INFLIGHT); s++      /* gap-freedom */
       :: else -> break
       od;
       s = 0
     }
  od
}

init {
  byte w = 0;
  atomic {
    do
    :: w < NW -> run writer(w); w++
    :: else -> break
    od;
    run watermarker();
    run consumer()
  }
}
