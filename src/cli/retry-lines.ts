/**
 * The stderr lines of a command that retries by itself (`tail` in follow
 * mode): one when a failure begins or its cause changes, then at attempts
 * 2, 4, 8, ... of the same one, and one when it goes on. A database down
 * for a minute writes about ten lines, not one per back-off.
 */
export class RetryLines {
  private streak: { attempts: number; why: string } | undefined;

  constructor(private readonly write: (line: string) => void) {}

  /** A failed attempt, `why` in one line; `attempt` counts from 1 since the last success. */
  failed(why: string, attempt: number): void {
    const changed = this.streak === undefined || this.streak.why !== why;
    this.streak = { attempts: attempt, why };
    if (changed || (attempt & (attempt - 1)) === 0) this.write(`${why}; retrying (attempt ${attempt})`);
  }

  /** Work went on: says so once after failures. */
  succeeded(): void {
    if (!this.streak) return;
    const { attempts } = this.streak;
    this.streak = undefined;
    this.write(`going on after ${attempts} failed attempt${attempts === 1 ? '' : 's'}`);
  }
}
