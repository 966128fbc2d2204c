/**
 * A one-line progress bar on stderr: the run's elapsed share of its planned
 * time and what it is doing. Without a terminal it prints one line per step.
 */
export class Progress {
  private readonly start = performance.now();
  private label = '';
  private timer: NodeJS.Timeout | undefined;
  private readonly tty: boolean;

  constructor(
    private readonly plannedMs: number,
    private readonly stream: NodeJS.WriteStream = process.stderr,
    enabled = true,
  ) {
    this.tty = enabled && stream.isTTY === true;
    if (this.tty) this.timer = setInterval(() => this.draw(), 250).unref();
    if (!enabled) this.step = () => undefined;
  }

  step(label: string): void {
    this.label = label;
    if (this.tty) this.draw();
    else this.stream.write(`[bench ${((performance.now() - this.start) / 1000).toFixed(0)}s] ${label}\n`);
  }

  private draw(): void {
    const elapsed = performance.now() - this.start;
    const share = Math.min(1, elapsed / this.plannedMs);
    const width = 24;
    const filled = Math.round(share * width);
    const bar = `${'#'.repeat(filled)}${'.'.repeat(width - filled)}`;
    const line = `[${bar}] ${(elapsed / 1000).toFixed(0)}s ${this.label}`;
    this.stream.write(`\r${line.slice(0, (this.stream.columns || 100) - 1).padEnd((this.stream.columns || 100) - 1)}`);
  }

  done(): void {
    if (this.timer) clearInterval(this.timer);
    if (this.tty) this.stream.write('\n');
  }
}
