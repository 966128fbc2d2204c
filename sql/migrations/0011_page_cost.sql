-- tidemark schema, version 11: a page costs what it did before the fixed
-- search_path.
-- Placeholders: {{schema}} (quoted identifier).
--
-- Version 7 gave every function `SET search_path = pg_catalog, pg_temp`.
-- PostgreSQL never inlines a SQL function that has a SET clause, and runs
-- such a function by parsing and planning its body again on every call
-- from a new statement. The page's small SQL helpers then cost more than
-- the page: one empty page spent 0.44 ms in page_info alone, because the
-- planner pulled the subquery of page_info and open_page up into the outer
-- query and so evaluated open_page five times and open_pages twice per
-- call (track_functions: 6 open_page and 12 open_pages calls a page).
-- PL/pgSQL caches its plans for the session and evaluates a plain
-- expression without an executor, and each helper below computes its value
-- once. What every function returns is unchanged, byte for byte, and each
-- keeps its fixed search_path and its volatility.

CREATE OR REPLACE FUNCTION {{schema}}.cursor_lock_key(p_consumer text, p_stream text) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  RETURN pg_catalog.hashtextextended(
    (pg_catalog.length(p_consumer)::text || ':' || p_consumer || p_stream) COLLATE "C",
    (-8344625403455539058)::bigint);
END
$$;

CREATE OR REPLACE FUNCTION {{schema}}.open_pages() RETURNS jsonb
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  RETURN coalesce(nullif(pg_catalog.current_setting('tidemark.pages', true), '')::jsonb, '{}'::jsonb);
END
$$;

CREATE OR REPLACE FUNCTION {{schema}}.open_page(p_key bigint) RETURNS jsonb
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_page jsonb := {{schema}}.open_pages() -> p_key::text;
BEGIN
  -- An entry of another transaction (a value SET for the session by hand)
  -- is no page.
  IF (v_page ->> 5) = pg_catalog.pg_current_xact_id_if_assigned()::text THEN
    RETURN v_page;
  END IF;
  RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION {{schema}}.remember_page(p_key bigint, p_cursor bigint, p_through bigint, p_safe_seq bigint, p_read_to bigint) RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  RETURN pg_catalog.set_config('tidemark.pages',
    ({{schema}}.open_pages() || pg_catalog.jsonb_build_object(p_key::text,
      pg_catalog.jsonb_build_array(p_cursor, p_through, p_cursor, p_safe_seq, p_read_to, pg_catalog.pg_current_xact_id()::text)))::text,
    true);
END
$$;

CREATE OR REPLACE FUNCTION {{schema}}.page_info(p_consumer text, p_stream text)
RETURNS TABLE (cursor bigint, through bigint, advanced_to bigint, safe_seq bigint)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_page jsonb := {{schema}}.open_page({{schema}}.cursor_lock_key(p_consumer, p_stream));
BEGIN
  IF v_page IS NOT NULL THEN
    RETURN QUERY SELECT (v_page ->> 0)::bigint, (v_page ->> 1)::bigint, (v_page ->> 2)::bigint, (v_page ->> 3)::bigint;
  END IF;
END
$$;
