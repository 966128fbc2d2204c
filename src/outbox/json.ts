/**
 * JSON text as PostgreSQL's jsonb takes it: one pass that refuses what jsonb
 * would refuse (with the path of the offending value) and measures the text
 * jsonb gives back (`value::jsonb::text`), so that the event limits are
 * checked in the client exactly as the database's CHECK constraints check
 * them. The text itself is never rewritten: it is what PostgreSQL parses.
 *
 * jsonb renders `{"a": 1, "b": [true, null]}`: ", " and ": " as separators,
 * no other white space, the last of duplicate keys, numbers as `numeric`
 * prints them (`1e2` as `100`, `1.50` as `1.50`, `-0` as `0`), strings with
 * only `"`, `\`, and control characters escaped.
 */

/** A member name or an array index on the way to a value. */
export type Segment = string | number;

/** A value PostgreSQL cannot store, at `segments` (`$.items[3].price`); none for text that is not JSON at all. */
export class JsonProblem extends Error {
  constructor(
    readonly segments: readonly Segment[],
    message: string,
  ) {
    super(message);
    this.name = 'JsonProblem';
  }

  /** The path, JSONPath style: `$.items[3].price`. */
  get path(): string {
    return formatPath(this.segments);
  }
}

/** A member of a top-level object: its value's span in the text and, for a string, the string. */
export interface JsonMember {
  start: number;
  end: number;
  /** The decoded value when it is a string; undefined otherwise. */
  text: string | undefined;
  /** The first character of the value: `{`, `[`, `"`, `t`, `f`, `n`, or a number's first character. */
  kind: string;
  /** UTF-8 bytes of the value as PostgreSQL renders it. */
  size: number;
}

/** What {@link scanJson} found. */
export interface JsonScan {
  /** UTF-8 bytes of the value as PostgreSQL renders it. */
  size: number;
  /** Whether the value is an object. */
  object: boolean;
  /** With `members`: the top-level object's members, the last of duplicates. */
  members?: Map<string, JsonMember>;
}

/** numeric's limits: digits before the decimal point, digits after it (NUMERIC_WEIGHT_MAX, NUMERIC_DSCALE_MAX). */
const NUMERIC_MAX_INTEGER_DIGITS = 131072;
const NUMERIC_MAX_SCALE = 16383;
/** Exponents PostgreSQL 15 refuses even on zero (18 accepts one more); the stricter bound holds for both. */
const NUMERIC_MAX_EXPONENT = 1073741822;

interface ObjectFrame {
  object: true;
  /** Rendered size of each member (`"key": value`), by key: a later duplicate replaces an earlier one. */
  sizes: Map<string, number>;
  key: string;
  keySize: number;
  valueStart: number;
}

interface ArrayFrame {
  object: false;
  size: number;
  count: number;
}

const WHITESPACE = new Set([0x20, 0x09, 0x0a, 0x0d]);
const NUMBER = /^(-?)(0|[1-9]\d*)(?:\.(\d+))?(?:[eE]([+-]?\d+))?$/;
const NUMBER_CHARS = /[\d.eE+-]/;
const ESCAPES: Record<string, string> = { '"': '"', '\\': '\\', '/': '/', b: '\b', f: '\f', n: '\n', r: '\r', t: '\t' };

/** Segments as a JSONPath: `$.items[3]["odd key"]`. Long member names are cut. */
export function formatPath(path: readonly Segment[]): string {
  let text = '$';
  for (const segment of path) {
    if (typeof segment === 'number') text += `[${segment}]`;
    else if (/^[A-Za-z_$][\w$]{0,39}$/.test(segment)) text += `.${segment}`;
    else text += `[${JSON.stringify(segment.length > 40 ? `${segment.slice(0, 40)}…` : segment)}]`;
  }
  return text;
}

/** UTF-8 bytes of one BMP character as jsonb prints it inside a string. */
function renderedUnit(code: number): number {
  if (code === 0x22 || code === 0x5c) return 2; // \" \\
  if (code < 0x20) return code === 0x08 || code === 0x0c || code === 0x0a || code === 0x0d || code === 0x09 ? 2 : 6;
  if (code < 0x80) return 1;
  return code < 0x800 ? 2 : 3;
}

class Scanner {
  private i = 0;
  private readonly path: Segment[] = [];

