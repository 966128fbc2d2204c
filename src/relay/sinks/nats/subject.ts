/**
 * NATS subjects for the NATS sink: how an event's fields become subject
 * tokens, the subject filters the relay can publish under, and whether a
 * JetStream stream's subject patterns cover them (`*` matches one token,
 * `>` one or more trailing tokens).
 */
import { InvalidOptionsError } from '../../../errors.js';
import type { RelayMessage } from '../../sink.js';
import type { Template } from '../../template.js';
import { streamEvent } from '../../../consumer/exact-json.js';

/** What a subject token cannot hold: whitespace and control characters (protocol separators) and the wildcards. */
const NOT_IN_TOKEN = /[\s\p{Cc}*>]/gu;

/**
 * A field's value as subject text: each character a token cannot hold
 * becomes `_`, and so does each empty token (`order.` gives `order._`).
 * Dots are kept, so `order.placed` is two tokens. Never empty, never
 * starts or ends with a dot.
 */
export function subjectField(value: string): string {
  return value
    .split('.')
    .map((token) => (token === '' ? '_' : token.replace(NOT_IN_TOKEN, '_')))
    .join('.');
}

/** Why `subject` is not a subject one can publish to, or undefined. */
function subjectProblem(subject: string): string | undefined {
  for (const token of subject.split('.')) {
    if (token === '') return 'has an empty token (a leading, trailing or doubled ".")';
    if (/[\s\p{Cc}]/u.test(token)) return 'holds whitespace or a control character';
    if (/[*>]/.test(token)) return 'holds a wildcard ("*" or ">"); a message is published to one subject';
  }
  return undefined;
}

function probe(schema: string, stream: string, unknown: 'a' | 'b'): RelayMessage {
  const seq = unknown === 'a' ? 1n : 2n;
  return { id: '', schema, event: streamEvent({ seq, stream, kind: unknown, key: unknown, payloadText: '{}', headersText: '{}', occurredAt: new Date(0) }) };
}

/**
 * Checks that the template's literal text makes valid subjects whatever the
 * fields hold. A rendered field is never empty and never starts or ends
 * with a dot, so the token structure of any subject is that of a sample.
 */
export function checkSubjectTemplate(template: Template, option: string): void {
  const problem = subjectProblem(template.render(probe('x', 'x', 'a'), subjectField));
  if (problem) throw new InvalidOptionsError(option, `${JSON.stringify(template.text)} ${problem}`);
}

/**
 * The subject filter covering every subject the relay publishes for
 * `stream`: the template rendered with the fields known up front (schema
 * and stream), and `>` from the token of the first other field on, e.g.
 * `tidemark.orders.>`. It is found by rendering two probes that differ only
 * in kind, key and seq: they agree up to that field's first character.
 */
export function subjectFilter(template: Template, schema: string, stream: string): string {
  const a = template.render(probe(schema, stream, 'a'), subjectField);
  const b = template.render(probe(schema, stream, 'b'), subjectField);
  let i = 0;
  while (i < a.length && a[i] === b[i]) i += 1;
  if (i === a.length && i === b.length) return a;
  return `${a.slice(0, a.lastIndexOf('.', i - 1) + 1)}>`;
}

/** Whether every subject matching `filter` matches `pattern` (both may hold wildcards). */
export function subjectCovers(pattern: string, filter: string): boolean {
  const p = pattern.split('.');
  const f = filter.split('.');
  for (let i = 0; i < p.length; i += 1) {
    if (p[i] === '>') return i < f.length; // one or more tokens left, whatever they are
    if (i >= f.length || f[i] === '>') return false;
    if (p[i] !== '*' && p[i] !== f[i]) return false; // a literal matches only itself; f's '*' only p's '*'
  }
  return p.length === f.length;
}

/** `filters` without repeats and without those another one covers (a stream's subjects may not overlap). */
export function minimalFilters(filters: readonly string[]): string[] {
  const unique = [...new Set(filters)];
  return unique.filter((f) => !unique.some((g) => g !== f && subjectCovers(g, f)));
}
