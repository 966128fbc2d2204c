/** `word` as one POSIX shell word, for a command line a message shows: as it is when plainly safe, else single-quoted. */
export function shellWord(word: string): string {
  return /^[A-Za-z0-9_.,:@%+=/-]+$/.test(word) ? word : `'${word.replaceAll("'", `'\\''`)}'`;
}
