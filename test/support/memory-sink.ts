/**
 * A sink that keeps what it is given, for testing the relay loop without a
 * broker: every publish call is recorded, and a test can hold a publish
 * open (a gate) or make the next ones fail.
 */
import { SinkError } from '../../src/errors.js';
import type { RelayMessage, Sink, SinkTarget } from '../../src/relay/sink.js';
import { streamEvent, type EventText } from '../../src/consumer/exact-json.js';

export class MemorySink implements Sink {
  readonly name = 'memory';
  readonly description = 'memory';
  /** Every message acknowledged, in the order acknowledged. */
  readonly acked: RelayMessage[] = [];
  /** Every publish call's messages, acknowledged or not. */
  readonly calls: RelayMessage[][] = [];
  target: SinkTarget | undefined;
  /** Set to make `publish` wait for it before acknowledging. */
  gate: Promise<void> | undefined;
  /** Called with each publish's messages once it started (before the gate). */
  onPublish: ((messages: readonly RelayMessage[]) => void) | undefined;
  /** The next publishes fail with these, one each, before anything is acknowledged. */
  readonly failures: SinkError[] = [];
  /** Like a full queue: each publish call takes at most this many messages, then fails (retryable) on the next. */
  acceptPerCall: number | undefined;
  /** Fails `open` with this, once. */
  openFailure: SinkError | undefined;
  closed = false;

  async open(target: SinkTarget): Promise<void> {
    const failure = this.openFailure;
    this.openFailure = undefined;
    if (failure) throw failure;
    this.target = target;
  }

  async publish(messages: readonly RelayMessage[], signal: AbortSignal): Promise<void> {
    this.calls.push([...messages]);
    this.onPublish?.(messages);
    const failure = this.failures.shift();
    if (failure) throw failure;
    if (this.acceptPerCall !== undefined && messages.length > this.acceptPerCall) {
      this.acked.push(...messages.slice(0, this.acceptPerCall));
      throw new SinkError('memory', `seq ${messages[this.acceptPerCall]!.event.seq}: the queue is full`, { retryable: true, seq: messages[this.acceptPerCall]!.event.seq });
    }
    if (this.gate) {
      await Promise.race([
        this.gate,
        new Promise((_, reject) => signal.addEventListener('abort', () => reject(signal.reason), { once: true })),
      ]);
    }
    this.acked.push(...messages);
  }

  async close(): Promise<void> {
    this.closed = true;
  }
}

/** A retryable failure, as a broker that is down gives. */
export function brokerDown(): SinkError {
  return new SinkError('memory', 'the broker is down', { retryable: true });
}

/** A failure retrying cannot fix, naming `seq`. */
export function poisoned(seq: bigint): SinkError {
  return new SinkError('memory', `message ${seq} is too large`, { retryable: false, seq });
}

/** An origin id (migration 18) for sinks opened without a database. */
export const TEST_ORIGIN = '00000000-0000-4000-8000-000000000001';

/** A payload as PostgreSQL may hold it: a number no JavaScript number holds, escapes and non-ASCII, which a sink must send byte for byte. */
export const EXACT_PAYLOAD = '{"n": 12345678901234567890, "note": "ünïcode \\"q\\" ✓", "x": 1e400}';

/**
 * A message as the relay builds it, for a sink's tests: seq `seq` of
 * `orders`, kind `order.placed`, key `order-<seq>`, `EXACT_PAYLOAD`, no
 * headers, occurred at 2026-12-05T09:00:00 plus `seq` milliseconds, unless
 * `fields` says otherwise.
 */
export function relayMessage(seq: number, fields: Partial<Omit<EventText, 'seq'>> = {}): RelayMessage {
  return {
    id: `tidemark:${seq}`,
    schema: 'tidemark',
    event: streamEvent({
      seq: BigInt(seq),
      stream: 'orders',
      kind: 'order.placed',
      key: `order-${seq}`,
      payloadText: EXACT_PAYLOAD,
      headersText: '{}',
      occurredAt: new Date(Date.UTC(2026, 11, 5, 9, 0, 0, seq)),
      ...fields,
    }),
  };
}
