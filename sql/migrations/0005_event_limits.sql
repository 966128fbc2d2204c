-- tidemark schema, version 5: one set of event limits, for every writer.
-- Placeholders: {{schema}} (quoted identifier).
--
-- append/appendMany and the CLI check the same limits before sending
-- anything (EVENT_LIMITS in src/outbox/limits.ts; change both together, in
-- a new migration). These constraints hold plain-SQL writers, COPY and
-- other languages to them, so that nothing stored can be refused by a
-- consumer later (a 300-character stream that no tailer accepts) or fail
-- in an index (an over-long key):
--   stream, kind  1-200 UTF-16 code units (String.length in JavaScript:
--                 the rule consumers apply to stream names)
--   key           1-256 UTF-16 code units
--   headers       at most 65536 bytes as stored (octet_length(headers::text))
--   payload and headers together at most 1048576 bytes as stored
-- 200 + 200 + 256 code units are at most 1968 UTF-8 bytes, so an index over
-- stream, kind and key together stays under B-tree's 2704-byte row limit.
--
-- NOT VALID: rows written before this migration are not scanned (they may
-- exceed the limits; the migration stays quick on a large table). Every new
-- row is checked. To check old rows too:
--   ALTER TABLE tidemark.events VALIDATE CONSTRAINT events_stream_limit;  -- and the others
--
-- Each check does only cheap work on a row within the limits; a row over a
-- limit reaches refuse_event(), whose error names the column and the limit.

-- The error a row over a limit gets: SQLSTATE 23514 (check_violation) with
-- the column and constraint set, so that clients can tell which field it
-- was without reading the message. It only raises: every value it reports
-- is computed by the CHECK expression, whose functions are bound when the
-- constraint is created (a writer's search_path cannot change them).
CREATE FUNCTION {{schema}}.refuse_event(p_column text, p_size bigint, p_limit bigint, p_unit text, p_constraint text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
  RAISE EXCEPTION 'tidemark events.%: % %, over the limit of %', p_column, p_size, p_unit, p_limit
    USING ERRCODE = 'check_violation',
          COLUMN = p_column,
          TABLE = 'events',
          CONSTRAINT = p_constraint,
          HINT = 'Every writer is held to the same limits: see "Event limits" in the tidemark README.';
END
$$;
-- Writers run it inside their INSERT (as a grant_writer() role, too).
GRANT EXECUTE ON FUNCTION {{schema}}.refuse_event(text, bigint, bigint, text, text) TO PUBLIC;

-- A value of at most N bytes has at most N UTF-16 code units, so the usual
-- case costs one octet_length(); past it, UTF-16 length is the code point
-- count plus one per code point above U+FFFF (a surrogate pair).
ALTER TABLE {{schema}}.events
  ADD CONSTRAINT events_stream_limit CHECK (CASE
    WHEN octet_length(stream) <= 200 THEN true
    WHEN char_length(stream) + char_length(regexp_replace(stream, E'[^\\U00010000-\\U0010FFFF]+', '', 'g')) <= 200 THEN true
    ELSE {{schema}}.refuse_event('stream',
      char_length(stream) + char_length(regexp_replace(stream, E'[^\\U00010000-\\U0010FFFF]+', '', 'g')),
      200, 'characters (UTF-16 code units)', 'events_stream_limit')
  END) NOT VALID,
  ADD CONSTRAINT events_kind_limit CHECK (CASE
    WHEN octet_length(kind) <= 200 THEN true
    WHEN char_length(kind) + char_length(regexp_replace(kind, E'[^\\U00010000-\\U0010FFFF]+', '', 'g')) <= 200 THEN true
    ELSE {{schema}}.refuse_event('kind',
      char_length(kind) + char_length(regexp_replace(kind, E'[^\\U00010000-\\U0010FFFF]+', '', 'g')),
      200, 'characters (UTF-16 code units)', 'events_kind_limit')
  END) NOT VALID,
  ADD CONSTRAINT events_key_limit CHECK (CASE
    WHEN octet_length(key) <= 256 THEN true
    WHEN char_length(key) + char_length(regexp_replace(key, E'[^\\U00010000-\\U0010FFFF]+', '', 'g')) <= 256 THEN true
    ELSE {{schema}}.refuse_event('key',
      char_length(key) + char_length(regexp_replace(key, E'[^\\U00010000-\\U0010FFFF]+', '', 'g')),
      256, 'characters (UTF-16 code units)', 'events_key_limit')
  END) NOT VALID,
  ADD CONSTRAINT events_headers_limit CHECK (CASE
    WHEN octet_length(headers::text) <= 65536 THEN true
    ELSE {{schema}}.refuse_event('headers', octet_length(headers::text), 65536, 'bytes as stored', 'events_headers_limit')
  END) NOT VALID,
  ADD CONSTRAINT events_size_limit CHECK (CASE
    WHEN octet_length(payload::text) + octet_length(headers::text) <= 1048576 THEN true
    ELSE {{schema}}.refuse_event('payload', octet_length(payload::text) + octet_length(headers::text), 1048576,
      'bytes as stored, with headers', 'events_size_limit')
  END) NOT VALID;
