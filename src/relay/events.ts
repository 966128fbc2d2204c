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
  | { type: 'retry'; stream: string; source: 'sink' | 'database'; error: unknown; attempt: number; delayMs: number }
  /** A page failed at the sink (before any retry): counted as failed publishes. */
  | { type: 'failed'; stream: string; count: number; error: unknown };
