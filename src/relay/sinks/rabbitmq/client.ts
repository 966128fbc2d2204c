/**
 * amqplib, an optional peer dependency: loaded when a RabbitMqSink first
 * connects, so that importing tidemark never loads it, and a user who
 * relays to RabbitMQ without it gets one line naming the package to install.
 */
import type * as Amqp from 'amqplib';
import { importOptional, loadOnce } from '../../../options.js';

const client = loadOnce('amqplib', (): Promise<typeof Amqp> => importOptional('amqplib', 'the RabbitMQ sink (relay --to amqp://...)', () => import('amqplib')));

/** Loads amqplib once; a failed load is tried again by the next call. */
export const loadAmqp = client.load;

/** amqplib, once {@link loadAmqp} has resolved (every connection of the sink waits for it first). */
export const amqp = client.get;
