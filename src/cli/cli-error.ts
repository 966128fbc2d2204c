/**
 * The CLI's exit codes (docs/ERRORS.md, "Command line"). Scripts and
 * supervisors branch on them, so they only ever gain members.
 */
export const EXIT = {
  /** Done. */
  ok: 0,
  /** Failed for a reason not listed below (a PostgreSQL error, a failed write to stdout, a bug). */
  failed: 1,
  /** Bad usage, input or configuration: fix the command, its input or the database setup; the failing step wrote nothing. */
  usage: 2,
  /** The consumer must resync: retention removed events it had not read (rerun with --bootstrap). */
  resync: 3,
  /** The database could not be reached, refused the login, or dropped the connection: check it, then run the command again. */
  database: 4,
} as const;

/** A usage or configuration error: one line on stderr, exit code 2 unless given, nothing written. */
export class CliError extends Error {
  constructor(
    message: string,
    readonly exitCode: number = EXIT.usage,
  ) {
    super(message);
    this.name = 'CliError';
  }
}
