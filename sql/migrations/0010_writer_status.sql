-- tidemark schema, version 10: a writer role may read the published watermark.
-- Placeholders: {{schema}} (quoted identifier).
--
-- `tidemark status` as a writer role was refused (permission denied for
-- table watermark): the role could read nothing but events.seq. What a
-- writer wants to know is whether what it appended is published and
-- whether a watermarker runs; safe_seq, when it was published and the
-- lease say that and name no event's content. The lease's candidates and
-- the blocking writers stay the owner's; streams, horizons and cursors stay
-- the consumers'.

CREATE OR REPLACE FUNCTION {{schema}}.grant_writer(p_role text) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = p_role) THEN
    EXECUTE pg_catalog.format('CREATE ROLE %I NOLOGIN', p_role);
  END IF;
  EXECUTE pg_catalog.format('GRANT USAGE ON SCHEMA {{schema}} TO %I', p_role);
  EXECUTE pg_catalog.format('GRANT INSERT (stream, kind, key, payload, headers) ON {{schema}}.events TO %I', p_role);
  EXECUTE pg_catalog.format('GRANT SELECT (seq) ON {{schema}}.events TO %I', p_role);
  EXECUTE pg_catalog.format('GRANT SELECT (safe_seq, updated_at, lease_owner, lease_expires_at) ON {{schema}}.watermark TO %I', p_role);
END
$$;

-- Writer roles made before this version: every role granted INSERT on
-- events.payload by name (grant_writer's grant; not the roles that inherit
-- it, nor the owner) is given the same columns.
DO $$
DECLARE
  r record;
BEGIN
  FOR r IN
    SELECT DISTINCT g.rolname
      FROM pg_catalog.pg_attribute a,
           LATERAL pg_catalog.aclexplode(a.attacl) x
      JOIN pg_catalog.pg_roles g ON g.oid = x.grantee
     WHERE a.attrelid = '{{schema}}.events'::pg_catalog.regclass
       AND a.attname = 'payload'
       AND x.privilege_type = 'INSERT'
  LOOP
    EXECUTE pg_catalog.format('GRANT SELECT (safe_seq, updated_at, lease_owner, lease_expires_at) ON {{schema}}.watermark TO %I', r.rolname);
  END LOOP;
END
$$;
