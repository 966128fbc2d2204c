import { Watermarker } from '../../watermark/watermarker.js';
import { configured, json, openDatabase, type GlobalOptions } from '../context.js';
import { CliError } from '../cli-error.js';
import type { WatermarkProgress } from '../../watermark/progress.js';

function describe(p: WatermarkProgress): string {
  if (p.outcome === 'not_leader') {
    const holder = p.leaseOwner ? `${p.leaseOwner}${p.leaseExpiresAt ? ` until ${p.leaseExpiresAt.toISOString()}` : ''}` : 'nobody';
    return `not_leader: safe_seq ${p.safeSeq} (the lease is held by ${holder}; this step published nothing)`;
  }
  const writers = p.holders === null ? '' : `, ${p.holders} writer${p.holders === 1 ? '' : 's'} in flight`;
  const pending = p.pending > 0 ? `, ${p.pending} observation${p.pending === 1 ? '' : 's'} waiting for them` : '';
  return `${p.outcome}: safe_seq ${p.safeSeq} (last seq ${p.lastSeq ?? '-'}${writers}${pending})`;
}

/** `tidemark watermark --once [--json]`: one step, then releases the lease. */
export async function watermarkCommand(options: GlobalOptions & { once?: boolean; json?: boolean }): Promise<number> {
  if (!options.once) throw new CliError('watermark: pass --once for a single step; run the loop with `tidemark serve --roles watermarker`');
  const db = await openDatabase(options);
  try {
    const watermarker = configured(() => new Watermarker(db.pool, { schema: options.schema, leaseTtlMs: 5_000 }));
    try {
      const progress = await watermarker.step();
      console.log(options.json ? json(progress) : describe(progress));
    } finally {
      await watermarker.close();
    }
    return 0;
  } finally {
    await db.close();
  }
}
