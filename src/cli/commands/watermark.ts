import { Watermarker } from '../../watermark/watermarker.js';
import { configured, json, openDatabase, type GlobalOptions } from '../context.js';
import { CliError } from '../cli-error.js';

/** `tidemark watermark --once [--json]`: one step, then releases the lease. */
export async function watermarkCommand(options: GlobalOptions & { once?: boolean; json?: boolean }): Promise<number> {
  if (!options.once) throw new CliError('watermark: pass --once for a single step; run the loop with `tidemark serve --roles watermarker`');
  const db = await openDatabase(options);
  try {
    const watermarker = configured(() => new Watermarker(db.pool, { schema: options.schema, leaseTtlMs: 5_000 }));
    try {
      const progress = await watermarker.step();
      console.log(options.json ? json(progress) : `${progress.outcome}: safe_seq ${progress.safeSeq} (max seq ${progress.maxSeq ?? '-'})`);
    } finally {
      await watermarker.close();
    }
    return 0;
  } finally {
    await db.close();
  }
}
