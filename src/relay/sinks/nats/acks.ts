/**
 * JetStream publishes with their acknowledgements collected on one inbox
 * subscription, instead of one request (a timer, a promise and an Error
 * object for its stack) per message as `js.publish` makes: the relay sends
 * a page of messages at a time, and those per-request objects were a large
 * share of its CPU time. A publish is a plain NATS publish with a reply
 * subject; JetStream answers on it with `{"stream":..,"seq":..}` (with
 * `"duplicate":true` for an id it already stored) or `{"error":{..}}`, and
 * the server answers 503 "no responders" when no stream takes the subject.
 */
import type { MsgHdrs, NatsConnection, Subscription } from '@nats-io/transport-node';
import { nats } from './client.js';

/** Why JetStream did not store a message. */
export type AckFailure =
  | { kind: 'api'; status: number; errCode: number; description: string }
  | { kind: 'no-responders' }
  | { kind: 'timeout' }
  | { kind: 'closed' };

interface Waiter {
  resolve: () => void;
  reject: (failure: AckFailure) => void;
}

const decoder = new TextDecoder();

export class AckInbox {
  private readonly prefix = nats().transport.createInbox();
  private readonly waiters = new Map<string, Waiter>();
  private readonly sub: Subscription;
  private next = 0;

  constructor(private readonly nc: NatsConnection) {
    this.sub = nc.subscribe(`${this.prefix}.*`, {
      callback: (err, msg) => {
        if (err) return this.failAll({ kind: 'closed' });
        const token = msg.subject.slice(this.prefix.length + 1);
        const waiter = this.waiters.get(token);
        if (!waiter) return; // answered after its batch gave up on it
        this.waiters.delete(token);
        if (msg.headers?.code === 503 && msg.data.length === 0) return waiter.reject({ kind: 'no-responders' });
        let ack: { error?: { code?: number; err_code?: number; description?: string } };
        try {
          ack = JSON.parse(decoder.decode(msg.data)) as typeof ack;
        } catch {
          return waiter.reject({ kind: 'api', status: 500, errCode: 0, description: 'an acknowledgement that is not JSON' });
        }
        if (ack.error) {
          return waiter.reject({ kind: 'api', status: ack.error.code ?? 500, errCode: ack.error.err_code ?? 0, description: ack.error.description ?? 'refused' });
        }
        waiter.resolve();
      },
    });
  }

  /**
   * Publishes one message and returns its token and a promise of its
   * acknowledgement (rejecting with an {@link AckFailure}). The promise is
   * settled by the ack, by {@link expire}, or by the connection closing.
   */
  send(subject: string, body: Uint8Array, headers: MsgHdrs): { token: string; acked: Promise<void> } {
    const token = (this.next++).toString(36);
    const acked = new Promise<void>((resolve, reject) => this.waiters.set(token, { resolve, reject }));
    this.nc.publish(subject, body, { reply: `${this.prefix}.${token}`, headers });
    return { token, acked };
  }

  /** Gives up on the acknowledgements of `tokens` still outstanding. */
  expire(tokens: readonly string[], failure: AckFailure): void {
    for (const token of tokens) {
      const waiter = this.waiters.get(token);
      if (!waiter) continue;
      this.waiters.delete(token);
      waiter.reject(failure);
    }
  }

  /** Fails every outstanding acknowledgement (the connection is gone). */
  failAll(failure: AckFailure): void {
    this.expire([...this.waiters.keys()], failure);
  }

  close(): void {
    this.failAll({ kind: 'closed' });
    this.sub.unsubscribe();
  }
}
