/**
 * The contract between the relay and a message broker. A sink is small on
 * purpose: the relay owns ordering, the durable cursor and retries; a sink
 * only turns events into the broker's messages, sends a batch of them
 * pipelined, and says when the broker has taken each one. A Kafka or HTTP
 * sink is one module implementing {@link Sink}.
 */
import type { StreamEvent } from '../consumer/events.js';

/** One event as the relay hands it to a sink. */
export interface RelayMessage {
  /**
   * `<schema>:<seq>`: the message's id on the broker (`Nats-Msg-Id`, AMQP
   * `message_id`). The same event always gets the same id, so a republished
   * event can be recognised as a duplicate.
   */
  id: string;
  /** The tidemark schema the event comes from. */
  schema: string;
  /**
   * The event. Its `payload` and `headers` are parsed on first read (the
   * relay itself reads only `payloadText` and `headersText`, which a sink
   * should send as they are).
   */
  event: StreamEvent;
}

/** What the relay will publish, told to {@link Sink.open} so the sink can check its destination up front. */
export interface SinkTarget {
  /** The tidemark schema: the `{schema}` field of every message. */
  schema: string;
  /**
   * The installation's origin id (a UUID drawn by migration 18, in the
   * watermark row): with a seq it names an event uniquely across databases
   * and schemas (`cloudEventId`), for ids a receiver deduplicates by.
   */
  origin: string;
  /** The tidemark streams the relay follows: every message's `{stream}` is one of them. */
  streams: readonly string[];
  /**
   * The longest time, in milliseconds, between the relay publishing an
   * event and publishing it again after a failure or a crash (see
   * `Relay.republishWithinMs`). A broker that recognises duplicates only
   * within a window (JetStream's `duplicate_window`) must keep ids longer
   * than this for publishing to be exactly once; a sink refuses to open when
   * it does not.
   */
  republishWithinMs: number;
  /**
   * Told by a sink that retries a send itself within `publish` (the HTTP
   * sink, after a 503 or a timeout) before each new try, so the relay can
   * report and count it (a `retry` event with `seq`). Such a retry keeps
   * the page: the events the broker already took stay taken.
   */
  onRetry?: (retry: SinkRetry) => void;
}

/** A send a sink tries again within `publish` (see {@link SinkTarget.onRetry}). */
export interface SinkRetry {
  /** The stream of the event being sent again. */
  stream: string;
  /** The event (the first of a batched request). */
  seq: bigint;
  /** Tries of this send so far, the failed one included. */
  attempt: number;
  /** The pause before the next try. */
  delayMs: number;
  /** Why the last try failed: a retryable `SinkError`. */
  error: unknown;
}

/**
 * A message broker the relay publishes to.
 *
 * The relay calls `open` once before anything else, then `publish` with
 * batches of one stream's events in seq order (calls may run concurrently
 * for different streams, never for the same stream), and `close` once at
 * the end. After a failed `publish` the relay backs off and calls
 * `publish` again, starting from the first event whose acknowledgement it
 * did not get: a sink reconnects by itself, on that call at the latest.
 */
export interface Sink {
  /** A short name for logs, metrics and errors: `nats`, `rabbitmq`. */
  readonly name: string;
  /**
   * Where the sink publishes, for logs: the broker's address and the
   * destination, never a password.
   */
  readonly description: string;
  /**
   * The longest a publish waits for acknowledgements before it fails, if the
   * sink bounds it; part of the relay's `republishWithinMs`.
   */
  readonly ackTimeoutMs?: number;
  /**
   * Why the sink cannot take an event after later ones of its stream, when
   * it cannot (a Redis stream adds an entry only above its top). A dead
   * letter's replay sends its event after later ones, so the relay refuses
   * `onRefused: 'dead-letter'` with such a sink, giving this reason.
   */
  readonly inOrderOnly?: string;
  /**
   * Connects and checks that the destination exists and can take what the
   * relay sends (a JetStream stream covering the subjects with a long enough
   * duplicate window; an exchange). Rejects with a `SinkError`: retryable
   * when the broker cannot be reached, not retryable when it is
   * misconfigured.
   */
  open(target: SinkTarget, signal: AbortSignal): Promise<void>;
  /**
   * Publishes `messages` in order without waiting for each acknowledgement
   * before sending the next, and resolves once the broker has acknowledged
   * every one of them (a JetStream publish ack, a RabbitMQ publisher
   * confirm). Rejects with a `SinkError` as soon as one fails; `seq` names
   * it when the failure is that event's own (too large, unroutable). The
   * relay then commits nothing of the batch, so each of its events is
   * published again later or the relay stops.
   */
  publish(messages: readonly RelayMessage[], signal: AbortSignal): Promise<void>;
  /** Closes the broker connection. Idempotent. */
  close(): Promise<void>;
}

/**
 * The event's own headers whose values are strings, from PostgreSQL's text
 * of them: what a sink may copy under the headers' own names (every header,
 * whatever its type, also travels exactly as that text). A string parses
 * back exactly; the other values are not read, so a number a JavaScript
 * number cannot hold exactly is not refused here.
 */
export function stringHeaders(headersText: string): [name: string, value: string][] {
  const headers = JSON.parse(headersText) as Record<string, unknown>;
  return Object.entries(headers).filter((entry): entry is [string, string] => typeof entry[1] === 'string');
}