  constructor(private readonly text: string) {}

  fail(message: string): never {
    throw new JsonProblem([...this.path], message);
  }

  /** Not JSON at all: the position says where, a path would not. */
  syntax(message: string, at = this.i): never {
    throw new JsonProblem([], `is not valid JSON: ${message} at character ${at + 1}`);
  }

  skipWhitespace(): void {
    while (this.i < this.text.length && WHITESPACE.has(this.text.charCodeAt(this.i))) this.i += 1;
  }

  expect(char: string, what: string): void {
    this.skipWhitespace();
    if (this.text[this.i] !== char) this.unexpected(what);
    this.i += 1;
  }

  unexpected(what: string): never {
    if (this.i >= this.text.length) this.syntax(`the text ends where ${what} was expected`);
    this.syntax(`${what} was expected, not ${JSON.stringify(this.text[this.i])},`);
  }

  /** A string starting at `"`: its rendered size and, when `decode`, its value. */
  string(decode: boolean): { size: number; value: string } {
    const text = this.text;
    let i = this.i + 1;
    let size = 2;
    let value = '';
    let chunk = i;
    for (;;) {
      if (i >= text.length) this.syntax('a string is not closed', this.i);
      const code = text.charCodeAt(i);
      if (code === 0x22) break;
      if (code < 0x20) this.syntax('a control character in a string must be escaped', i);
      if (code !== 0x5c) {
        if (code >= 0xd800 && code <= 0xdfff) {
          const next = text.charCodeAt(i + 1);
          if (code > 0xdbff || !(next >= 0xdc00 && next <= 0xdfff)) this.fail('contains a lone UTF-16 surrogate, which PostgreSQL cannot store');
          size += 4;
          i += 2;
          continue;
        }
        size += renderedUnit(code);
        i += 1;
        continue;
      }
      if (decode) value += text.slice(chunk, i);
      const escape = text[i + 1];
      let decoded: string;
      if (escape === 'u') {
        const unit = this.hex(i + 2);
        if (unit === 0) this.fail('contains \\u0000, which PostgreSQL cannot store in jsonb');
        i += 6;
        if (unit >= 0xd800 && unit <= 0xdbff && text[i] === '\\' && text[i + 1] === 'u') {
          const low = this.hex(i + 2);
          if (low >= 0xdc00 && low <= 0xdfff) {
            i += 6;
            size += 4;
            if (decode) value += String.fromCharCode(unit, low);
            chunk = i;
            continue;
          }
        }
        if (unit >= 0xd800 && unit <= 0xdfff) this.fail('contains a lone UTF-16 surrogate, which PostgreSQL cannot store');
        decoded = String.fromCharCode(unit);
      } else {
        if (escape === undefined || !Object.hasOwn(ESCAPES, escape)) this.syntax('an unknown escape in a string', i);
        decoded = ESCAPES[escape]!;
        i += 2;
      }
      size += renderedUnit(decoded.charCodeAt(0));
      if (decode) value += decoded;
      chunk = i;
    }
    if (decode) value += text.slice(chunk, i);
    this.i = i + 1;
    return { size, value };
  }

  hex(at: number): number {
    const digits = this.text.slice(at, at + 4);
    if (!/^[0-9A-Fa-f]{4}$/.test(digits)) this.syntax('\\u must be followed by four hex digits', at - 2);
    return parseInt(digits, 16);
  }

  /** A number: its size as numeric prints it; refuses what numeric cannot hold. */
  number(): number {
    let end = this.i;
    while (end < this.text.length && NUMBER_CHARS.test(this.text[end]!)) end += 1;
    const match = NUMBER.exec(this.text.slice(this.i, end));
    if (!match) this.syntax('a malformed number');
    this.i = end;
    const [, sign, integer = '', fraction = '', exponentText] = match;
    const exponent = exponentText === undefined ? 0 : Number(exponentText);
    const overflow = () => this.fail("holds a number PostgreSQL's numeric cannot hold (over 131072 digits before the decimal point or 16383 after it)");
    if (Math.abs(exponent) > NUMERIC_MAX_EXPONENT) overflow();
    const scale = Math.max(0, fraction.length - exponent);
    if (scale > NUMERIC_MAX_SCALE) overflow();
    const digits = integer + fraction;
    let zeros = 0;
    while (zeros < digits.length && digits.charCodeAt(zeros) === 0x30) zeros += 1;
    const zero = zeros === digits.length;
    const integerDigits = zero ? 0 : integer.length + exponent - zeros;
    if (integerDigits > NUMERIC_MAX_INTEGER_DIGITS) overflow();
    return (sign && !zero ? 1 : 0) + Math.max(1, integerDigits) + (scale > 0 ? 1 + scale : 0);
  }

