/**
 * A hostile public schema: what a role allowed to create objects in public
 * (every role, on a database created before PostgreSQL 15) can plant to
 * steer SQL that resolves names through its search_path. PostgreSQL takes
 * an operator or function from pg_catalog only when nothing on the path
 * matches the arguments better, so the decoys are the better matches a
 * statement could meet:
 *
 * - for every function name of pg_catalog and every arity up to 5, one
 *   taking text for each argument (an untyped parameter or literal prefers
 *   the string category: `pg_advisory_lock($1)` would call it);
 * - for every function and aggregate of pg_catalog with polymorphic
 *   arguments (`unnest(anyarray)`, `json_agg(anyelement)`), one for each
 *   of a list of concrete types;
 * - for every infix operator name of pg_catalog and every pair of a list of
 *   types that pg_catalog has no exact operator for (`float8 * int4`,
 *   `text[] && text[]`), one for that pair.
 *
 * Every decoy counts its call in the sequence public.decoy_hits (the count
 * survives the rollback of the statement that ran it) and raises SQLSTATE
 * TMDCY. None is planted where pg_catalog has the exact signature: such a
 * decoy could never be chosen on a path where pg_catalog comes first (the
 * default; a path naming pg_catalog after public is not covered, see
 * docs/PROTOCOL.md §5.1). Not planted either: named-argument twins, twins
 * of more than five arguments, prefix operators, a "$user" schema.
 */
import type { Session } from './db.js';

/** Built-in types a statement of tidemark's may apply operators to, in pairs. */
export const BUILTIN_TYPES = [
  'text', 'bigint', 'integer', 'smallint', 'numeric', 'double precision', 'real', 'jsonb', 'json', 'boolean',
  'timestamptz', 'timestamp', 'interval', 'oid', 'name', 'xid8', 'inet', 'bytea',
  'text[]', 'bigint[]', 'integer[]', 'jsonb[]', 'oid[]', 'name[]',
];

/** Types substituted for polymorphic arguments. */
const CONCRETE_TYPES = ['text', 'bigint', 'integer', 'jsonb', 'json', 'boolean', 'timestamptz', 'oid', 'double precision', 'numeric', 'name'];

const POLYMORPHIC = ['anyelement', 'anyarray', 'anynonarray', 'anycompatible', 'anycompatiblearray', 'anycompatiblenonarray'];

const sqlArray = (items: string[]) => `ARRAY[${items.map((i) => `'${i.replaceAll("'", "''")}'`).join(', ')}]::text[]`;

/** The counter and the function every decoy calls. */
const SETUP = `
CREATE SEQUENCE IF NOT EXISTS public.decoy_hits;
GRANT USAGE, UPDATE, SELECT ON SEQUENCE public.decoy_hits TO PUBLIC;
CREATE OR REPLACE FUNCTION public.decoy_hit(p_name text) RETURNS text
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  PERFORM pg_catalog.nextval('public.decoy_hits');
  RAISE EXCEPTION 'a decoy in schema public ran: %', p_name USING ERRCODE = 'TMDCY';
END
$$;`;

/** Function and aggregate decoys (text arguments; polymorphic ones made concrete). */
const FUNCTIONS = `
DO $plant$
DECLARE
  f record;
  t text;
  v_args text[];
  v_sig text;
BEGIN
  PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
  FOR f IN
    SELECT DISTINCT p.proname, p.pronargs FROM pg_proc p
     WHERE p.pronamespace = 'pg_catalog'::regnamespace AND p.prokind = 'f' AND p.pronargs BETWEEN 1 AND 5
       AND NOT EXISTS (SELECT 1 FROM pg_proc q WHERE q.pronamespace = 'pg_catalog'::regnamespace AND q.proname = p.proname
                        AND q.proargtypes::oid[] = array_fill('text'::regtype::oid, ARRAY[p.pronargs]))
  LOOP
    EXECUTE format('CREATE FUNCTION public.%I(%s) RETURNS text LANGUAGE sql AS %L', f.proname,
      array_to_string(array_fill('text'::text, ARRAY[f.pronargs]), ', '), format('SELECT public.decoy_hit(%L)', f.proname));
  END LOOP;

  FOR f IN
    SELECT p.proname, p.prokind, p.proargtypes::oid[]::regtype[]::text[] AS args FROM pg_proc p
      LEFT JOIN pg_aggregate a ON a.aggfnoid = p.oid
     WHERE p.pronamespace = 'pg_catalog'::regnamespace AND p.pronargs BETWEEN 1 AND 3 AND p.provariadic = 0
       AND (p.prokind = 'f' OR (p.prokind = 'a' AND p.pronargs = 1 AND a.aggkind = 'n'))
       AND p.proargtypes::oid[]::regtype[]::text[] && ${sqlArray(POLYMORPHIC)}
       AND NOT EXISTS (SELECT 1 FROM unnest(p.proargtypes) x(oid) JOIN pg_type y ON y.oid = x.oid
                        WHERE y.typtype = 'p' AND NOT y.typname = ANY (${sqlArray(POLYMORPHIC)}))
  LOOP
    FOREACH t IN ARRAY ${sqlArray(CONCRETE_TYPES)} LOOP
      v_args := ARRAY(SELECT CASE WHEN u.a IN ('anyarray', 'anycompatiblearray') THEN t || '[]'
                                  WHEN u.a = ANY (${sqlArray(POLYMORPHIC)}) THEN t ELSE u.a END
                        FROM unnest(f.args) WITH ORDINALITY u(a, i) ORDER BY u.i);
      v_sig := format('public.%I(%s)', f.proname, array_to_string(v_args, ', '));
      CONTINUE WHEN to_regprocedure(v_sig) IS NOT NULL;
      CONTINUE WHEN to_regprocedure(format('pg_catalog.%I(%s)', f.proname, array_to_string(v_args, ', '))) IS NOT NULL;
      IF f.prokind = 'f' THEN
        EXECUTE format('CREATE FUNCTION %s RETURNS text LANGUAGE sql AS %L', v_sig, format('SELECT public.decoy_hit(%L)', f.proname));
      ELSE
        IF to_regprocedure(format('public.decoy_state(text, %s)', v_args[1])) IS NULL THEN
          EXECUTE format('CREATE FUNCTION public.decoy_state(text, %s) RETURNS text LANGUAGE sql AS %L', v_args[1],
            'SELECT public.decoy_hit(''an aggregate'')');
        END IF;
        EXECUTE format('CREATE AGGREGATE %s (SFUNC = public.decoy_state, STYPE = text)', v_sig);
      END IF;
    END LOOP;
  END LOOP;
END
$plant$;`;

