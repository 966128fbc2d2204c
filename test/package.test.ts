/** What npm install sees of the package: no dependency that wants a newer Node than `engines` promises. */
import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import { test } from 'node:test';

type Version = [number, number, number];

function version(text: string): Version {
  const m = /^v?(\d+)(?:\.(\d+|x))?(?:\.(\d+|x))?$/.exec(text.trim());
  if (!m) throw new Error(`cannot read version ${JSON.stringify(text)}`);
  return [Number(m[1]), m[2] === undefined || m[2] === 'x' ? 0 : Number(m[2]), m[3] === undefined || m[3] === 'x' ? 0 : Number(m[3])];
}

const compare = (a: Version, b: Version) => a[0] - b[0] || a[1] - b[1] || a[2] - b[2];

/** Whether Node `v` satisfies an engines range of the forms npm packages use here: `>=N`, `>= N.x`, `^N`, `A || B`. */
function satisfies(v: Version, range: string): boolean {
  return range.split('||').some((alternative) =>
    alternative
      .trim()
      .replace(/(>=|<=|>|<|\^|~)\s+/g, '$1')
      .split(/\s+/)
      .every((part) => {
        const m = /^(>=|<=|>|<|\^|~|=)?(.+)$/.exec(part)!;
        const bound = version(m[2]!);
        switch (m[1]) {
          case '>=': return compare(v, bound) >= 0;
          case '>': return compare(v, bound) > 0;
          case '<=': return compare(v, bound) <= 0;
          case '<': return compare(v, bound) < 0;
          case '^': return v[0] === bound[0] && compare(v, bound) >= 0;
          case '~': return v[0] === bound[0] && v[1] === bound[1] && compare(v, bound) >= 0;
          default: return compare(v, bound) === 0;
        }
      }),
  );
}

/** A lockfile entry: what npm install records of one installed package. */
interface LockEntry {
  dev?: boolean;
  engines?: { node?: string };
  dependencies?: Record<string, string>;
  optionalDependencies?: Record<string, string>;
}

/**
 * The lockfile paths of what `npm install tidemark` installs: the runtime
 * dependencies and the optional peers (a user adds those for a feature),
 * and theirs, resolved as Node does (a nested node_modules first). Not the
 * development dependencies, nor the bench workspace's.
 */
function installed(packages: Record<string, LockEntry>, roots: string[]): string[] {
  const seen = new Set<string>();
  const visit = (from: string, name: string) => {
    let at = from;
    for (;;) {
      const candidate = `${at ? `${at}/` : ''}node_modules/${name}`;
      if (packages[candidate]) {
        if (!seen.has(candidate)) {
          seen.add(candidate);
          const entry = packages[candidate]!;
          for (const dep of Object.keys({ ...entry.dependencies, ...entry.optionalDependencies })) visit(candidate, dep);
        }
        return;
      }
      if (!at) return; // not installed (an optional dependency of another platform)
      const i = at.lastIndexOf('/node_modules/');
      at = i < 0 ? '' : at.slice(0, i);
    }
  };
  for (const name of roots) visit('', name);
  return [...seen].sort();
}

test('every package npm install tidemark brings runs on the Node versions engines promises (no EBADENGINE at npm install)', async () => {
  const pkg = JSON.parse(await readFile(new URL('../package.json', import.meta.url), 'utf8')) as {
    engines: { node: string };
    dependencies: Record<string, string>;
    peerDependencies: Record<string, string>;
  };
  const lock = JSON.parse(await readFile(new URL('../package-lock.json', import.meta.url), 'utf8')) as { packages: Record<string, LockEntry> };
  // 20.18.1: undici 7 (the HTTP sink's client) needs it.
  assert.equal(pkg.engines.node, '>=20.18.1');
  const oldest = version('20.18.1');
  assert.ok(satisfies(oldest, pkg.engines.node));
  const paths = installed(lock.packages, [...Object.keys(pkg.dependencies), ...Object.keys(pkg.peerDependencies)]);
  assert.ok(paths.includes('node_modules/pg') && paths.includes('node_modules/undici') && paths.includes('node_modules/amqplib') && !paths.includes('node_modules/typescript'), paths.join(', '));
  const refusing = paths
    .filter((path) => lock.packages[path]!.engines?.node !== undefined && !satisfies(oldest, lock.packages[path]!.engines!.node!))
    .map((path) => `${path.replace(/^node_modules\//, '')} wants node ${lock.packages[path]!.engines!.node}`);
  assert.deepEqual(refusing, []);
  // The reader itself: the forms it meets.
  assert.ok(satisfies(oldest, '^16 || ^18 || >=20') && satisfies(oldest, '>= 10.x') && !satisfies(oldest, '>= 22.x') && !satisfies(oldest, '^22'));
});
