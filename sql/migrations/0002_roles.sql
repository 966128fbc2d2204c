-- tidemark schema, version 2: opt-in least-privilege roles.
-- Placeholders: {{schema}} (quoted identifier), {{fence_key}}.
--
-- Nothing is granted until an operator calls these functions; the migrating
-- role (the owner) keeps full rights and runs the watermarker and pruner.
--   SELECT {{schema}}.grant_writer('app_writer');     -- then GRANT app_writer TO app;
--   SELECT {{schema}}.grant_consumer('app_consumer');

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

-- Consumer: read events, the watermark and horizons; create, lock and
-- advance cursor rows (SELECT ... FOR UPDATE needs UPDATE). Handlers write
-- the consumer's own projection tables, which the application grants.
CREATE FUNCTION {{schema}}.grant_consumer(p_role text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = p_role) THEN
    EXECUTE format('CREATE ROLE %I NOLOGIN', p_role);
  END IF;
  EXECUTE format('GRANT USAGE ON SCHEMA {{schema}} TO %I', p_role);
  EXECUTE format('GRANT SELECT ON {{schema}}.events, {{schema}}.watermark, {{schema}}.horizons TO %I', p_role);
  EXECUTE format('GRANT SELECT, INSERT ON {{schema}}.cursors TO %I', p_role);
  EXECUTE format('GRANT UPDATE (seq, updated_at, resync_count, last_resync_at) ON {{schema}}.cursors TO %I', p_role);
END
$$;

REVOKE EXECUTE ON FUNCTION {{schema}}.grant_writer(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION {{schema}}.grant_consumer(text) FROM PUBLIC;
