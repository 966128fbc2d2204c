/**
 * ioredis, an optional peer dependency: loaded when a RedisSink first
 * connects, so that importing tidemark never loads it, and a user who
 * relays to Redis without it gets one line naming the package to install.
 */
import type * as IORedis from 'ioredis';
import { importOptional, loadOnce } from '../../../options.js';

const client = loadOnce('ioredis', (): Promise<typeof IORedis> => importOptional('ioredis', 'the Redis Streams sink (relay --to redis://...)', () => import('ioredis')));

/** Loads ioredis once; a failed load is tried again by the next call. */
export const loadRedis = client.load;
