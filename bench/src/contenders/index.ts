import { emmettContender } from './emmett.js';
import { messageDbContender } from './message-db.js';
import { pgOutboxContender } from './pg-outbox.js';
import { naiveContender, referenceContender, xidCompoundContender, xidPositionContender } from './baselines.js';
import { tidemarkContender } from './tidemark.js';
import type { Contender } from './types.js';

/** Every contender, in the order the tables list them. */
export function allContenders(): Contender[] {
  return [
    tidemarkContender(),
    emmettContender,
    messageDbContender,
    pgOutboxContender,
    naiveContender,
    xidPositionContender,
    xidCompoundContender,
    referenceContender(),
  ];
}

export function contenderById(id: string): Contender {
  const found = allContenders().find((c) => c.id === id);
  if (!found) throw new Error(`unknown contender ${JSON.stringify(id)}`);
  return found;
}
