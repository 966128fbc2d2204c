/**
 * Mutation check of the protocol's tests (`npm run mutate`): for each
 * mutant, a copy of the working tree with one step of the protocol broken
 * on purpose runs the tests that guard that step, and those tests must
 * fail. A mutant that survives means a test asserts less than it says.
 * Uses DATABASE_URL when set (like `npm test`), else the embedded server.
 *
 *   npm run mutate                      every mutant
 *   npm run mutate -- holder-check      the mutants whose id contains a filter
 *   npm run mutate -- --check           only that each mutant's edits apply (seconds)
 */
import { spawn, execFileSync } from 'node:child_process';
import { cp, mkdir, mkdtemp, readFile, rm, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';

interface Mutant {
  id: string;
  /** What the mutant breaks, in the words of docs/PROTOCOL.md. */
  what: string;
  file: string;
  find: string;
  replace: string;
  /** Further edits of the same file, each of text found exactly once. */
  more?: [find: string, replace: string][];
  /** Test file filters that must catch it. */
  tests: string[];
}

/** The current watermark step (version 7 replaced version 4's). */
const STEP = 'sql/migrations/0007_fixed_search_path.sql';
/** The loop's procedure and the writers' fence trigger (version 8 replaced version 7's). */
const LOOP = 'sql/migrations/0008_wake.sql';
/** The current turn of the loop (version 14 replaced version 12's, which replaced version 8's). */
const TICK = 'sql/migrations/0014_token_wait.sql';
const PAGE = 'sql/migrations/0006_sql_consumer.sql';

/** Dead letters (version 13). */
const DEAD = 'sql/migrations/0013_dead_letters.sql';

/** Consumer groups in SQL (version 15). */
const GROUPS = 'sql/migrations/0015_groups.sql';

/** Dead letters of groups (version 16). */
const GROUP_DEAD = 'sql/migrations/0016_group_dead_letters.sql';

/** Re-partitioning groups (version 17, which replaced version 15's beat, partition lock and partition page). */
const REPARTITION = 'sql/migrations/0017_repartition.sql';

const MUTANTS: Mutant[] = [
  {
    id: 'repartition-rows-not-all-held',
    what: 'the switch goes on without holding every partition row: a request committed while it waited leaves a page open beside it',
    file: REPARTITION,
    find: '  IF v_held < v_rows THEN',
    replace: '  IF false THEN',
    tests: ['consumer/groups-repartition-review'],
  },
  {
    id: 'repartition-past-horizon',
    what: 'the switch moves a partition cursor past events retention removed before it applied them, in silence',
    file: REPARTITION,
    find: '  IF v_pruned > v_min THEN',
    replace: '  IF false THEN',
    tests: ['consumer/groups-repartition-review'],
  },
  {
    id: 'repartition-bound-below-cursor',
    what: 'a page of a partition that read past a barrier it did not see is bounded below its own cursor: every advance is refused',
    file: REPARTITION,
    find: '    safe_seq := LEAST(safe_seq, GREATEST(v_barrier, cursor));',
    replace: '    safe_seq := v_barrier;',
    tests: ['consumer/groups-repartition-review'],
  },
  {
    id: 'group-bootstrap-beside-member',
    what: 'a group\'s bootstrap goes on while a member holds a live lease: its pages and the bootstrap both set the cursors',
    file: REPARTITION,
    find: "   ORDER BY m.member LIMIT 1;\n  IF FOUND THEN",
    replace: "   ORDER BY m.member LIMIT 1;\n  IF false THEN",
    tests: ['consumer/groups.test'],
  },
  {
    id: 'repartition-no-cap',
    what: 'a page of the old split reads past a pending re-partition\'s barrier: the new split applies those events again',
    file: REPARTITION,
    find: '  IF v_barrier < safe_seq THEN',
    replace: '  IF false THEN',
    tests: ['consumer/groups-repartition.test', 'consumer/groups-repartition-review'],
  },
  {
    id: 'repartition-no-raise',
    what: 'the switch starts the new split at the barrier recorded, below the cursor of a page that read past it unseen',
    file: REPARTITION,
    find: '  v_barrier := GREATEST(g.barrier, v_max);',
    replace: '  v_barrier := g.barrier;',
    tests: ['consumer/groups-repartition.test', 'consumer/groups-repartition-review'],
  },
  {
    id: 'repartition-undrained',
    what: 'the switch does not wait for the old partitions to apply their events up to the barrier: those are never applied',
    file: REPARTITION,
    find: '  IF v_state.behind > 0 THEN',
    replace: '  IF false THEN',
    tests: ['consumer/groups-repartition.test', 'consumer/groups-repartition-review'],
  },
  {
    id: 'repartition-beside-page',
    what: 'the switch does not wait for the pages open on the group: it reads a cursor an open page is about to move',
    file: REPARTITION,
    find: '      ORDER BY x.partition\n        FOR NO KEY UPDATE;',
    replace: '      ORDER BY x.partition;',
    tests: ['consumer/groups-repartition.test', 'consumer/groups-repartition-review'],
  },
  {
    id: 'repartition-any-count-joins',
    what: 'a new member joins with a count that is neither the group\'s nor the one asked for',
    file: REPARTITION,
    find: '  IF p_partitions <> v_partitions AND p_partitions IS DISTINCT FROM v_next\n',
    replace: '  IF false\n',
    tests: ['consumer/groups-repartition.test', 'consumer/groups-repartition-review'],
  },
  {
    id: 'repartition-waits-on-barrier',
    what: 'a drained partition\'s page shows the barrier as safe_seq: its member pages again at once, over and over, until the switch',
    file: REPARTITION,
    find: '  v_done := {{schema}}.remember_page(v.key, v.cursor, v_through, v_safe, v_last);',
    replace: '  v_done := {{schema}}.remember_page(v.key, v.cursor, v_through, v.safe_seq, v_last);',
    tests: ['consumer/groups-repartition.test', 'consumer/groups-repartition-review'],
  },
  {
    id: 'group-dead-letter-unfenced',
    what: 'a group\'s dead letter moves its partition\'s cursor without the fence: a member whose lease ended records it',
    file: GROUP_DEAD,
    find: '  PERFORM {{schema}}.advance_partition(p_consumer, p_stream, p_partition, p_member, p_seq);',
    replace: `  UPDATE {{schema}}.partition_cursors pc SET seq = p_seq WHERE pc.consumer = p_consumer AND pc.stream = p_stream AND pc.partition = p_partition;`,
    tests: ['consumer/groups-dead-letters'],
  },
  {
    id: 'group-dead-letter-above-cursor',
    what: 'a group\'s dead letter may be filed above its partition\'s cursor, where a page delivers it and a replay delivers it again',
    file: GROUP_DEAD,
    find: 'AND pc.partition = NEW.partition AND pc.seq >= NEW.seq) THEN',
    replace: 'AND pc.partition = NEW.partition) THEN',
    tests: ['consumer/groups-dead-letters'],
  },
  {
    id: 'group-dead-letter-skips',
    what: 'a group\'s dead letter may be an event past its partition\'s next one, skipping the events between',
    file: GROUP_DEAD,
    find: '  IF v_before THEN',
    replace: '  IF false THEN',
    tests: ['consumer/groups-dead-letters'],
  },
  {
    id: 'group-dead-letter-partition-given',
    what: 'a dead letter\'s partition is taken from the insert rather than from its key',
    file: GROUP_DEAD,
    find: '  NEW.partition := NULL;\n',
    replace: '  RETURN NEW;\n',
    tests: ['consumer/groups-dead-letters'],
  },
  {
    id: 'group-replay-any-member',
    what: 'a group\'s dead letter is replayed by a member that does not hold its partition',
    file: GROUP_DEAD,
    find: `  SELECT * INTO v FROM {{schema}}.lock_partition('partition_replay', p_consumer, p_stream, p_partition, p_member);`,
    replace: `  SELECT pc.seq AS cursor INTO v FROM {{schema}}.partition_cursors pc WHERE pc.consumer = p_consumer AND pc.stream = p_stream AND pc.partition = p_partition;`,
    tests: ['consumer/groups-dead-letters'],
  },
  {
    id: 'group-replay-commit-unfenced',
    what: 'a replay of a group\'s dead letter commits after its member\'s lease ended',
    file: GROUP_DEAD,
    find: '  UPDATE {{schema}}.partition_cursors pc SET seq = pc.seq\n',
    replace: '  PERFORM 1 FROM {{schema}}.partition_cursors pc\n',
    tests: ['consumer/groups-dead-letters'],
  },
  {
    id: 'group-fence-off',
    what: 'advance_partition commits a page whose member\'s lease ended',
    file: GROUPS,
    find: '                    AND m.lease_expires_at > pg_catalog.clock_timestamp());',
    replace: '                    );',
    tests: ['consumer/groups-sql'],
  },
  {
    id: 'group-claim-from-live',
    what: 'a beat takes its partitions from a holder whose lease is still live',
    file: REPARTITION,
    find: '             AND (x.holder IS NULL OR x.holder <> ALL (v_members))\n',
    replace: '\n',
    tests: ['consumer/groups-sql'],
  },
  {
    id: 'group-page-unlocked',
    what: 'a partition\'s page does not hold its cursor row: a beat moves the partition under an open page',
    file: REPARTITION,
    find: '     FOR NO KEY UPDATE OF pc;',
    replace: '     ;',
    tests: ['consumer/groups-sql'],
  },
  {
    id: 'group-no-idle-timeout',
    what: 'a page leaves the session\'s idle timeout alone: a member paused with a page open keeps its partition',
    file: REPARTITION,
    find: "  PERFORM pg_catalog.set_config('idle_in_transaction_session_timeout', v_ttl_ms::text, true);",
    replace: '',
    tests: ['consumer/groups-sql'],
  },
  {
    id: 'group-index-check-on-caller-path',
    what: 'the member checks for its partition index with an operator resolved on its own search_path',
    file: 'src/consumer/group.ts',
    find: 'indexState: `${s}.partition_index_state($1)`,',
    replace:
      "indexState: `(SELECT ${s}.partition_index_ddl($1) AS ddl, pg_catalog.to_regclass('${schema}.events_partition_' || $1) IS NOT NULL AS present, true AS valid)`,",
    tests: ['schema/hostile-schema'],
  },
  {
    id: 'group-page-ignores-split',
    what: 'a member pages a partition it holds that is another member\'s by the split now: paged back to back, it is never given up',
    file: REPARTITION,
    find: ' OR p_partition % v_live <> v_index) THEN',
    replace: ') THEN',
    tests: ['consumer/groups-sql'],
  },
  {
    id: 'group-quiet-partition-stays',
    what: 'an empty page of a partition leaves its cursor where it is: retention past the other partitions asks it to resync',
    file: REPARTITION,
    find: '       AND pc.updated_at < pg_catalog.now() - interval \'10 seconds\';',
    replace: '       AND false;',
    tests: ['consumer/groups-sql'],
  },
  {
    id: 'group-loops-after-stop',
    what: 'a member stopped while its beat waits starts partition loops when the beat returns',
    file: 'src/consumer/stream-client.ts',
    find: '        // Stopped while the beat ran: start nothing.\n        stop.signal.throwIfAborted();\n',
    replace: '',
    tests: ['consumer/groups.test'],
  },
  {
    id: 'group-dead-letter-fence-ends-member',
    what: 'a dead letter\'s record refused by the fence ends the whole member as a handler\'s failure, not that partition\'s loop',
    file: 'src/consumer/stream-client.ts',
    find: '      if (err instanceof HandlerError && sqlState(err.cause) !== undefined) throw hold.contention(err.cause);',
    replace: '',
    tests: ['consumer/groups-dead-letters'],
  },
  {
    id: 'group-beat-ignores-lease-ends',
    what: 'a member beats only every third of its lease: a dead member\'s partitions move up to a beat interval after its lease ended',
    file: 'src/consumer/stream-client.ts',
    find: '          if (othersEnd !== null) nextBeatMs = Math.min(beatMs, Math.max(30, Math.ceil(othersEnd) + 25));',
    replace: '          void othersEnd;',
    tests: ['consumer/groups.test'],
  },
  {
    id: 'group-backoff-holds-slot',
    what: 'a failing event\'s back-off is waited holding the page slot and its connection',
    file: 'src/consumer/stream-client.ts',
    find: 'const page = await this.deliver(hold, handler, o.batchSize, signal, wake, beforeCommit, undefined, policy, tries, sql, true);',
    replace: 'const page = await this.deliver(hold, handler, o.batchSize, signal, wake, beforeCommit, undefined, policy, tries, sql, false);',
    tests: ['consumer/groups.test'],
  },
  {
    id: 'group-partition-unfiltered',
    what: 'a partition\'s page reads every event of the stream, not its partition\'s',
    file: REPARTITION,
    find: "      WHERE e.stream = $1 AND e.seq > $2 AND e.seq <= $3 AND %s = $4\n      ORDER BY e.seq LIMIT $5'",
    replace: "      WHERE e.stream = $1 AND e.seq > $2 AND e.seq <= $3 AND (%s = $4 OR true)\n      ORDER BY e.seq LIMIT $5'",
    tests: ['consumer/groups-sql'],
  },
  {
    id: 'tick-step-ignores-tokens',
    what: 'a step that spends the last whole token plans the fast cadence, and the next turn only finds it may not step',
    file: TICK,
    find: '  IF r.tokens < 1 THEN\n    r.delay_ms := greatest(r.delay_ms, extract(epoch FROM v_t0',
    replace: '  IF r.tokens < 1 AND v_t1 IS NULL THEN\n    r.delay_ms := greatest(r.delay_ms, extract(epoch FROM v_t0',
    tests: ['watermark/loop'],
  },
  {
    id: 'tick-look-ignores-tokens',
    what: 'a look with less than a whole token plans the fast cadence, and the next turns only find they may not step',
    file: TICK,
    find: '  IF r.tokens < 1 THEN\n    r.delay_ms := greatest(r.delay_ms, extract(epoch FROM v_t0',
    replace: '  IF r.tokens < 1 AND v_t1 IS NOT NULL THEN\n    r.delay_ms := greatest(r.delay_ms, extract(epoch FROM v_t0',
    tests: ['watermark/loop'],
  },
  {
    id: 'tick-token-wait-after-step',
    what: 'the wait for the next token runs from the step\'s end, not the turn\'s start: a slow step sleeps a whole interval more',
    file: TICK,
    find: '    r.delay_ms := greatest(r.delay_ms, extract(epoch FROM v_t0 - pg_catalog.clock_timestamp()) * 1000\n',
    replace: '    r.delay_ms := greatest(r.delay_ms, 0\n',
    tests: ['watermark/loop'],
  },
  {
    id: 'dead-letter-no-advance',
    what: 'record_dead_letter records the event but leaves the cursor before it (a SQL consumer may advance short of it)',
    file: DEAD,
    find: '  PERFORM {{schema}}.advance_cursor(p_consumer, p_stream, p_seq);\n',
    replace: '',
    tests: ['consumer/failures'],
  },
  {
    id: 'dead-letter-any-event',
    what: 'record_dead_letter sets aside an event that is not the next above the cursor',
    file: DEAD,
    find: '  IF EXISTS (SELECT 1 FROM {{schema}}.events e\n              WHERE e.stream = p_stream AND e.seq > (v_page ->> 2)::bigint AND e.seq < p_seq) THEN',
    replace: '  IF false THEN',
    tests: ['consumer/failures'],
  },
  {
    id: 'dead-letter-forged-content',
    what: 'a dead letter keeps the content its insert gave, not the stored event\'s',
    file: DEAD,
    find: '  SELECT e.kind, e.key, e.payload, e.headers, e.occurred_at\n    INTO NEW.kind, NEW.key, NEW.payload, NEW.headers, NEW.occurred_at\n',
    replace: '  PERFORM 1\n',
    tests: ['consumer/failures'],
  },
  {
    id: 'dead-letter-transient-counted',
    what: 'a deadlock in the handler counts as a try (and dead-letters the event)',
    file: 'src/consumer/stream-client.ts',
    find: '        if (before === undefined || isRetryable(err)) throw err;',
    replace: '        if (before === undefined) throw err;',
    tests: ['consumer/failures'],
  },
  {
    id: 'dead-letter-tries-outlive-cursor',
    what: 'the tries of an event go on after the cursor passed it',
    file: 'src/consumer/stream-client.ts',
    find: '        if (failing !== undefined && page.cursor >= failing) {',
    replace: '        if (failing !== undefined && page.cursor >= failing && tries.attempts >= policy.maxAttempts) {',
    tests: ['consumer/failures'],
  },
  {
    id: 'dead-letter-prefix-skipped',
    what: 'the events before a failing one are not delivered again first: the failing one is tried as the first of a full page',
    file: 'src/consumer/stream-client.ts',
    find: '        tries.before = before;\n',
    replace: '        tries.before = 0;\n',
    tests: ['consumer/failures'],
  },
  {
    id: 'dead-letter-survives-set-back',
    what: 'a cursor set back keeps the dead letters of the events it delivers again',
    file: 'src/consumer/cursors.ts',
    find: 'd.stream = $2 AND d.seq > $3)',
    replace: 'd.stream = $2 AND d.seq > $3 AND false)',
    tests: ['consumer/failures'],
  },
  {
    id: 'dead-letter-survives-bootstrap',
    what: 'a bootstrap keeps the dead letters of the events its rebuild holds',
    file: 'src/consumer/page.ts',
    find: 'd.stream = $2 AND d.seq <= $3)',
    replace: 'd.stream = $2 AND d.seq <= $3 AND false)',
    tests: ['consumer/failures'],
  },
  {
    id: 'dead-letter-replay-abort-counted',
    what: 'a replay stopped midway counts as a failed try and loses its request',
    file: 'src/consumer/stream-client.ts',
    find: 'if (hold.isBroken || signal.aborted || isRetryable(failure)) {',
    replace: 'if (hold.isBroken || (signal.aborted && err === signal.reason) || isRetryable(failure)) {',
    tests: ['consumer/failures'],
  },
  {
    id: 'dead-letter-replay-socket-transient',
    what: "a replay's handler failing with a socket error ends the tail as a transient failure (a page counts it as a try)",
    file: 'src/consumer/stream-client.ts',
    find: 'if (hold.isBroken || signal.aborted || isRetryable(failure)) {',
    replace: 'if (hold.isBroken || signal.aborted || isRetryable(err)) {',
    tests: ['consumer/failures'],
  },
  {
    id: 'dead-letter-replay-savepoint-gone',
    what: "a replay whose handler ended the transaction itself breaks the tail instead of counting a try",
    file: 'src/consumer/stream-client.ts',
    find: '          await hold.rollback();\n          inTransaction = false;',
    replace: '          throw gone;',
    tests: ['consumer/failures'],
  },
  {
    id: 'dead-letter-replay-starves-pages',
    what: 'a dead letter asked for again at every failed replay is replayed again in the same pass, forever',
    file: 'src/consumer/page.ts',
    find: 'AND d.id <> ALL($3::pg_catalog.int8[])',
    replace: 'AND $3::pg_catalog.int8[] IS NOT NULL',
    tests: ['consumer/failures'],
  },
  {
    id: 'dead-letter-replay-not-deleted',
    what: 'a replayed dead letter stays: the next replay request applies it again',
    file: 'src/consumer/page.ts',
    find: '    replayed: `DELETE FROM ${s}.dead_letters WHERE id = $1`,',
    replace: '    replayed: `SELECT $1::bigint`,',
    tests: ['consumer/failures', 'cli/dead-letters'],
  },
  {
    id: 'dead-letter-replay-clears-new-request',
    what: "a failed replay notes its try after rolling back, when the row is free: a request made meanwhile is cleared",
    file: 'src/consumer/stream-client.ts',
    find: "          await hold.query('ROLLBACK TO SAVEPOINT tidemark_replay');\n        } catch (gone) {",
    replace: "          await hold.query('ROLLBACK');\n          inTransaction = false;\n        } catch (gone) {",
    tests: ['consumer/failures'],
  },
  {
    id: 'owner-claim-ignored-run',
    what: 'watermarker: run the loop though another live instance claims the owner',
    file: 'src/watermark/loop.ts',
    find: '      if (!claim.claimed) return { refused: claim };',
    replace: '      if (claim.claimed === null) return { refused: claim };',
    tests: ['watermark/owner-claim', 'cli/serve'],
  },
  {
    id: 'claim-after-wake',
    what: 'watermarker: the run a writer wakes claims the owner first (a round trip on the wake-up path) instead of using the claim made as the sleep began',
    file: 'src/watermark/loop.ts',
    find: '      const fresh = ahead !== undefined && performance.now() - ahead.at <= o.summaryIntervalMs && Date.now() - ahead.sentAt <= o.summaryIntervalMs;',
    replace: '      const fresh = false && ahead !== undefined;',
    tests: ['watermark/wake'],
  },
  {
    id: 'claim-ahead-stale',
    what: 'watermarker: a claim made ahead is judged by the wall clock alone (a process that stalled while the clock was set back runs on a claim that may lapse)',
    file: 'src/watermark/loop.ts',
    find: '      const fresh = ahead !== undefined && performance.now() - ahead.at <= o.summaryIntervalMs && Date.now() - ahead.sentAt <= o.summaryIntervalMs;',
    replace: '      const fresh = ahead !== undefined && Date.now() - ahead.sentAt <= o.summaryIntervalMs;',
    tests: ['watermark/wake'],
  },
  {
    id: 'claim-ahead-wall-clock',
    what: 'watermarker: a claim made ahead is judged by the monotonic clock alone (a host suspended past the claim runs on it)',
    file: 'src/watermark/loop.ts',
    find: '      const fresh = ahead !== undefined && performance.now() - ahead.at <= o.summaryIntervalMs && Date.now() - ahead.sentAt <= o.summaryIntervalMs;',
    replace: '      const fresh = ahead !== undefined && performance.now() - ahead.at <= o.summaryIntervalMs;',
    tests: ['watermark/wake'],
  },
  {
    id: 'claim-ahead-error-swallowed',
    what: 'watermarker: a claim made ahead that fails is ignored, and the loop sleeps on (on a connection that may be gone)',
    file: 'src/watermark/loop.ts',
    find: '      this.claimedAhead = { failed: err };\n      return \'closed\';',
    replace: '      void err;',
    tests: ['watermark/wake'],
  },
  {
    id: 'owner-claim-ignored-step',
    what: 'watermarker: step() though another live instance claims the owner',
    file: 'src/watermark/watermarker.ts',
    find: '      if (!claim.claimed) {',
    replace: '      if (claim.claimed === null) {',
    tests: ['watermark/owner-claim'],
  },
  {
    id: 'owner-claim-no-patience',
    what: 'watermarker: refuse at the first sight of another claim, though it may be a dead process\'s',
    file: 'src/watermark/watermarker.ts',
    find: '            if (refusedBy?.first.instance !== other.instance) {',
    replace: '            if (refusedBy === undefined) {\n              inUse = ownerInUse(o.owner, other);\n              break;\n            }\n            if (refusedBy?.first.instance !== other.instance) {',
    tests: ['watermark/owner-claim'],
  },
  {
    id: 'owner-fence-off',
    what: 'fence_owner_claim: let a process whose claim another took write the watermark row',
    file: 'sql/migrations/0009_owner_claims.sql',
    find: "    RAISE EXCEPTION 'tidemark: owner % is claimed by another live watermarker instance; instance % wrote nothing', v_owner, v_instance",
    replace: "    RAISE NOTICE 'tidemark: owner % is claimed by another live watermarker instance; instance % wrote nothing', v_owner, v_instance",
    more: [['      USING ERRCODE = \'object_in_use\';', '      ;']],
    tests: ['watermark/owner-claim'],
  },
  {
    id: 'owner-fence-snapshot',
    what: 'fence_owner_claim: decide on a snapshot, not on the claim row locked (a takeover racing the write is missed)',
    file: 'sql/migrations/0009_owner_claims.sql',
    find: '     FOR SHARE;',
    replace: '     ;',
    tests: ['watermark/owner-claim'],
  },
  {
    id: 'owner-claim-never-expires',
    what: 'claim_owner: a claim never expires, so a dead instance\'s owner is never taken over',
    file: 'sql/migrations/0009_owner_claims.sql',
    find: '        OR c.expires_at <= pg_catalog.clock_timestamp()',
    replace: '',
    tests: ['watermark/owner-claim'],
  },
  {
    id: 'owner-release-other',
    what: 'release_owner: release the lease of an owner another live instance claims',
    file: 'sql/migrations/0009_owner_claims.sql',
    find: '  IF FOUND AND c.instance IS DISTINCT FROM p_instance THEN',
    replace: '  IF false THEN',
    tests: ['watermark/owner-claim'],
  },
  {
    id: 'writer-status-no-grant',
    what: 'grant_writer: no read of the watermark, so status is refused for a writer role',
    file: 'sql/migrations/0010_writer_status.sql',
    find: "  EXECUTE pg_catalog.format('GRANT SELECT (safe_seq, updated_at, lease_owner, lease_expires_at) ON {{schema}}.watermark TO %I', p_role);\n",
    replace: '',
    tests: ['schema/roles'],
  },
  {
    id: 'writer-status-upgrade-inherited',
    what: 'migration 10: grant the watermark to every role that may insert a payload, inherited or not',
    file: 'sql/migrations/0010_writer_status.sql',
    find: "       AND x.privilege_type = 'INSERT'\n",
    replace: "       AND x.privilege_type = 'INSERT'\n    UNION SELECT r2.rolname FROM pg_catalog.pg_roles r2 WHERE pg_catalog.has_column_privilege(r2.oid, '{{schema}}.events'::pg_catalog.regclass, 'payload', 'INSERT') AND NOT r2.rolsuper\n",
    tests: ['schema/roles'],
  },
  {
    id: 'cursor-admin-no-lock',
    what: 'cursor set/delete: move a cursor a consumer holds',
    file: 'src/consumer/cursors.ts',
    find: '      if (!free) {',
    replace: '      if (free === undefined) {',
    tests: ['cli/cursor-commands'],
  },
  {
    id: 'cursor-admin-below-floor',
    what: 'cursor set: below the retention floor',
    file: 'src/consumer/cursors.ts',
    find: '    if (seq < at.floor) {',
    replace: '    if (seq < 0n) {',
    tests: ['cli/cursor-commands'],
  },
  {
    id: 'cursor-from-overwrites',
    what: '--from: move a cursor that exists',
    file: 'src/consumer/cursors.ts',
    find: '      if (at.from !== null) return { consumer, stream, from: at.from, to: at.from, floor: at.floor, safeSeq: at.safeSeq };',
    replace: '',
    more: [['ON CONFLICT (consumer, stream) DO NOTHING RETURNING seq::text', 'ON CONFLICT (consumer, stream) DO UPDATE SET seq = EXCLUDED.seq RETURNING seq::text']],
    tests: ['cli/cursor-commands'],
  },
  {
    id: 'exact-no-check',
    what: 'a parsed payload: take JSON.parse as it comes, rounding big numbers',
    file: 'src/consumer/exact-json.ts',
    find: '      if (digits <= 15 && !exponent) continue;',
    replace: '      continue;',
    tests: ['consumer/exact-payloads'],
  },
  {
    id: 'exact-precheck-wide',
    what: 'a parsed payload: skip the scan for numbers of 16 digits',
    file: 'src/consumer/exact-json.ts',
    find: 'const MAYBE_INEXACT = /\\d[\\d.]{15}|[eE][+-]?\\d/;',
    replace: 'const MAYBE_INEXACT = /\\d[\\d.]{16}|[eE][+-]?\\d/;',
    tests: ['consumer/exact-payloads'],
  },
  {
    id: 'exact-zero-sign',
    what: 'a parsed payload: refuse -0, which is 0',
    file: 'src/consumer/exact-json.ts',
    find: "  if (x.digits === '' || y.digits === '') return x.digits === y.digits; // zero: -0 is 0\n",
    replace: '',
    tests: ['consumer/exact-payloads'],
  },
  {
    id: 'tail-json-reparsed',
    what: 'tail --json: write the parsed payload again instead of its text',
    file: 'src/cli/commands/tail.ts',
    find: '"payload":${event.payloadText}',
    replace: '"payload":${json(JSON.parse(event.payloadText))}',
    tests: ['consumer/exact-payloads'],
  },
  {
    id: 'tail-tsv-unescaped',
    what: 'tail (TSV): write fields as they are',
    file: 'src/cli/commands/tail.ts',
    find: "].map(tsvField).join('\\t');",
    replace: "].join('\\t');",
    tests: ['consumer/exact-payloads'],
  },
  {
    id: 'nats-body-reparsed',
    what: 'NATS sink: the body re-serialised from the parsed payload',
    file: 'src/relay/sinks/nats/message.ts',
    find: 'const body = encoder.encode(event.payloadText);',
    replace: 'const body = encoder.encode(JSON.stringify(JSON.parse(event.payloadText)));',
    tests: ['consumer/exact-payloads'],
  },
  {
    id: 'holder-check',
    what: 'publish S without the holder check',
    file: STEP,
    find: 'ELSIF pg_catalog.cardinality(v_h) = 0 THEN',
    replace: 'ELSIF true THEN',
    tests: ['watermark/step', 'race/savepoints', 'race/torture', 'consumer/tail'],
  },
  {
    id: 'candidate-holders',
    what: 'publish a remembered observation while its writers still run',
    file: STEP,
    find: '\n            AND NOT ((v_cands[v_keep]).holders OPERATOR(pg_catalog.&&) v_h)',
    replace: '',
    tests: ['watermark/step', 'race/savepoints', 'race/torture'],
  },
  {
    id: 'orphan-rule',
    what: 'let a holder without a backend (a prepared transaction) clear observations',
    file: STEP,
    find: 'IF NOT v_orphan THEN',
    replace: 'IF true THEN',
    tests: ['faults/prepared-restart'],
  },
  {
    id: 'epoch',
    what: 'keep observations of another server lifetime',
    file: STEP,
    find: "CASE WHEN w.candidates_epoch IS NOT DISTINCT FROM v_epoch THEN w.candidates ELSE '{}' END",
    replace: 'w.candidates',
    tests: ['watermark/step'],
  },
  {
    id: 'cache-check',
    what: 'step under a sequence with CACHE > 1',
    file: STEP,
    find: 'IF v_params.cache_size <> 1 OR v_params.increment <= 0 OR v_params.cycle_option THEN',
    replace: 'IF false THEN',
    tests: ['watermark/step'],
  },
  {
    id: 'filenode',
    what: 'keep observations across ALTER SEQUENCE',
    file: STEP,
    find: 'ELSIF v_file IS DISTINCT FROM w.seq_filenode THEN',
    replace: 'ELSIF false THEN',
    tests: ['watermark/step'],
  },
  {
    id: 'rewind-below-safe',
    what: 'step after the sequence was set back below safe_seq',
    file: STEP,
    find: 'ELSIF v_s < w.safe_seq THEN',
    replace: 'ELSIF false THEN',
    tests: ['watermark/step'],
  },
  {
    id: 'rewind-high',
    what: 'keep observations after the sequence was set back',
    file: STEP,
    find: 'IF v_s < w.seq_high THEN',
    replace: 'IF false THEN',
    tests: ['watermark/step'],
  },
  {
    id: 'spread',
    what: 'when the observations are full, replace the newest instead of thinning the middle',
    file: STEP,
    find: 'v_cands := v_cands[1:v_drop - 1] OPERATOR(pg_catalog.||) v_cands[v_drop + 1:];',
    replace: 'v_cands := v_cands[1:31];',
    tests: ['watermark/step'],
  },
  {
    id: 'notify-queue',
    what: 'NOTIFY even when the notification queue is full',
    file: STEP,
    find: 'IF pg_catalog.pg_notification_queue_usage() < 0.5 THEN',
    replace: 'IF true THEN',
    tests: ['faults/notify-queue'],
  },
  {
    id: 'try-lock-release',
    what: 'leave the try-lock held',
    file: STEP,
    find: '    v_free := CASE WHEN pg_catalog.pg_try_advisory_lock({{fence_key}})\n                   THEN pg_catalog.pg_advisory_unlock({{fence_key}}) ELSE false END;',
    replace: '    v_free := CASE WHEN pg_catalog.pg_try_advisory_lock({{fence_key}})\n                   THEN true ELSE false END;',
    tests: ['watermark/step'],
  },
  {
    id: 'notify',
    what: 'publish without the NOTIFY',
    file: STEP,
    find: 'PERFORM pg_catalog.pg_notify({{notify_channel}}, v_new::text);',
    replace: 'NULL;',
    tests: ['watermark/step', 'consumer/listener'],
  },
  {
    id: 'lock-timeout-restore',
    what: 'leave the 200 ms row-wait bound in force for the COMMIT',
    file: STEP,
    find: "    PERFORM pg_catalog.set_config('lock_timeout', v_lock_timeout, true);",
    replace: '    NULL;',
    tests: ['watermark/step'],
  },
  {
    id: 'sleep-in-transaction',
    what: 'sleep between looks inside the transaction holding the sequence lock',
    file: LOOP,
    find: '    COMMIT;\n    r.committed_at := pg_catalog.clock_timestamp();',
    replace: '    r.committed_at := pg_catalog.clock_timestamp();',
    tests: ['watermark/loop'],
  },
  {
    id: 'idle-stop-request',
    what: 'look without checking the lease: an idle loop misses the stop request',
    file: TICK,
    find: 'r.lease_owner, r.lease_expires_at FROM {{schema}}.watermark x;\n      IF r.lease_owner IS DISTINCT FROM r.owner THEN',
    replace: 'r.lease_owner, r.lease_expires_at FROM {{schema}}.watermark x;\n      IF false THEN',
    tests: ['watermark/loop'],
  },
  {
    id: 'search-path',
    what: "resolve the step's holder check on the caller's search_path (version 4's step)",
    file: STEP,
    find: 'LANGUAGE plpgsql VOLATILE\nSET search_path = pg_catalog, pg_temp\nAS $$\n#variable_conflict use_column\nDECLARE\n  w          record;',
    replace: 'LANGUAGE plpgsql VOLATILE\nAS $$\n#variable_conflict use_column\nDECLARE\n  w          record;',
    more: [['OPERATOR(pg_catalog.&&)', '&&']],
    tests: ['schema/search-path'],
  },
  {
    id: 'search-path-missing',
    what: 'a function of the schema without the fixed search_path',
    file: STEP,
    find: 'CREATE FUNCTION {{schema}}.watermarker_finish(r {{schema}}.watermarker_loop) RETURNS {{schema}}.watermarker_loop\nLANGUAGE plpgsql VOLATILE\nSET search_path = pg_catalog, pg_temp\n',
    replace: 'CREATE FUNCTION {{schema}}.watermarker_finish(r {{schema}}.watermarker_loop) RETURNS {{schema}}.watermarker_loop\nLANGUAGE plpgsql VOLATILE\n',
    tests: ['schema/search-path'],
  },
  {
    id: 'unset-sequence',
    what: 'read a sequence that has handed out nothing since it was set as one at 0 (a false rewind)',
    file: STEP,
    find: '    SELECT q.last_value - 1 INTO v_s FROM {{schema}}.events_seq_seq q;',
    replace: '    v_s := 0;',
    tests: ['watermark/step'],
  },
  {
    id: 'unset-sequence-high',
    what: 'a sequence that has handed out nothing since it was set stands at the highest S seen (a number given back is published over its next writer)',
    file: STEP,
    find: '    SELECT q.last_value - 1 INTO v_s FROM {{schema}}.events_seq_seq q;',
    replace: '    v_s := w.seq_high;',
    tests: ['watermark/step'],
  },
  {
    id: 'unset-sequence-next',
    what: 'a sequence that has handed out nothing since it was set stands at the number it hands out next',
    file: STEP,
    find: '    SELECT q.last_value - 1 INTO v_s FROM {{schema}}.events_seq_seq q;',
    replace: '    SELECT q.last_value INTO v_s FROM {{schema}}.events_seq_seq q;',
    tests: ['watermark/step'],
  },
  {
    id: 'loop-unset-idle',
    what: 'the loop never steps while the sequence has handed out nothing since it was set',
    file: TICK,
    find: "\n  IF v_raw IS NULL AND pg_catalog.has_sequence_privilege('{{schema}}.events_seq_seq', 'SELECT') THEN\n    SELECT q.last_value - 1 INTO v_raw FROM {{schema}}.events_seq_seq q;",
    replace: "\n  IF v_raw IS NULL AND pg_catalog.has_sequence_privilege('{{schema}}.events_seq_seq', 'SELECT') THEN\n    v_raw := r.safe_seq;",
    tests: ['watermark/step'],
  },
  {
    id: 'loop-unset-busy',
    what: 'the loop steps on every look while the sequence has handed out nothing since it was set',
    file: TICK,
    find: "\n  IF v_raw IS NULL AND pg_catalog.has_sequence_privilege('{{schema}}.events_seq_seq', 'SELECT') THEN\n    SELECT q.last_value - 1 INTO v_raw FROM {{schema}}.events_seq_seq q;",
    replace: "\n  IF v_raw IS NULL AND pg_catalog.has_sequence_privilege('{{schema}}.events_seq_seq', 'SELECT') THEN\n    v_raw := NULL;",
    tests: ['watermark/step'],
  },
  // The client's check of a payload's size (src/outbox/event.ts): a bound
  // where the exact size is not needed, never a check skipped.
  {
    id: 'payload-size-bound',
    what: 'a bound on the rendered size per unit below what a double renders to',
    file: 'src/outbox/event.ts',
    find: 'export const MAX_RENDERED_BYTES_PER_UNIT = 64;',
    replace: 'export const MAX_RENDERED_BYTES_PER_UNIT = 40;',
    tests: ['outbox/event-size'],
  },
  {
    id: 'payload-fast-escape',
    what: 'skip the scan of a payload that has escapes (\\u0000, lone surrogates)',
    file: 'src/outbox/event.ts',
    find: "json.charCodeAt(0) === 0x7b && !json.includes('\\\\')",
    replace: 'json.charCodeAt(0) === 0x7b',
    tests: ['outbox/limits'],
  },
  // The look puts a step off while the writer of a new number holds the
  // fence (issue 21): for at most one step interval, releasing its try-lock.
  {
    id: 'defer-never',
    what: 'step at once on a number whose writer still holds the fence',
    file: TICK,
    find: '    v_defer := NOT CASE WHEN pg_catalog.pg_try_advisory_lock({{fence_key}})\n                        THEN pg_catalog.pg_advisory_unlock({{fence_key}}) ELSE false END;',
    replace: '    v_defer := false;',
    tests: ['watermark/loop'],
  },
  {
    id: 'defer-forever',
    what: 'put the step off for as long as the fence is held',
    file: TICK,
    find: '     AND v_t0 <= v_defer_end AND v_defer_end < r.deadline THEN',
    replace: '     THEN',
    tests: ['watermark/loop'],
  },
  {
    id: 'defer-past-run',
    what: 'put a step off past the end of the run (a run no longer than the interval never steps)',
    file: TICK,
    find: '     AND v_t0 <= v_defer_end AND v_defer_end < r.deadline THEN',
    replace: '     AND v_t0 <= v_defer_end THEN',
    tests: ['watermark/loop'],
  },
  {
    id: 'defer-stored-candidates',
    what: 'a new run puts its first step off although candidates a run before stored wait',
    file: TICK,
    find: 'SELECT x.safe_seq, (x.candidates[1]).taken_at, x.updated_at INTO r.safe_seq, r.oldest_pending_at, r.last_advance_at',
    replace: 'SELECT x.safe_seq, x.updated_at INTO r.safe_seq, r.last_advance_at',
    tests: ['watermark/loop'],
  },
  {
    id: 'defer-lock-held',
    what: "leave the look's try-lock held",
    file: TICK,
    find: '                        THEN pg_catalog.pg_advisory_unlock({{fence_key}}) ELSE false END;',
    replace: '                        THEN true ELSE false END;',
    tests: ['watermark/loop'],
  },
  {
    id: 'fence-wait-ignores-free',
    what: 'the loop: a step put off waits out its whole deferral though the writer ended (a look per millisecond, version 12, found it free)',
    file: TICK,
    find: '        EXIT WHEN pg_catalog.clock_timestamp() >= v_until\n               OR CASE WHEN',
    replace: '        EXIT WHEN pg_catalog.clock_timestamp() >= v_until\n               OR false AND CASE WHEN',
    tests: ['watermark/loop'],
  },
  {
    id: 'fence-wait-unbounded',
    what: 'the loop: a step put off waits for the fence past the deferral\'s end, as long as writers hold it',
    file: TICK,
    find: '        EXIT WHEN pg_catalog.clock_timestamp() >= v_until\n               OR CASE WHEN',
    replace: '        EXIT WHEN CASE WHEN',
    tests: ['watermark/loop'],
  },
  {
    id: 'fence-wait-past-lease-read',
    what: 'the loop: a step put off waits to the deferral\'s end though the lease (the stop request) is due to be read sooner',
    file: TICK,
    find: "least(v_defer_end, r.lease_seen_at + r.poll_max_ms * interval '1 millisecond')",
    replace: 'v_defer_end',
    tests: ['watermark/loop'],
  },
  // The idle loop sleeps until a writer wakes it (issue 21, §3.13).
  {
    id: 'sleep-no-try-lock',
    what: 'go to sleep without learning that no writer holds the fence',
    file: TICK,
    find: '    r.arming := false;\n    v_sleep := CASE WHEN pg_catalog.pg_try_advisory_lock({{fence_key}}) THEN pg_catalog.pg_advisory_unlock({{fence_key}}) ELSE false END;',
    replace: '    r.arming := false;\n    v_sleep := true;',
    tests: ['watermark/wake'],
  },
  {
    id: 'sleep-no-last-look',
    what: 'go to sleep on the look before the arming, not one after the try-lock',
    file: TICK,
    find: '      IF v_raw IS NOT DISTINCT FROM r.safe_seq AND r.oldest_pending_at IS NULL THEN',
    replace: '      IF r.oldest_pending_at IS NULL THEN',
    tests: ['watermark/wake'],
  },
  {
    id: 'wake-before-fence',
    what: 'the writer reads wake before it holds the fence',
    file: LOOP,
    find: 'BEGIN\n  PERFORM pg_catalog.pg_advisory_xact_lock_shared({{fence_key}});\n  IF pg_catalog.pg_sequence_last_value(',
    replace:
      "DECLARE\n  v_armed boolean := pg_catalog.pg_sequence_last_value('{{schema}}.wake'::pg_catalog.regclass) > pg_catalog.date_part('epoch', pg_catalog.statement_timestamp()) * 1000;\n" +
      'BEGIN\n  PERFORM pg_catalog.pg_advisory_xact_lock_shared({{fence_key}});\n  IF v_armed AND pg_catalog.pg_sequence_last_value(',
    tests: ['watermark/wake'],
  },
  {
    id: 'wake-no-notify',
    what: 'a writer that finds the loop asleep does not wake it',
    file: LOOP,
    find: "      PERFORM pg_catalog.pg_notify({{wake_channel}}, '');",
    replace: '      NULL;',
    tests: ['watermark/wake'],
  },
  {
    id: 'wake-no-disarm',
    what: 'a woken loop leaves wake armed, so writers go on notifying',
    file: TICK,
    find: "    IF pg_catalog.pg_sequence_last_value('{{schema}}.wake'::pg_catalog.regclass) > 0 THEN",
    replace: '    IF false THEN',
    tests: ['watermark/wake'],
  },
  {
    id: 'resume-takes-lease',
    what: 'a resumed run takes again a lease released while it slept',
    file: TICK,
    find: 'r.safe_seq FROM {{schema}}.watermark x;\n      IF r.lease_owner IS DISTINCT FROM r.owner THEN',
    replace: 'r.safe_seq FROM {{schema}}.watermark x;\n      IF false THEN',
    tests: ['watermark/wake'],
  },
  {
    id: 'grace-per-run',
    what: 'the idle grace counts from each run start, so a run that begins in a pause of a flow goes to sleep at once',
    file: TICK,
    find: 'SELECT x.safe_seq, (x.candidates[1]).taken_at, x.updated_at INTO r.safe_seq, r.oldest_pending_at, r.last_advance_at',
    replace: 'SELECT x.safe_seq, (x.candidates[1]).taken_at INTO r.safe_seq, r.oldest_pending_at',
    tests: ['watermark/wake'],
  },
  {
    id: 'wake-no-fallback',
    what: 'the client sleeps until a wake-up, however long none comes',
    file: 'src/watermark/loop.ts',
    find: "const timer = setTimeout(() => finish('timeout'), untilMs - performance.now());",
    replace: 'const timer = setTimeout(() => undefined, 0);',
    tests: ['watermark/wake'],
  },
  // Client statements resolve nothing outside pg_catalog (issue 20): each
  // mutant restores one statement as it was, and a decoy in public runs.
  {
    id: 'hostile-migrate-lock',
    what: "the migrator's lock call with an untyped parameter, unqualified",
    file: 'src/schema/migrate.ts',
    find: "'SELECT pg_catalog.pg_advisory_lock($1::bigint)'",
    replace: "'SELECT pg_advisory_lock($1)'",
    tests: ['schema/hostile-schema'],
  },
  {
    id: 'hostile-cancel',
    what: 'the cancel of a running statement with an untyped parameter, unqualified',
    file: 'src/db/cancellable.ts',
    find: "'SELECT pg_catalog.pg_cancel_backend($1::integer)'",
    replace: "'SELECT pg_cancel_backend($1)'",
    tests: ['schema/hostile-schema'],
  },
  {
    id: 'hostile-relay-lag',
    what: "the relay's lag query with an unqualified (polymorphic) unnest",
    file: 'src/relay/relay.ts',
    find: 'FROM pg_catalog.unnest($2::text[]) AS st(stream)',
    replace: 'FROM unnest($2::text[]) AS st(stream)',
    tests: ['schema/hostile-schema'],
  },
  {
    id: 'hostile-prune',
    what: 'the prune batch divides a float8 by an integer (no exact operator in pg_catalog)',
    file: 'src/retention/pruner.ts',
    find: '$1::float8 / 1000::float8',
    replace: '$1::float8 / 1000',
    tests: ['schema/hostile-schema'],
  },
  {
    id: 'hostile-step-ms',
    what: "step() times itself with a float8 times an integer (no exact operator in pg_catalog)",
    file: 'src/watermark/watermarker.ts',
    find: '::float8 * 1000::float8 AS step_ms',
    replace: '::float8 * 1000 AS step_ms',
    tests: ['schema/hostile-schema'],
  },
  {
    id: 'open-transaction',
    what: 'step on a pooled connection left inside a transaction',
    file: 'src/watermark/watermarker.ts',
    find: '${OPEN_TRANSACTION_CHECK}; ',
    replace: 'SELECT 1; ',
    tests: ['watermark/step'],
  },
  // Recovery (issue 11): each mutant removes one piece of the recovery code.
  {
    id: 'tail-retry',
    what: 'tail rejects on the first retryable error instead of backing off and going on',
    file: 'src/consumer/stream-client.ts',
    find: 'if (!o.retry || signal.aborted || !(err instanceof CursorContentionError ? held : isRetryable(err))) throw err;',
    replace: 'throw err;',
    tests: ['consumer/retry', 'faults/restart', 'faults/blackhole', 'faults/max-connections'],
  },
  {
    id: 'contention-after-loss',
    what: 'tail gives up when its own lingering session still holds the cursor after a lost connection',
    file: 'src/consumer/stream-client.ts',
    find: 'err instanceof CursorContentionError ? held : isRetryable(err)',
    replace: '!(err instanceof CursorContentionError) && isRetryable(err)',
    tests: ['consumer/retry', 'faults/blackhole'],
  },
  {
    id: 'response-deadline',
    what: 'a statement that gets no answer is waited for forever (the dead connection is never dropped)',
    file: 'src/db/deadline.ts',
    find: '    expired = true;\n    destroySocket(client);',
    replace: '    expired = false;',
    tests: ['consumer/retry', 'watermark/dead-connection', 'faults/blackhole'],
  },
  {
    id: 'leader-until',
    what: 'believe in the lease until the next summary or failure, not only until it could expire',
    file: 'src/watermark/watermarker.ts',
    find: 'return this.leader && this.leaderUntil !== null && Date.now() < this.leaderUntil.getTime();',
    replace: 'return this.leader;',
    tests: ['watermark/dead-connection', 'faults/blackhole'],
  },
  {
    id: 'leader-until-late',
    what: 'measure the lease belief from when the answer arrived instead of when the question was sent',
    file: 'src/watermark/loop.ts',
    find: 'return new Date(sentAt + (expiresAt.getTime() - serverAt.getTime()));',
    replace: 'return new Date(Date.now() + (expiresAt.getTime() - serverAt.getTime()));',
    tests: ['watermark/dead-connection'],
  },
  {
    id: 'pruner-backoff',
    what: 'a failed prune pass waits the full interval before it is tried again',
    file: 'src/retention/pruner.ts',
    find: 'pauseMs = backoffMs(failures, RETRY_MIN_MS, Math.min(o.intervalMs, RETRY_MAX_MS));',
    replace: 'pauseMs = o.intervalMs + 0 * backoffMs(failures, RETRY_MIN_MS, RETRY_MAX_MS);',
    tests: ['cli/serve'],
  },
  {
    id: 'driver-errors',
    what: "node-postgres's code-less connection errors are not retryable",
    file: 'src/errors.ts',
    find: 'return err instanceof Error && !(\'code\' in err) && DRIVER_CONNECTION_ERRORS.has(err.message);',
    replace: 'return false && err instanceof Error && DRIVER_CONNECTION_ERRORS.has(err.message);',
    tests: ['consumer/retry'],
  },
  {
    id: 'before-commit',
    what: "a page commits without waiting for tail's stdout to accept its lines",
    file: 'src/consumer/page.ts',
    find: 'if (handled > cursor && beforeCommit) {',
    replace: 'if (false && beforeCommit) {',
    tests: ['cli/tail-output', 'consumer/retry'],
  },
  {
    id: 'lease-release-best-effort',
    what: 'serve fails its shutdown when the lease cannot be released (database down)',
    file: 'src/cli/commands/serve.ts',
    find: "await watermarker?.close().catch((err: unknown) => log(`could not release the lease (${oneLine(err)}); it expires within ${watermarker.options.leaseTtlMs} ms`));",
    replace: 'await watermarker?.close();',
    tests: ['cli/serve'],
  },
  {
    id: 'relay-commit-before-ack',
    what: 'the relay commits its cursor without waiting for the broker\'s acknowledgements',
    file: 'src/relay/relay.ts',
    find: 'await this.sink.publish(part, this.hard.signal);',
    replace: 'void this.sink.publish(part, this.hard.signal).catch(() => undefined);',
    tests: ['relay/relay.test'],
  },
  {
    id: 'relay-retry-everything',
    what: 'the relay retries (and so skips past) an event the broker can never take',
    file: 'src/relay/relay.ts',
    find: 'if (!isRetryable(cause)) throw cause;',
    replace: 'if (!isRetryable(cause) && !(cause instanceof SinkError)) throw cause;',
    tests: ['relay/relay.test'],
  },
  {
    id: 'relay-no-prefix-commit',
    what: 'a page the broker acknowledged only in part commits nothing (a full queue stalls the relay)',
    file: 'src/relay/relay.ts',
    find: 'if (sent > 0) {',
    replace: 'if (sent < 0) {',
    tests: ['relay/relay.test'],
  },
  {
    id: 'relay-refused-not-set-aside',
    what: "with onRefused 'dead-letter', a refused event still stops the relay",
    file: 'src/relay/relay.ts',
    find: 'if (this.setsAside(err, messages.slice(sent))) state.refused = err as SinkError;',
    replace: '',
    tests: ['relay/relay-http'],
  },
  {
    id: 'relay-refused-skipped',
    what: 'a refused event is skipped in silence instead of recorded as a dead letter',
    file: 'src/relay/relay.ts',
    find: 'if (state.refused !== undefined && event.seq === state.refused.seq) throw state.refused;',
    replace: 'if (state.refused !== undefined && event.seq === state.refused.seq) return;',
    tests: ['relay/relay-http'],
  },
  {
    id: 'redis-script-past-refusal',
    what: 'the page script goes on past a refusal, so a later event is stored above one that is not',
    file: 'src/relay/sinks/redis/sink.ts',
    find: '    return {added, reply.err}\n',
    replace: '',
    tests: ['relay/redis-sink'],
  },
  {
    id: 'redis-script-any-refusal-stored',
    what: 'the page script takes any refusal as an entry stored before',
    file: 'src/relay/sinks/redis/sink.ts',
    find: "reply.err ~= nil and reply.err ~= ${JSON.stringify(ALREADY_STORED)}",
    replace: 'false',
    tests: ['relay/redis-sink'],
  },
  {
    id: 'redis-multi-always',
    what: 'the Redis sink never uses the page script',
    file: 'src/relay/sinks/redis/sink.ts',
    find: "this.scripted = await this.scriptAllowed(client, keys.values().next().value ?? 'tidemark', signal);",
    replace: 'this.scripted = false;',
    tests: ['relay/redis-sink'],
  },
  {
    id: 'redis-trace-from-parsed-headers',
    what: "the Redis entry reads the trace context from the parsed headers (which throw on a number JavaScript cannot hold)",
    file: 'src/relay/sinks/redis/entry.ts',
    find: 'const trace = traceContext(event.headersText);',
    replace: 'const trace = traceContext(JSON.stringify(event.headers));',
    tests: ['relay/redis-sink'],
  },
  {
    id: 'redis-part-unguarded',
    what: 'a part of a page is added although the part before it stopped at a refusal',
    file: 'src/relay/sinks/redis/sink.ts',
    find: "if #at < #want or (#at == #want and at < want) then",
    replace: 'if false then',
    tests: ['relay/redis-sink'],
  },
  {
    id: 'redis-noscript-fails',
    what: 'a page sent to a server that lost the page script fails instead of sending the script',
    file: 'src/relay/sinks/redis/sink.ts',
    find: "if (replyCode(err) !== 'NOSCRIPT') throw err;",
    replace: 'throw err;',
    tests: ['relay/redis-sink'],
  },
  {
    id: 'page-global-type-parsers',
    what: "a page's events are parsed with pg's global type parsers, which an application may have changed",
    file: 'src/consumer/page.ts',
    find: 'await hold.query(text, undefined, EVENT_TYPES)',
    replace: 'await hold.query(text)',
    tests: ['db/types'],
  },
  {
    id: 'timestamptz-offset-sign',
    what: "occurred_at's UTC offset is applied with the wrong sign west of Greenwich",
    file: 'src/db/types.ts',
    find: "const at = utc - (sign === 45 ? -offset : offset) * 1000;",
    replace: 'const at = utc - offset * 1000;',
    tests: ['db/types'],
  },
  {
    id: 'timestamptz-offset-minutes',
    what: "occurred_at's UTC offset loses its minutes (India, Newfoundland, Nepal)",
    file: 'src/db/types.ts',
    find: '(tail >= 6 ? digits(value, i + 4, 2) * 60 : 0)',
    replace: '0',
    tests: ['db/types'],
  },
  {
    id: 'trace-context-inherited',
    what: "the trace context is read from a polluted Object.prototype when the headers have none",
    file: 'src/relay/format.ts',
    find: "const traceparent = Object.hasOwn(headers, 'traceparent') ? headers.traceparent : undefined;",
    replace: 'const traceparent = headers.traceparent;',
    tests: ['relay/cloudevents'],
  },
  {
    id: 'relay-replay-unpublished',
    what: "a replayed dead letter of the relay is deleted without being published",
    file: 'src/relay/relay.ts',
    find: 'await this.sink.publish([message], this.hard.signal);\n          return;',
    replace: 'return;',
    tests: ['relay/relay-http'],
  },
  {
    id: 'http-no-key-order',
    what: 'the HTTP sink sends events of one key at once (each its own lane)',
    file: 'src/relay/sinks/http/sink.ts',
    find: 'const lane = byKey.get(message.event.key);',
    replace: 'const lane = byKey.get(String(message.event.seq));',
    tests: ['relay/http-sink'],
  },
  {
    id: 'http-retry-after-ignored',
    what: "the HTTP sink sends again before the receiver's Retry-After",
    file: 'src/relay/sinks/http/sink.ts',
    find: 'Math.min(answer.retryAfterMs, HOUR)',
    replace: '0',
    tests: ['relay/http-sink'],
  },
  {
    id: 'http-webhook-id-per-try',
    what: 'a request sent again carries another webhook-id (receivers cannot deduplicate)',
    file: 'src/relay/sinks/http/sink.ts',
    find: "headers['webhook-id'] = out.id;",
    replace: "headers['webhook-id'] = `${out.id}.${attempt}`;",
    tests: ['relay/http-sink', 'relay/relay-http'],
  },
  {
    id: 'http-4xx-refusal-retried',
    what: 'the HTTP sink sends a refused event again (a 4xx retried for ever, hiding the refusal)',
    file: 'src/relay/sinks/http/sink.ts',
    find: 'const transient = status === 408 || status === 429 || status >= 500;',
    replace: 'const transient = status >= 400;',
    tests: ['relay/http-sink'],
  },
  {
    id: 'http-url-credentials-dropped',
    what: "the HTTP sink sends requests without the URL's credentials (the receiver refuses every one)",
    file: 'src/relay/sinks/http/request.ts',
    find: 'if (ep.authorization !== undefined) headers.authorization = ep.authorization;',
    replace: '',
    tests: ['relay/http-sink'],
  },
  {
    id: 'http-long-answer-read-on',
    what: 'the HTTP sink reads an answer to its end however long (a receiver that streams holds the page for ever)',
    file: 'src/relay/sinks/http/request.ts',
    find: 'if (read > BODY_LIMIT) end(',
    replace: 'if (read < 0) end(',
    tests: ['relay/http-sink'],
  },
  {
    id: 'http-bodyless-length-mismatch-retried',
    what: 'a 204 with a Content-Length is taken as a broken answer and sent again for ever',
    file: 'src/relay/sinks/http/request.ts',
    find: "if (code === LENGTH_MISMATCH && (status === 204 || status === 304)) return { status, retryAfterMs: undefined, snippet: '' };",
    replace: '',
    tests: ['relay/http-sink'],
  },
  {
    id: 'http-unasked-continue-unnamed',
    what: "an unasked-for 100 Continue is retried as undici's bare 'bad response', which names nothing",
    file: 'src/relay/sinks/http/request.ts',
    find: "if (code === 'UND_ERR_SOCKET' && error.message === 'bad response' && sent && status === 0) {",
    replace: 'if (false) {',
    tests: ['relay/http-sink'],
  },
  {
    id: 'http-stale-try-closes-connection',
    what: 'a try ended before it had a connection closes the connection it then gets',
    file: 'src/relay/sinks/http/request.ts',
    find: 'if (ended) throw ended;',
    replace: 'if (ended) c.abort(ended);',
    tests: ['relay/http-sink'],
  },
  {
    id: 'http-unsendable-retried',
    what: 'a request undici refuses to send is a network failure, sent again for ever',
    file: 'src/relay/sinks/http/request.ts',
    find: "if (code === INVALID_ARG) return { failure: 'unsendable', error };",
    replace: '',
    tests: ['relay/http-sink'],
  },
  {
    id: 'http-ce-binary-trace-unchecked',
    what: 'cloudevents-binary copies a tracestate no header can carry (the event can never be sent)',
    file: 'src/relay/sinks/http/message.ts',
    find: 'if (PLAIN_VALUE.test(value)) headers[name] = value;',
    replace: 'headers[name] = value;',
    tests: ['relay/http-sink'],
  },
  {
    id: 'http-connect-unbounded',
    what: 'getting a connection is not bounded by connectTimeoutMs',
    file: 'src/relay/sinks/http/request.ts',
    find: '(connectTimeoutMs)`)), connectTimeoutMs);',
    replace: '(connectTimeoutMs)`)), connectTimeoutMs * 1000);',
    tests: ['relay/http-sink'],
  },
  {
    id: 'http-closed-sent-again',
    what: 'a request failed by close is sent again (a closed sink never lets its publish end)',
    file: 'src/relay/sinks/http/sink.ts',
    find: "if (this.closed) throw new ClosedError('HttpSink');\n      if ('status' in answer",
    replace: "if ('status' in answer",
    tests: ['relay/http-sink'],
  },
  {
    id: 'prefetch-short',
    what: 'use a read-ahead that found fewer than a page (events published since would wait for the next page)',
    file: 'src/consumer/page.ts',
    find: 'if (ahead && ahead.length === limit) {',
    replace: 'if (ahead && ahead.length > 0) {',
    tests: ['consumer/prefetch'],
  },
  {
    id: 'prefetch-cursor',
    what: 'use a read-ahead though the cursor is no longer where it started',
    file: 'src/consumer/page.ts',
    find: 'if (BigInt(info.cursor) === after) rows = ahead;',
    replace: 'if (info) rows = ahead;',
    tests: ['consumer/prefetch'],
  },
  {
    id: 'page-safe-seq',
    what: 'read_page: deliver events above safe_seq',
    file: PAGE,
    find: "     WHERE e.stream = p_stream AND e.seq > v.cursor AND e.seq <= v.safe_seq\n     ORDER BY e.seq\n     LIMIT p_max_events;",
    replace: "     WHERE e.stream = p_stream AND e.seq > v.cursor\n     ORDER BY e.seq\n     LIMIT p_max_events;",
    tests: ['consumer/sql-contract', 'consumer/tail'],
  },
  {
    id: 'page-horizon',
    what: 'read_page: deliver past a retention horizon above the cursor',
    file: PAGE,
    find: 'IF v_pruned > v.cursor THEN',
    replace: 'IF false THEN',
    tests: ['consumer/sql-contract', 'retention/pruner'],
  },
  {
    id: 'page-advisory',
    what: "read_page: page a cursor another session holds",
    file: PAGE,
    find: 'IF NOT pg_catalog.pg_try_advisory_xact_lock(v.key) THEN',
    replace: 'IF false THEN',
    tests: ['consumer/sql-contract', 'consumer/sql-consumers'],
  },
  {
    id: 'page-row-lock',
    what: 'read_page: read the cursor without locking its row',
    file: PAGE,
    find: '  SELECT c.seq INTO v.cursor FROM {{schema}}.cursors c\n   WHERE c.consumer = p_consumer AND c.stream = p_stream FOR NO KEY UPDATE;\n  IF NOT FOUND THEN',
    replace: '  SELECT c.seq INTO v.cursor FROM {{schema}}.cursors c\n   WHERE c.consumer = p_consumer AND c.stream = p_stream;\n  IF NOT FOUND THEN',
    tests: ['retention/pruner'],
  },
  {
    id: 'page-isolation',
    what: 'read_page: page outside REPEATABLE READ',
    file: PAGE,
    find: "IF pg_catalog.current_setting('transaction_isolation') NOT IN ('repeatable read', 'serializable') THEN",
    replace: 'IF false THEN',
    tests: ['consumer/sql-contract'],
  },
  {
    id: 'page-bound',
    what: 'read_page: let a full page advance to safe_seq, past events it did not return',
    file: PAGE,
    find: 'v_through := CASE WHEN v_count < p_max_events THEN v.safe_seq ELSE v_last END;',
    replace: 'v_through := v.safe_seq;',
    tests: ['consumer/sql-contract'],
  },
  {
    id: 'advance-skip',
    what: 'advance_cursor: move past the page',
    file: PAGE,
    find: 'IF p_seq > v_through THEN',
    replace: 'IF false THEN',
    tests: ['consumer/sql-contract'],
  },
  {
    id: 'advance-backwards',
    what: 'advance_cursor: move backwards',
    file: PAGE,
    find: 'IF p_seq < v_at THEN',
    replace: 'IF false THEN',
    tests: ['consumer/sql-contract'],
  },
  {
    id: 'advance-without-read',
    what: 'advance_cursor: move a cursor no page read in this transaction',
    file: PAGE,
    find: 'IF v_page IS NULL THEN',
    replace: 'IF false THEN',
    tests: ['consumer/sql-contract'],
  },
  {
    id: 'client-advance',
    what: "StreamClient: commit a page without advancing its cursor",
    file: 'src/consumer/page.ts',
    find: 'await statement(() => hold.query(sql.commit(consumer, stream, handled > cursor ? handled : undefined)));',
    replace: 'await statement(() => hold.query(sql.commit(consumer, stream, undefined)));',
    tests: ['consumer/tail'],
  },
  {
    id: 'cursor-key',
    what: "a tailer's session lock on another key than a SQL page's",
    file: 'src/consumer/cursor-hold.ts',
    find: '.cursor_lock_key($1, $2)) AS ok`, [consumer, stream]);',
    replace: '.cursor_lock_key($2, $1)) AS ok`, [consumer, stream]);',
    tests: ['consumer/sql-contract'],
  },
  {
    id: 'literal-quoting',
    what: 'send every name as a plain literal',
    file: 'src/db/queryable.ts',
    find: "if (PLAIN_TEXT.test(value)) return `'${value}'`;",
    replace: "return `'${value}'`;",
    tests: ['consumer/sql-contract'],
  },
  {
    id: 'lock-page-count',
    what: 'lock_page: take a read ahead without counting the events in its range',
    file: PAGE,
    find: 'IF v_found <> p_events THEN',
    replace: 'IF false THEN',
    tests: ['consumer/sql-contract'],
  },
  {
    id: 'read-twice',
    what: 'read_page: hand the events of an open page over again',
    file: PAGE,
    find: 'IF (v_page ->> 2)::bigint < (v_page ->> 4)::bigint THEN',
    replace: 'IF false THEN',
    tests: ['consumer/sql-contract'],
  },
  {
    id: 'page-transaction',
    what: "advance_cursor: trust a page entry of another transaction",
    file: 'sql/migrations/0011_page_cost.sql',
    find: '  IF (v_page ->> 5) = pg_catalog.pg_current_xact_id_if_assigned()::text THEN',
    replace: '  IF v_page IS NOT NULL THEN',
    tests: ['consumer/sql-contract'],
  },
  {
    id: 'advance-compare',
    what: 'advance_cursor: move a cursor that is not where the page left it',
    file: PAGE,
    find: '   WHERE c.consumer = p_consumer AND c.stream = p_stream AND c.seq = v_at;',
    replace: '   WHERE c.consumer = p_consumer AND c.stream = p_stream;',
    tests: ['consumer/sql-contract'],
  },
];

const root = new URL('../../', import.meta.url).pathname;

async function copyTree(into: string): Promise<void> {
  const files = execFileSync('git', ['ls-files', '-co', '--exclude-standard'], { cwd: root, encoding: 'utf8' }).split('\n').filter(Boolean);
  for (const file of files) {
    await mkdir(dirname(join(into, file)), { recursive: true });
    await cp(join(root, file), join(into, file)).catch(() => undefined); // deleted but still listed
  }
  await symlink(join(root, 'node_modules'), join(into, 'node_modules'));
}

function runTests(cwd: string, filters: string[]): Promise<{ code: number; failed: string[] }> {
  return new Promise((resolve) => {
    let out = '';
    // A mutant that makes writers wait forever fails by timeout: keep it short.
    const env = { ...process.env, TIDEMARK_TEST_TIMEOUT_MS: '60000' };
    const child = spawn(process.execPath, ['--import', 'tsx', 'test/support/run.ts', ...filters], { cwd, env, stdio: ['ignore', 'pipe', 'pipe'] });
    child.stdout.on('data', (d: Buffer) => (out += d.toString()));
    child.stderr.on('data', (d: Buffer) => (out += d.toString()));
    child.on('exit', (code) => {
      const failed = [...new Set(out.split('\n').filter((l) => /^✖ (?!failing tests)/.test(l)).map((l) => l.replace(/^✖ /, '').replace(/ \(\d.*$/, '')))];
      resolve({ code: code ?? 1, failed });
    });
  });
}

/** `text` with the mutant's edits made; each edit's text must be found exactly once. */
function mutated(m: Mutant, text: string): string {
  for (const [find, replace] of [[m.find, m.replace] as const, ...(m.more ?? [])]) {
    const at = text.split(find).length - 1;
    if (at !== 1) throw new Error(`mutant ${m.id}: expected the text once in ${m.file}, found it ${at} times`);
    text = text.replace(find, () => replace);
  }
  return text;
}

async function main(): Promise<number> {
  const args = process.argv.slice(2);
  const checkOnly = args.includes('--check');
  const filters = args.filter((a) => a !== '--check');
  const mutants = MUTANTS.filter((m) => filters.length === 0 || filters.some((f) => m.id.includes(f)));
  if (checkOnly) {
    for (const m of mutants) mutated(m, await readFile(join(root, m.file), 'utf8'));
    console.log(`${mutants.length} mutants apply`);
    return 0;
  }
  let survivors = 0;
  for (const m of mutants) {
    const dir = await mkdtemp(join(tmpdir(), `tidemark-mutant-${m.id}-`));
    try {
      await copyTree(dir);
      const path = join(dir, m.file);
      await writeFile(path, mutated(m, await readFile(path, 'utf8')));
      const started = Date.now();
      const { code, failed } = await runTests(dir, m.tests);
      const killed = code !== 0 && failed.length > 0;
      if (!killed) survivors += 1;
      console.log(`${killed ? 'killed  ' : 'SURVIVED'} ${m.id.padEnd(18)} ${m.what} (${((Date.now() - started) / 1000).toFixed(0)} s)`);
      for (const name of failed) console.log(`           failed: ${name}`);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  }
  console.log(`${mutants.length - survivors} of ${mutants.length} mutants killed`);
  return survivors === 0 ? 0 : 1;
}

main().then(
  (code) => process.exit(code),
  (err: unknown) => {
    console.error(err);
    process.exit(1);
  },
);
