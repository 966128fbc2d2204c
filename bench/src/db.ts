import pg from 'pg';

/** The server the benchmark runs on: one fresh database per contender and scenario. */
export class BenchServer {
  private readonly admin: pg.Pool;
  private readonly created = new Set<string>();

  constructor(readonly url: string) {
    this.admin = new pg.Pool({ connectionString: url, max: 2, application_name: 'tidemark-bench-admin' });
  }

  urlFor(database: string): string {
    const u = new URL(this.url);
    u.pathname = `/${database}`;
    return u.toString();
  }

  /** Drops (forcibly) and creates `tidemark_bench_<pid>_<name>`; returns its URL. The pid keeps concurrent runs on one server apart. */
  async freshDatabase(name: string): Promise<string> {
    const database = `tidemark_bench_${process.pid}_${name.replace(/[^a-z0-9_]/g, '_')}`.slice(0, 63);
    await this.admin.query(`DROP DATABASE IF EXISTS ${quoteIdent(database)} WITH (FORCE)`);
    await this.admin.query(`CREATE DATABASE ${quoteIdent(database)}`);
    this.created.add(database);
    return this.urlFor(database);
  }

  /** The settings the Performance section reports. */
  async settings(): Promise<Record<string, string>> {
    const names = ['server_version', 'max_connections', 'shared_buffers', 'synchronous_commit', 'fsync', 'wal_level', 'max_wal_size', 'checkpoint_timeout'];
    const r = await this.admin.query<{ name: string; setting: string }>(
      `SELECT name, current_setting(name) AS setting FROM pg_settings WHERE name = ANY($1)`,
      [names],
    );
    return Object.fromEntries(r.rows.map((row) => [row.name, row.setting]));
  }

  async query<R extends pg.QueryResultRow = pg.QueryResultRow>(text: string, values?: unknown[]): Promise<pg.QueryResult<R>> {
    return this.admin.query<R>(text, values);
  }

  /** Drops every database this run created. */
  async close(): Promise<void> {
    for (const database of this.created) {
      await this.admin.query(`DROP DATABASE IF EXISTS ${quoteIdent(database)} WITH (FORCE)`).catch(() => undefined);
    }
    await this.admin.end();
  }
}

/** A pool on one bench database. */
export function benchPool(url: string, max: number, name = 'tidemark-bench'): pg.Pool {
  const pool = new pg.Pool({ connectionString: url, max, application_name: name });
  pool.on('error', () => undefined);
  return pool;
}

/** A PostgreSQL identifier, quoted. */
export function quoteIdent(name: string): string {
  return `"${name.replaceAll('"', '""')}"`;
}
