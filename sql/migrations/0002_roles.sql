-- tidemark schema, version 2: opt-in least-privilege roles.
-- Placeholders: {{schema}} (quoted identifier), {{fence_key}}.
--
-- Nothing is granted until an operator calls these functions; the migrating
-- role (the owner) keeps full rights and runs the watermarker and pruner.
--   SELECT {{schema}}.grant_writer('app_writer');     -- then GRANT app_writer TO app;
--   SELECT {{schema}}.grant_consumer('app_consumer', ARRAY['billing']);

-- Only the owner runs the watermark step and writes heartbeats.
REVOKE EXECUTE ON FUNCTION {{schema}}.watermark_step(text, boolean, integer, boolean) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION {{schema}}.beat(text, text, jsonb, integer) FROM PUBLIC;

-- Writer: INSERT of the five writable columns of events, and nothing else.
-- Column privileges are the point: with table-wide INSERT, a writer could
-- choose seq through OVERRIDING SYSTEM VALUE or COPY events (seq, ...) and
-- break gap-freedom (docs/PROTOCOL.md, section 5). SELECT (seq) lets
-- INSERT ... RETURNING seq work without exposing any event's content.
-- occurred_at is not writable: retention ages events by it.
CREATE FUNCTION {{schema}}.grant_writer(p_role text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = p_role) THEN
    EXECUTE format('CREATE ROLE %I NOLOGIN', p_role);
  END IF;
  EXECUTE format('GRANT USAGE ON SCHEMA {{schema}} TO %I', p_role);
  EXECUTE format('GRANT INSERT (stream, kind, key, payload, headers) ON {{schema}}.events TO %I', p_role);
  EXECUTE format('GRANT SELECT (seq) ON {{schema}}.events TO %I', p_role);
END
$$;

-- Which roles may use which consumers' cursor rows. Row-level security on
-- cursors enforces it for every role but the owner (and superusers): a
-- consumer role that could move another consumer's cursor could make it skip
-- events silently.
CREATE TABLE {{schema}}.consumer_grants (
  role_id  oid NOT NULL,  -- pg_roles.oid: a role dropped and recreated under the same name gets nothing
  consumer text NOT NULL CHECK (consumer <> ''),
  PRIMARY KEY (role_id, consumer)
);

ALTER TABLE {{schema}}.cursors ENABLE ROW LEVEL SECURITY;
-- The join with pg_roles skips grants of dropped roles.
CREATE POLICY cursors_granted_consumers ON {{schema}}.cursors
  USING (EXISTS (
    SELECT 1 FROM {{schema}}.consumer_grants g JOIN pg_catalog.pg_roles r ON r.oid = g.role_id
     WHERE g.consumer = cursors.consumer
       AND pg_catalog.pg_has_role(current_user, r.oid, 'USAGE')))
  WITH CHECK (EXISTS (
    SELECT 1 FROM {{schema}}.consumer_grants g JOIN pg_catalog.pg_roles r ON r.oid = g.role_id
     WHERE g.consumer = cursors.consumer
       AND pg_catalog.pg_has_role(current_user, r.oid, 'USAGE')));

-- Consumer: read events, the watermark and horizons; create, lock and
-- advance the cursor rows of the named consumers only (SELECT ... FOR NO KEY
-- UPDATE needs UPDATE). Handlers write the consumer's own projection tables,
-- which the application grants.
CREATE FUNCTION {{schema}}.grant_consumer(p_role text, p_consumers text[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
  IF p_consumers IS NULL OR cardinality(p_consumers) = 0 THEN
    RAISE EXCEPTION 'grant_consumer: name the consumers % may use, e.g. ARRAY[''billing'']', p_role
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = p_role) THEN
    EXECUTE format('CREATE ROLE %I NOLOGIN', p_role);
  END IF;
  EXECUTE format('GRANT USAGE ON SCHEMA {{schema}} TO %I', p_role);
  EXECUTE format('GRANT SELECT ON {{schema}}.events, {{schema}}.watermark, {{schema}}.horizons TO %I', p_role);
  EXECUTE format('GRANT SELECT ON {{schema}}.consumer_grants TO %I', p_role);
  EXECUTE format('GRANT SELECT, INSERT ON {{schema}}.cursors TO %I', p_role);
  EXECUTE format('GRANT UPDATE (seq, updated_at, resync_count, last_resync_at) ON {{schema}}.cursors TO %I', p_role);
  INSERT INTO {{schema}}.consumer_grants (role_id, consumer)
  SELECT r.oid, c FROM pg_catalog.pg_roles r, unnest(p_consumers) AS c
   WHERE r.rolname = p_role
  ON CONFLICT DO NOTHING;
END
$$;

REVOKE EXECUTE ON FUNCTION {{schema}}.grant_writer(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION {{schema}}.grant_consumer(text, text[]) FROM PUBLIC;
