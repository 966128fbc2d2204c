/** Events a {@link Relay} reports to its `observer`. */
export type RelayEvent =
  /** The sink connected and its destination checked out. */
  | { type: 'open'; sink: string; description: string }
  /**
   * The broker acknowledged `count` events of `stream` (in `ackMs` from the
   * first send to the last acknowledgement), through seq `cursor`; the
   * cursor's COMMIT follows (if it fails, they are published again). For
   * the acknowledged prefix of a page that failed after it, `partial` is true.
   */
  | { type: 'published'; stream: string; count: number; cursor: bigint; ackMs: number; lastOccurredAt: Date; partial?: boolean }
  /**
   * Relaying `stream` failed with a retryable error (`source` says whose:
   * the broker's or the database's) and goes on after `delayMs` from the
   * committed cursor; `attempt` counts failures since the last page that
   * committed.
   */
  | {
      type: 'retry'; stream: string; source: 'sink' | 'database'; error: unknown; attempt: number; delayMs: number;
      /**
       * Set when the sink sends one event again itself within a publish (the
       * HTTP sink after a 503 or a timeout; `attempt` counts that event's
       * tries): the page goes on, nothing is published again from the cursor.
       */
      seq?: bigint;
    }
  /**
   * With `onRefused: 'dead-letter'`: the sink refused event `seq` of
   * `stream` (`error`, its `SinkError`), and it was recorded as dead letter
   * `id`, the cursor moved past it.
   */
  | { type: 'dead-letter'; stream: string; seq: bigint; id: bigint; error: unknown }
  /** Dead letter `id` was replayed: published and deleted (`error` undefined), or refused again (it stays). */
  | { type: 'dead-letter:replay'; stream: string; seq: bigint; id: bigint; error: unknown }
  /** A page failed at the sink (before any retry): counted as failed publishes. */
  | { type: 'failed'; stream: string; count: number; error: unknown };