/** Operator decoys for the pairs of `types` with at least one member of `among`. */
function operators(types: string[], among: string[]): string {
  return `
DO $plant$
DECLARE
  l text;
  r text;
  v_op text;
  v_fn text;
BEGIN
  PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
  FOREACH l IN ARRAY ${sqlArray(types)} LOOP
    FOREACH r IN ARRAY ${sqlArray(types)} LOOP
      CONTINUE WHEN NOT (l = ANY (${sqlArray(among)}) OR r = ANY (${sqlArray(among)}));
      v_fn := format('public.decoy_op_%s', md5(l || ',' || r));
      EXECUTE format('CREATE FUNCTION %s(%s, %s) RETURNS boolean LANGUAGE sql AS %L', v_fn, l, r,
        format('SELECT public.decoy_hit(%L) IS NULL', format('an operator on (%s, %s)', l, r)));
      FOR v_op IN
        SELECT DISTINCT o.oprname FROM pg_operator o
         WHERE o.oprnamespace = 'pg_catalog'::regnamespace AND o.oprkind = 'b'
           AND NOT EXISTS (SELECT 1 FROM pg_operator x WHERE x.oprnamespace = 'pg_catalog'::regnamespace AND x.oprname = o.oprname
                            AND x.oprleft = l::regtype AND x.oprright = r::regtype)
      LOOP
        EXECUTE format('CREATE OPERATOR public.%s (LEFTARG = %s, RIGHTARG = %s, FUNCTION = %s)', v_op, l, r, v_fn);
      END LOOP;
    END LOOP;
  END LOOP;
END
$plant$;`;
}

/**
 * Plants the decoys in public as `role` (which must be allowed to create
 * there). `extraTypes` (tidemark's own, once migrated) get operator
 * decoys paired with themselves and the built-in types; without them,
 * everything else is planted.
 */
export async function plantDecoys(session: Session, role: string, extraTypes: string[] = []): Promise<void> {
  await session.query(`SET ROLE "${role}"`);
  try {
    await session.query('BEGIN');
    if (extraTypes.length === 0) {
      await session.query(SETUP);
      await session.query(FUNCTIONS);
      await session.query(operators(BUILTIN_TYPES, BUILTIN_TYPES));
    } else {
      await session.query(operators([...BUILTIN_TYPES, ...extraTypes], extraTypes));
    }
    await session.query('COMMIT');
  } catch (err) {
    await session.query('ROLLBACK');
    throw err;
  } finally {
    await session.query('RESET ROLE');
  }
}

/** How many decoy calls there were (0 while none ran). */
export async function decoyHits(session: Session): Promise<number> {
  const r = await session.query<{ n: string; called: boolean }>('SELECT last_value AS n, is_called AS called FROM public.decoy_hits');
  return r.rows[0]!.called ? Number(r.rows[0]!.n) : 0;
}

/** How many decoys there are, by kind. */
export async function decoyCount(session: Session): Promise<{ functions: number; aggregates: number; operators: number }> {
  const r = await session.query(
    `SELECT (SELECT count(*)::int FROM pg_catalog.pg_proc p WHERE p.pronamespace = 'public'::regnamespace AND p.prokind = 'f') AS functions,
            (SELECT count(*)::int FROM pg_catalog.pg_proc p WHERE p.pronamespace = 'public'::regnamespace AND p.prokind = 'a') AS aggregates,
            (SELECT count(*)::int FROM pg_catalog.pg_operator o WHERE o.oprnamespace = 'public'::regnamespace) AS operators`,
  );
  return r.rows[0];
}
