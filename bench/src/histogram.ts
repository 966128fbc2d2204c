/**
 * An HDR-style latency histogram: values in microseconds, log-linear buckets
 * with 1,024 sub-buckets per power of two (three significant digits, 0.1%
 * worst-case error) from 1 µs to hours, in a sparse map. Percentiles are
 * read off the bucket counts, so recording millions of samples costs a map
 * increment each and no sorting.
 */
const SUB_BITS = 10;
const SUB = 1 << SUB_BITS;

function bucketOf(us: number): number {
  const v = Math.max(0, Math.round(us));
  if (v < 2 * SUB) return v;
  const shift = Math.floor(Math.log2(v)) - SUB_BITS;
  return 2 * SUB + (shift - 1) * SUB + (Math.floor(v / 2 ** shift) - SUB);
}

function valueOf(bucket: number): number {
  if (bucket < 2 * SUB) return bucket;
  const shift = Math.floor((bucket - 2 * SUB) / SUB) + 1;
  const sub = bucket - 2 * SUB - (shift - 1) * SUB + SUB;
  return (sub + 0.5) * 2 ** shift;
}

export interface Summary {
  count: number;
  p50: number;
  p99: number;
  p999: number;
  max: number;
  mean: number;
}

export class Histogram {
  private readonly counts = new Map<number, number>();
  count = 0;
  private sum = 0;
  private maxUs = 0;

  /** Records a value in milliseconds (`times` times). */
  recordMs(ms: number, times = 1): void {
    this.recordUs(ms * 1000, times);
  }

  recordUs(us: number, times = 1): void {
    if (!Number.isFinite(us) || times <= 0) return;
    const v = Math.max(0, us);
    const b = bucketOf(v);
    this.counts.set(b, (this.counts.get(b) ?? 0) + times);
    this.count += times;
    this.sum += v * times;
    if (v > this.maxUs) this.maxUs = v;
  }

  merge(other: Histogram): this {
    for (const [b, n] of other.counts) this.counts.set(b, (this.counts.get(b) ?? 0) + n);
    this.count += other.count;
    this.sum += other.sum;
    this.maxUs = Math.max(this.maxUs, other.maxUs);
    return this;
  }

  /** The value at percentile `p` (0-100), in milliseconds; NaN when empty. */
  percentileMs(p: number): number {
    if (this.count === 0) return Number.NaN;
    const rank = Math.max(1, Math.ceil((p / 100) * this.count));
    let seen = 0;
    for (const b of [...this.counts.keys()].sort((x, y) => x - y)) {
      seen += this.counts.get(b)!;
      if (seen >= rank) return Math.min(valueOf(b), this.maxUs) / 1000;
    }
    return this.maxUs / 1000;
  }

  /** p50/p99/p99.9/max/mean in milliseconds. */
  summary(): Summary {
    return {
      count: this.count,
      p50: this.percentileMs(50),
      p99: this.percentileMs(99),
      p999: this.percentileMs(99.9),
      max: this.count === 0 ? Number.NaN : this.maxUs / 1000,
      mean: this.count === 0 ? Number.NaN : this.sum / this.count / 1000,
    };
  }

  /** Plain data, for sending between processes. */
  toJSON(): { counts: [number, number][]; count: number; sum: number; maxUs: number } {
    return { counts: [...this.counts], count: this.count, sum: this.sum, maxUs: this.maxUs };
  }

  static fromJSON(data: ReturnType<Histogram['toJSON']>): Histogram {
    const h = new Histogram();
    for (const [b, n] of data.counts) h.counts.set(b, n);
    h.count = data.count;
    h.sum = data.sum;
    h.maxUs = data.maxUs;
    return h;
  }
}
