/** Events a {@link Relay} reports to its `observer`. */
export type RelayEvent =
  /** The sink connected and its destination checked out. */
  | { type: 'open'; sink: string; description: string }
  /**
   * A page of `stream` was acknowledged by the broker (all `count` events,
   * in `ackMs` from the first send to the last acknowledgement) and the
   * cursor committed at `cursor`. `safeSeq` is what the page read. For the
   * acknowledged prefix of a page that failed after it, `partial` is true,
   * `safeSeq` is absent, and the event comes just before that prefix's commit.
   */
  | { type: 'published'; stream: string; count: number; cursor: bigint; safeSeq?: bigint; ackMs: number; lastOccurredAt: Date; partial?: boolean }
  /**
   * Relaying `stream` failed with a retryable error (`source` says whose:
   * the broker's or the database's) and goes on after `delayMs` from the
   * committed cursor; `attempt` counts failures since the last page that
   * committed.
   */
  | { type: 'retry'; stream: string; source: 'sink' | 'database'; error: unknown; attempt: number; delayMs: number }
  /** A page failed at the sink (before any retry): counted as failed publishes. */
  | { type: 'failed'; stream: string; count: number; error: unknown };
