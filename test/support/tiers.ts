/** The test tiers (`npm run test:unit`, `test:integration`, `test:e2e`; `npm test` runs all three). */
export type Tier = 'unit' | 'integration' | 'e2e';
export const TIERS: readonly Tier[] = ['unit', 'integration', 'e2e'];

/**
 * A test file's tier, from where it is and what it starts:
 * - e2e: the command line, faults, the relay against brokers, the README
 *   (test/cli/, test/faults/, test/readme*.test.ts, test/relay/ but for
 *   relay.test.ts, whose sink is a fake), and any other file that starts the
 *   CLI or a broker (imports support/cli.js, support/embedded-dir.js,
 *   support/nats-server.js, amqplib or @nats-io/);
 * - integration: every other file that uses a database (support/db.js);
 * - unit: the rest, which need no server at all.
 * ("Imports" are import statements at the start of a line.)
 */
export function tierOf(file: string, text: string): Tier {
  const e2eDir = /^test\/(cli|faults)\//.test(file) || file.startsWith('test/readme') || (file.startsWith('test/relay/') && file !== 'test/relay/relay.test.ts');
  if (e2eDir || /^(?:import .*|\}) from '([^']*support\/(cli|embedded-dir|nats-server)\.js|amqplib|@nats-io\/[^']+)';$/m.test(text)) return 'e2e';
  return /^(?:import .*|\}) from '[^']*support\/db\.js';$/m.test(text) ? 'integration' : 'unit';
}