  literal(): number {
    for (const word of ['true', 'false', 'null']) {
      if (this.text.startsWith(word, this.i)) {
        this.i += word.length;
        return word.length;
      }
    }
    this.unexpected('a value');
  }

  /** One value; containers are walked with an explicit stack, so nesting depth costs no call stack. */
  scan(members: boolean): JsonScan {
    const stack: (ObjectFrame | ArrayFrame)[] = [];
    const top: Map<string, JsonMember> | undefined = members ? new Map() : undefined;
    let first = '';
    let size = 0;
    value: for (;;) {
      this.skipWhitespace();
      const char = this.text[this.i];
      if (stack.length === 0) first = char ?? '';
      let decoded: string | undefined;
      if (char === '{' || char === '[') {
        this.i += 1;
        this.skipWhitespace();
        if (this.text[this.i] === (char === '{' ? '}' : ']')) {
          this.i += 1;
          size = 2;
        } else if (char === '{') {
          stack.push(this.member({ object: true, sizes: new Map(), key: '', keySize: 0, valueStart: 0 }));
          continue value;
        } else {
          stack.push({ object: false, size: 0, count: 0 });
          this.path.push(0);
          continue value;
        }
      } else if (char === '"') {
        const s = this.string(top !== undefined && stack.length === 1);
        size = s.size;
        decoded = s.value;
      } else if (char === '-' || (char !== undefined && char >= '0' && char <= '9')) {
        size = this.number();
      } else {
        size = this.literal();
      }
      // A value ended: add it to its container; close containers that end here.
      for (;;) {
        const frame = stack.at(-1);
        if (!frame) {
          this.skipWhitespace();
          if (this.i < this.text.length) this.unexpected('the end of the text');
          return { size, object: first === '{', members: top };
        }
        if (frame.object) {
          frame.sizes.set(frame.key, frame.keySize + 2 + size);
          if (top && stack.length === 1) {
            top.delete(frame.key); // the last duplicate wins, as in jsonb
            top.set(frame.key, { start: frame.valueStart, end: this.i, text: decoded, kind: this.text[frame.valueStart]!, size });
          }
          this.path.pop();
          this.skipWhitespace();
          if (this.text[this.i] === ',') {
            this.i += 1;
            this.member(frame);
            continue value;
          }
          if (this.text[this.i] !== '}') this.unexpected('"," or "}"');
          this.i += 1;
          size = 2 + 2 * (frame.sizes.size - 1);
          for (const member of frame.sizes.values()) size += member;
        } else {
          frame.size += size;
          frame.count += 1;
          this.skipWhitespace();
          if (this.text[this.i] === ',') {
            this.i += 1;
            this.path[this.path.length - 1] = frame.count;
            continue value;
          }
          if (this.text[this.i] !== ']') this.unexpected('"," or "]"');
          this.i += 1;
          this.path.pop();
          size = 2 + frame.size + 2 * (frame.count - 1);
        }
        stack.pop();
        decoded = undefined;
      }
    }
  }

  /** Reads `"key":` into `frame` and leaves the cursor at the member's value. */
  member(frame: ObjectFrame): ObjectFrame {
    this.skipWhitespace();
    if (this.text[this.i] !== '"') this.unexpected('a member name in double quotes');
    const key = this.string(true);
    frame.key = key.value;
    frame.keySize = key.size;
    this.expect(':', '":"');
    this.path.push(key.value);
    this.skipWhitespace();
    frame.valueStart = this.i;
    return frame;
  }
}

/**
 * Scans one JSON value. Throws {@link JsonProblem} for text PostgreSQL's
 * jsonb would refuse: invalid JSON, `\u0000`, a lone surrogate, a number
 * outside `numeric`'s range. With `members`, also returns the members of a
 * top-level object (their spans in `text`).
 */
export function scanJson(text: string, members = false): JsonScan {
  return new Scanner(text).scan(members);
}
