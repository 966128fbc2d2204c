-- tidemark schema, version 9: one live process per watermarker owner.
-- Placeholders: {{schema}} (quoted identifier).
--
-- The lease is an owner's (acquire_lease renews a lease its owner already
-- holds: a restarted loop resumes it), so two processes given the same
-- owner both acted as its holder, and stopping either released the
-- other's lease. Safety never depended on it (docs/PROTOCOL.md section 4:
-- every publication is correct whoever makes it), but both reported
-- leading and both stepped. Now each Watermarker instance claims its owner
-- under an instance id of its own before it runs the loop or takes the
-- lease, and renews the claim with every run. A claim lives by a TTL, like
-- the lease: a process that died (or was cut off) loses it within the TTL
-- and its replacement takes it then. The claim is also a fence: a session
-- that names its instance (the setting tidemark.instance, which the
-- client sets on the loop's connection and in each step's transaction)
-- cannot write the watermark row while another instance holds a live
-- claim of the owner (object_in_use), and its lease renewals extend its
-- own claim. The step and the loop never read the claims: they decide only
-- who may write, never what a step publishes (docs/PROTOCOL.md section 4).

CREATE TABLE {{schema}}.owner_claims (
  owner      text PRIMARY KEY CHECK (owner <> ''),
  -- The claiming instance: host:pid:random of the client.
  instance   text NOT NULL CHECK (instance <> ''),
  -- When this instance first claimed the owner, and until when its claim lives.
  claimed_at timestamptz NOT NULL,
  expires_at timestamptz NOT NULL
);
REVOKE ALL ON {{schema}}.owner_claims FROM PUBLIC;

-- Claims p_owner for p_instance, or renews the claim p_instance holds
-- (once a quarter of its TTL has passed), until p_ttl_ms from now.
-- Refused (claimed false) while another instance
-- holds a claim that has not expired; the row returned is then that
-- claim. Two claims at once of a free owner: the INSERT of one waits for
-- the other's, and is refused once it commits.
CREATE FUNCTION {{schema}}.claim_owner(p_owner text, p_instance text, p_ttl_ms integer)
RETURNS TABLE (claimed boolean, instance text, claimed_at timestamptz, expires_at timestamptz)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
  IF p_owner IS NULL OR p_owner = '' OR p_instance IS NULL OR p_instance = '' OR p_ttl_ms IS NULL OR p_ttl_ms < 1 THEN
    RAISE EXCEPTION 'claim_owner: need an owner name, an instance id and a positive TTL in milliseconds (got %, %, %)', p_owner, p_instance, p_ttl_ms
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  -- Read first: its own claim not yet due, or another's live one, is
  -- answered without a write (an idle loop claims before every run, and
  -- a refused process keeps looking).
  RETURN QUERY
  SELECT c.instance = p_instance, c.instance, c.claimed_at, c.expires_at
    FROM {{schema}}.owner_claims c
   WHERE c.owner = p_owner
     AND CASE WHEN c.instance = p_instance
              THEN c.expires_at >= pg_catalog.clock_timestamp() + pg_catalog.make_interval(secs => p_ttl_ms * 0.75 / 1000.0)
              ELSE c.expires_at > pg_catalog.clock_timestamp() END;
  IF FOUND THEN
    RETURN;
  END IF;
  -- Claims left by processes that died, a day after they expired.
  DELETE FROM {{schema}}.owner_claims c
   WHERE c.expires_at < pg_catalog.clock_timestamp() - interval '1 day' AND c.owner <> p_owner;
  -- A row deleted between the two statements (its holder released it):
  -- claim again.
  FOR i IN 1 .. 3 LOOP
    RETURN QUERY
    INSERT INTO {{schema}}.owner_claims AS c (owner, instance, claimed_at, expires_at)
    VALUES (p_owner, p_instance, pg_catalog.clock_timestamp(),
            pg_catalog.clock_timestamp() + pg_catalog.make_interval(secs => p_ttl_ms / 1000.0))
    ON CONFLICT (owner) DO UPDATE
       SET instance = excluded.instance,
           claimed_at = CASE WHEN c.instance = excluded.instance THEN c.claimed_at ELSE excluded.claimed_at END,
           expires_at = excluded.expires_at
     WHERE c.instance = excluded.instance
        OR c.expires_at <= pg_catalog.clock_timestamp()
    RETURNING true, c.instance, c.claimed_at, c.expires_at;
    IF FOUND THEN
      RETURN;
    END IF;
    -- A statement of its own: its snapshot sees the claim that refused
    -- this one, even one committed while the INSERT waited for it.
    RETURN QUERY
    SELECT c.instance = p_instance, c.instance, c.claimed_at, c.expires_at
      FROM {{schema}}.owner_claims c
     WHERE c.owner = p_owner;
    IF FOUND THEN
      RETURN;
    END IF;
  END LOOP;
  RAISE EXCEPTION 'claim_owner: the claim of owner % kept changing under this one', p_owner
    USING ERRCODE = 'serialization_failure';
