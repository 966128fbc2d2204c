/** AMQP 0-9-1 as the RabbitMQ sink meets it: reply codes, limits, and how amqplib reports errors. */
import { SinkError } from '../../../errors.js';

export const NAME = 'rabbitmq';

/** AMQP 0-9-1 reply codes the sink reacts to, as RabbitMQ sends them in `channel.close` and `connection.close`. The one table. */
export const REPLY = { accessRefused: 403, notFound: 404, preconditionFailed: 406, notAllowed: 530 } as const;
/** `basic.publish`'s class and method ids: a channel error naming them was caused by a published message. */
export const BASIC_PUBLISH = { classId: 60, methodId: 40 } as const;
/** An AMQP short string (exchange, routing key, message property) holds at most 255 bytes. */
export const SHORTSTR_MAX_BYTES = 255;
/** amqplib encodes a message's header table into a 64 KiB buffer, the table's 4-byte length included. */
export const HEADER_TABLE_MAX_BYTES = 65_536 - 4;
/** Own headers not copied under their own names: RabbitMQ routes by `CC` and `BCC` (sender-selected distribution). */
export const NOT_COPIED: ReadonlySet<string> = new Set(['CC', 'BCC']);

/** RabbitMQ's `406 PRECONDITION_FAILED` for a message over `max_message_size` states the limit; used only to point at the seq. */
export const MAX_SIZE_TEXT = /max size (\d+)/;

/** Whether the AMQP error names `method` as its cause. */
export function isFrom(err: unknown, method: { classId: number; methodId: number }): boolean {
  const e = err as { classId?: unknown; methodId?: unknown };
  return e.classId === method.classId && e.methodId === method.methodId;
}

/** The AMQP reply code of an amqplib channel or connection error. */
export function replyCode(err: unknown): number | undefined {
  const code = typeof err === 'object' && err !== null ? (err as { code?: unknown }).code : undefined;
  return typeof code === 'number' ? code : undefined;
}

/** A short reason: a socket error's code, else the first line of the message. */
export function reason(err: unknown): string {
  if (err instanceof AggregateError && err.errors.length > 0) return reason(err.errors[0]);
  const code = typeof err === 'object' && err !== null ? (err as { code?: unknown }).code : undefined;
  if (typeof code === 'string') return code;
  const text = err instanceof Error ? err.message : String(err);
  return text.split('\n')[0]!.slice(0, 300);
}

/** `promise`, or `signal.reason` once it aborts. */
export function abortable<T>(promise: Promise<T>, signal: AbortSignal): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => reject(signal.reason);
    if (signal.aborted) onAbort();
    else signal.addEventListener('abort', onAbort, { once: true });
    promise.then(
      (value) => {
        signal.removeEventListener('abort', onAbort);
        resolve(value);
      },
      (err: unknown) => {
        signal.removeEventListener('abort', onAbort);
        reject(err);
      },
    );
  });
}

/** `promise`, or a retryable `SinkError` with `message()` after `ms`. */
export function bounded<T>(promise: Promise<T>, ms: number, message: () => string): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    const timer = setTimeout(() => reject(new SinkError(NAME, message(), { retryable: true })), ms);
    promise.then(
      (value) => {
        clearTimeout(timer);
        resolve(value);
      },
      (err: unknown) => {
        clearTimeout(timer);
        reject(err);
      },
    );
  });
}
