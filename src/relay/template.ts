/**
 * Destination templates: a NATS subject, a RabbitMQ exchange or routing key
 * built from an event's fields, e.g. `{schema}.{stream}.{kind}`. A template
 * is checked when the relay is configured, before anything connects: a
 * field it does not know, or an unclosed brace, is an `InvalidOptionsError`.
 */
import { InvalidOptionsError } from '../errors.js';
import type { RelayMessage } from './sink.js';

/** The fields a template may name. */
export const TEMPLATE_FIELDS = ['schema', 'stream', 'kind', 'key', 'seq'] as const;
export type TemplateField = (typeof TEMPLATE_FIELDS)[number];

/** A checked template: renders a message, each field's value passed through `escape`. */
export interface Template {
  /** The template as given. */
  readonly text: string;
  /** The fields it names, in order of first use. */
  readonly fields: readonly TemplateField[];
  render(message: RelayMessage, escape?: (value: string) => string): string;
}

type Part = string | { field: TemplateField };

/**
 * Parses `text`: `{field}` is replaced by the event's field, `{{` and `}}`
 * are literal braces, anything else is literal. `option` names the option
 * or flag in errors.
 */
export function compileTemplate(text: unknown, option: string): Template {
  if (typeof text !== 'string' || text.length === 0) throw new InvalidOptionsError(option, 'expected a non-empty template string');
  const parts: Part[] = [];
  const fields: TemplateField[] = [];
  let literal = '';
  for (let i = 0; i < text.length; ) {
    const c = text[i]!;
    if ((c === '{' || c === '}') && text[i + 1] === c) {
      literal += c;
      i += 2;
    } else if (c === '{') {
      const end = text.indexOf('}', i);
      if (end < 0) throw new InvalidOptionsError(option, `unclosed "{" at position ${i + 1} of ${JSON.stringify(clip(text))}`);
      const name = text.slice(i + 1, end);
      if (!(TEMPLATE_FIELDS as readonly string[]).includes(name)) {
        throw new InvalidOptionsError(option, `unknown field {${clip(name)}} in ${JSON.stringify(clip(text))}; a template may name ${TEMPLATE_FIELDS.map((f) => `{${f}}`).join(', ')}`);
      }
      if (literal) parts.push(literal);
      literal = '';
      parts.push({ field: name as TemplateField });
      if (!fields.includes(name as TemplateField)) fields.push(name as TemplateField);
      i = end + 1;
    } else if (c === '}') {
      throw new InvalidOptionsError(option, `unmatched "}" at position ${i + 1} of ${JSON.stringify(clip(text))} (write "}}" for a literal brace)`);
    } else {
      literal += c;
      i += 1;
    }
  }
  if (literal) parts.push(literal);
  return {
    text,
    fields,
    render(message, escape = (v) => v) {
      let out = '';
      for (const part of parts) out += typeof part === 'string' ? part : escape(fieldValue(message, part.field));
      return out;
    },
  };
}

function fieldValue(message: RelayMessage, field: TemplateField): string {
  switch (field) {
    case 'schema':
      return message.schema;
    case 'seq':
      return message.event.seq.toString();
    default:
      return message.event[field];
  }
}

function clip(text: string): string {
  return text.length > 80 ? `${text.slice(0, 77)}...` : text;
}
