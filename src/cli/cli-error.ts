/** A usage or configuration error: one line on stderr, exit code 2, nothing written. */
export class CliError extends Error {
  constructor(
    message: string,
    readonly exitCode = 2,
  ) {
    super(message);
  }
}