END
$$;

-- Gives up p_instance's claim of p_owner and releases the owner's lease,
-- in one transaction (the watermark row locked first, as every write of
-- it does before the fence below touches a claim; then the claim row, so
-- no instance claims the owner and takes the lease in between). The lease
-- is left alone while another instance's claim of the owner stands, live
-- or expired: it is that instance's, or the next claimant's. Without any
-- claim (a client of version 8, or a loop called from psql) the lease is
-- released as before. True when a lease was released.
CREATE FUNCTION {{schema}}.release_owner(p_owner text, p_instance text) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  c record;
BEGIN
  PERFORM 1 FROM {{schema}}.watermark w FOR NO KEY UPDATE;
  SELECT x.instance INTO c
    FROM {{schema}}.owner_claims x
   WHERE x.owner = p_owner
     FOR UPDATE;
  IF FOUND AND c.instance IS DISTINCT FROM p_instance THEN
    RETURN false;
  END IF;
  DELETE FROM {{schema}}.owner_claims x WHERE x.owner = p_owner;
  RETURN {{schema}}.release_lease(p_owner);
END
$$;

-- The fence. Only sessions that name their instance are checked: older
-- clients, psql and the pruner write as before.
CREATE FUNCTION {{schema}}.fence_owner_claim() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_instance text := pg_catalog.current_setting('tidemark.instance', true);
  v_owner    text := coalesce(NEW.lease_owner, OLD.lease_owner);
  c          record;
BEGIN
  IF v_instance IS NULL OR v_instance = '' OR v_owner IS NULL THEN
    RETURN NEW;
  END IF;
  -- Locked (FOR SHARE conflicts with claim_owner's update of the row), so
  -- a claim another process is taking (uncommitted) is waited for and
  -- then seen: decided on its latest version, not on a snapshot.
  SELECT x.instance, x.expires_at INTO c
    FROM {{schema}}.owner_claims x
   WHERE x.owner = v_owner
     FOR SHARE;
  IF FOUND AND c.instance <> v_instance AND c.expires_at > pg_catalog.clock_timestamp() THEN
    RAISE EXCEPTION 'tidemark: owner % is claimed by another live watermarker instance; instance % wrote nothing', v_owner, v_instance
      USING ERRCODE = 'object_in_use';
  END IF;
  -- A lease renewed (or taken) extends the renewing instance's claim to
  -- it: a run that outlasts the claim's TTL keeps its claim as long as it
  -- keeps the lease.
  IF FOUND AND c.instance = v_instance AND NEW.lease_owner IS NOT NULL
     AND NEW.lease_expires_at IS DISTINCT FROM OLD.lease_expires_at AND c.expires_at < NEW.lease_expires_at THEN
    UPDATE {{schema}}.owner_claims x SET expires_at = NEW.lease_expires_at WHERE x.owner = v_owner;
  END IF;
  RETURN NEW;
END
$$;
CREATE TRIGGER fence_owner_claim BEFORE UPDATE ON {{schema}}.watermark
  FOR EACH ROW EXECUTE FUNCTION {{schema}}.fence_owner_claim();

REVOKE EXECUTE ON FUNCTION {{schema}}.fence_owner_claim() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION {{schema}}.claim_owner(text, text, integer) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION {{schema}}.release_owner(text, text) FROM PUBLIC;
