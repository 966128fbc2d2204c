/**
 * A relayed event as a Redis stream entry: the XADD arguments after the
 * key. See the module comment of sink.ts for the fields.
 */
import { CE_STRUCTURED_CONTENT_TYPE, traceContext, type MessageFormat } from '../../format.js';
import type { RelayMessage } from '../../sink.js';

/** Optional trimming of every XADD: at most one of them. */
export interface Trim {
  /** `MAXLEN ~ n`: keep about the newest `n` entries. */
  maxLen: number | undefined;
  /** `MINID ~ <seq − n + 1>`: keep about the entries of the last `n` seqs. */
  minIdLag: number | undefined;
}

/**
 * The arguments of the event's XADD after the key: trimming, the entry id
 * `<seq>-0`, then the fields. `format` is undefined for tidemark's own
 * layout; `origin` is the installation's id (CloudEvents ids).
 */
export function xaddArgs(message: RelayMessage, trim: Trim, format: MessageFormat | undefined, origin: string): string[] {
  const { event } = message;
  const seq = event.seq.toString();
  const args: string[] = [];
  if (trim.maxLen !== undefined) args.push('MAXLEN', '~', String(trim.maxLen));
  else if (trim.minIdLag !== undefined) {
    const min = event.seq - BigInt(trim.minIdLag) + 1n;
    args.push('MINID', '~', min > 0n ? `${min}-0` : '0-0');
  }
  args.push(`${seq}-0`);
  if (format) {
    args.push('content-type', CE_STRUCTURED_CONTENT_TYPE, 'cloudevent', format.structured(message, origin));
    return args;
  }
  args.push(
    'id', message.id,
    'seq', seq,
    'stream', event.stream,
    'kind', event.kind,
    'key', event.key,
    'occurred_at', event.occurredAt.toISOString(),
    'payload', event.payloadText,
    'headers', event.headersText,
  );
  const trace = traceContext(event.headersText);
  if (trace) {
    args.push('traceparent', trace.traceparent);
    if (trace.tracestate) args.push('tracestate', trace.tracestate);
  }
  return args;
}
