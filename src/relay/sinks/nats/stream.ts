/**
 * The JetStream stream the NATS sink publishes to, as `open` finds it (or
 * creates it) and checks it: its subjects must cover every subject the
 * relay can publish, and its duplicate window must outlast the relay's
 * republish bound, or a republished event could be stored twice.
 */
import type { JetStreamManager, StreamInfo } from '@nats-io/jetstream';
import { nats } from './client.js';
import { SinkError } from '../../../errors.js';
import { subjectCovers } from './subject.js';

/** What `open` expects of the stream. */
export interface StreamPlan {
  /** The stream's name. */
  stream: string;
  /** The subject filters of the relay's streams (`tidemark.orders.>`), none covering another. */
  filters: string[];
  /** The relay's republish bound, in milliseconds. */
  republishWithinMs: number;
  /** Create the stream when it is missing. */
  create: boolean;
  /** The servers, for messages. */
  hosts: string;
}

const SINK = 'nats';
/** The shortest duplicate window a created stream gets: JetStream's own default. */
const MIN_CREATED_WINDOW_MS = 120_000;
/** JetStream's "stream name already in use". */
const STREAM_NAME_EXISTS = 10058;

/** The stream's info, the stream created first when it is missing and `plan.create`; rejects with a SinkError when it does not fit. */
export async function openStream(jsm: JetStreamManager, plan: StreamPlan): Promise<StreamInfo> {
  let info = await findOrCreate(jsm, plan);
  if (plan.create) info = await widen(jsm, info, plan);
  checkStream(info, plan);
  return info;
}

/**
 * With `create`, a stream that exists but does not take every subject of
 * the relay (a stream added to `--stream` since the relay created it) gets
 * the missing filters added to its subjects: the stream the relay creates
 * is the one it keeps using. JetStream refuses a subject another stream
 * takes; that is said, naming both.
 */
async function widen(jsm: JetStreamManager, info: StreamInfo, plan: StreamPlan): Promise<StreamInfo> {
  const subjects = info.config.subjects ?? [];
  const missing = plan.filters.filter((filter) => !subjects.some((pattern) => subjectCovers(pattern, filter)));
  if (missing.length === 0) return info;
  try {
    return await jsm.streams.update(plan.stream, { subjects: [...subjects, ...missing] });
  } catch (err) {
    if (!(err instanceof nats().jetstream.JetStreamApiError)) throw err;
    throw new SinkError(
      SINK,
      `JetStream stream ${plan.stream} could not take subject${missing.length > 1 ? 's' : ''} ${missing.join(', ')}: ${firstLine(err)}; another stream may take ${missing.length > 1 ? 'them' : 'it'} (nats stream ls), or change the subject template`,
      { retryable: false, cause: err },
    );
  }
}

async function findOrCreate(jsm: JetStreamManager, plan: StreamPlan): Promise<StreamInfo> {
  const { stream, filters } = plan;
  const window = goDuration(createdWindowMs(plan.republishWithinMs));
  try {
    return await jsm.streams.info(stream);
  } catch (err) {
    if (!isApiError(err, nats().jetstream.JetStreamApiCodes.StreamNotFound)) throw err;
    if (!plan.create) {
      throw new SinkError(
        SINK,
        `JetStream stream ${stream} does not exist on ${plan.hosts}; create it (nats stream add ${stream} --subjects '${filters.join(',')}' --dupe-window ${window})` +
          ` or let the relay create it with --create-stream (createStream: true)`,
        { retryable: false, cause: err },
      );
    }
  }
  try {
    return await jsm.streams.add({ name: stream, subjects: filters, storage: nats().jetstream.StorageType.File, duplicate_window: createdWindowMs(plan.republishWithinMs) * 1e6 });
  } catch (err) {
    if (isApiError(err, STREAM_NAME_EXISTS)) return jsm.streams.info(stream); // another relay created it first
    throw err;
  }
}

function checkStream(info: StreamInfo, plan: StreamPlan): void {
  const { stream, republishWithinMs } = plan;
  const subjects = info.config.subjects ?? [];
  for (const filter of plan.filters) {
    // Each filter within one pattern: a filter split across several patterns is refused too.
    if (!subjects.some((pattern) => subjectCovers(pattern, filter))) {
      throw new SinkError(
        SINK,
        `JetStream stream ${stream} does not take subject ${filter} (its subjects: ${subjects.join(', ') || 'none'}); add it (nats stream edit ${stream} --subjects ...) or change the subject template`,
        { retryable: false },
      );
    }
  }
  const windowMs = info.config.duplicate_window / 1e6;
  if (!(windowMs > republishWithinMs)) {
    throw new SinkError(
      SINK,
      `duplicate window ${goDuration(windowMs)} of stream ${stream} is not longer than the relay's republish bound of ${republishWithinMs / 1000} s;` +
        ` raise it (nats stream edit ${stream} --dupe-window ${goDuration(createdWindowMs(republishWithinMs))}) or shorten the relay's` +
        ` restart and retry bounds, or a republished event could be stored twice`,
      { retryable: false },
    );
  }
}

/** The duplicate window of a created stream: max(2 minutes, 2 × the republish bound), in whole seconds. */
function createdWindowMs(republishWithinMs: number): number {
  return Math.max(MIN_CREATED_WINDOW_MS, Math.ceil((2 * republishWithinMs) / 1000) * 1000);
}

/** A duration as Go (and the nats CLI) writes it: `2m0s`, `1h30m0s`, `45s`, `500ms`. */
export function goDuration(ms: number): string {
  if (ms < 1000) return `${ms}ms`;
  const h = Math.floor(ms / 3_600_000);
  const m = Math.floor((ms % 3_600_000) / 60_000);
  const s = (ms % 60_000) / 1000;
  return h > 0 ? `${h}h${m}m${s}s` : m > 0 ? `${m}m${s}s` : `${s}s`;
}

/** Whether `err` is JetStream's API error `code` (codes, not message text: they are stable). */
export function isApiError(err: unknown, code: number): boolean {
  return err instanceof nats().jetstream.JetStreamApiError && err.code === code;
}

/** The client's "JetStream not enabled": nobody answered the JetStream API, or the account has none. */
export function noJetStream(err: unknown): boolean {
  if (!(err instanceof Error)) return false;
  const cause = err.cause;
  return (
    (cause instanceof nats().transport.errors.RequestError && cause.isNoResponders()) ||
    isApiError(cause, nats().jetstream.JetStreamApiCodes.JetStreamNotEnabledForAccount) ||
    isApiError(err, nats().jetstream.JetStreamApiCodes.JetStreamNotEnabledForAccount)
  );
}

/** An error's message, first line only: a sink error is one line. */
export function firstLine(err: unknown): string {
  return (err instanceof Error ? err.message : String(err)).split('\n')[0]!;
}
