/*
 * sql/schema/upgrade/0.3.3--0.3.4.sql
 *	  What changes from schema 0.3.3 to 0.3.4 in both PostgreSQL installs:
 *	  the extension's build/sql/queuebox--0.3.3--0.3.4.sql and the daemon's
 *	  upgrade step are made of this file (docs/design/schema.md).
 *
 * What changes (onDead: holdKey, docs/delivery.md "Dead letters";
 * docs/design/claim.md "A dead head that holds its key"):
 *	- outbox.hold may be 'dead' on a dead row: it holds its key's later
 *	  rows until an operator requeues or skips it.
 *	- outbox_key_open_idx covers those rows too: the claim, the promotion
 *	  and the sweep count them as open for their key, one index probe each.
 *	  The index is made again under a new name, then renamed: the old one
 *	  serves the claims until the new one is there.
 *	- outbox_audit: what operators did to dead rows (an edited requeue, a
 *	  skip), who and when.
 *	- requeue_outbox(id, payload), skip_outbox(id), held_keys().
 *
 * No row changes: no dead row holds its key before this version.  CREATE
 * INDEX reads the outbox once and blocks writes to it while it runs:
 * upgrade when the outbox is quiet, or create outbox_key_open_0_3_4_idx
 * CONCURRENTLY by hand first (the script then finds it and skips it).
 */
ALTER TABLE queuebox.outbox DROP CONSTRAINT outbox_hold_check;
ALTER TABLE queuebox.outbox ADD CONSTRAINT outbox_hold_check
	CHECK (hold IN ('key', 'destination', 'ready', 'intake', 'dead'));
COMMENT ON COLUMN queuebox.outbox.hold IS
	'Where a pending row waits: intake (new, routed at insert), key (an earlier row of its key is open), destination (its destination is not taking rows), ready (claimable, not yet routed); NULL: new and not routed, or routed and due at scheduled_at. On a dead row, dead: it holds its key''s later rows until queuebox.requeue_outbox() or queuebox.skip_outbox() (onDead: holdKey).';

CREATE INDEX IF NOT EXISTS outbox_key_open_0_3_4_idx ON queuebox.outbox (key, id)
	WHERE (state IN ('pending', 'processing') OR hold = 'dead') AND key IS NOT NULL;
DROP INDEX queuebox.outbox_key_open_idx;
ALTER INDEX queuebox.outbox_key_open_0_3_4_idx RENAME TO outbox_key_open_idx;

CREATE TABLE queuebox.outbox_audit (
	id				bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	outbox_id		bigint NOT NULL,
	action			varchar(20) NOT NULL
		CONSTRAINT outbox_audit_action_check CHECK (action IN ('requeue', 'skip')),
	done_by			text NOT NULL DEFAULT current_user,
	done_at			timestamptz NOT NULL DEFAULT now(),
	payload_before	jsonb,
	payload_after	jsonb
);
CREATE INDEX outbox_audit_outbox_idx ON queuebox.outbox_audit (outbox_id);
COMMENT ON TABLE queuebox.outbox_audit IS
	'What operators did to dead outbox rows, by queuebox.requeue_outbox(id, payload) and queuebox.skip_outbox(id): who, when, and for an edited requeue the payload before and after. Retention does not delete it.';

/*
 * requeue_outbox(id, payload): a dead row back to pending as
 * requeue_outbox(id) does, with its payload replaced by payload.  The
 * edit is recorded in outbox_audit: who (current_user), when, the payload
 * before and after.  Its key's rows held behind it (onDead: holdKey) go
 * out after it, in order.  False, and nothing changed, when the row is not
 * dead.
 */
CREATE FUNCTION queuebox.requeue_outbox(id bigint, payload jsonb) RETURNS boolean
	LANGUAGE sql VOLATILE
	AS $$
	WITH o AS (
		SELECT o.id, o.payload FROM queuebox.outbox o
		WHERE o.id = requeue_outbox.id AND o.state = 'dead'
		FOR UPDATE),
	u AS (
		UPDATE queuebox.outbox x
		SET state = 'pending', attempt = 0, scheduled_at = now(), payload = requeue_outbox.payload,
			claim_token = NULL, lease_until = NULL, destination = NULL, hold = 'ready'
		FROM o WHERE x.id = o.id
		RETURNING x.id),
	a AS (
		INSERT INTO queuebox.outbox_audit (outbox_id, action, payload_before, payload_after)
		SELECT o.id, 'requeue', o.payload, requeue_outbox.payload FROM o JOIN u ON u.id = o.id
		RETURNING 1)
	SELECT count(*) = 1 FROM a, LATERAL (SELECT queuebox._arm_outbox_wake()) w
$$;

/*
 * skip_outbox(id): a dead row that holds its key (onDead: holdKey) lets
 * it go: the row stays dead, its hold is cleared (recorded in
 * outbox_audit), and its key's first open row, when parked, is released
 * as a settle's promotion releases it.  The promotion is a later
 * statement: the update waited for every claim parking a row behind this
 * one (they hold FOR SHARE on it), and the new snapshot sees those parks
 * (docs/design/claim.md).  False, and nothing changed, when the row is not
 * dead and holding its key.
 */
CREATE FUNCTION queuebox.skip_outbox(id bigint) RETURNS boolean
	LANGUAGE plpgsql VOLATILE
	AS $$
DECLARE
	k text;
BEGIN
	UPDATE queuebox.outbox o SET hold = NULL
	WHERE o.id = skip_outbox.id AND o.state = 'dead' AND o.hold = 'dead'
	RETURNING o.key INTO k;
	IF NOT FOUND THEN
		RETURN false;
	END IF;
	INSERT INTO queuebox.outbox_audit (outbox_id, action) VALUES (skip_outbox.id, 'skip');
	UPDATE queuebox.outbox o SET hold = CASE WHEN o.destination IS NULL THEN 'ready' END
	WHERE o.id = (SELECT e.id FROM queuebox.outbox e
				  WHERE e.key = k AND (e.state IN ('pending', 'processing') OR e.hold = 'dead')
				  ORDER BY e.id LIMIT 1)
	  AND o.state = 'pending' AND o.hold = 'key';
	PERFORM queuebox._arm_outbox_wake();
	RETURN true;
END
$$;

/*
 * held_keys(): the keys whose first open row is dead and holding them
 * (onDead: holdKey) or retrying (pending after a failed attempt), with
 * rows parked behind it: the key, the head's destination, id and state
 * ('dead' or 'retrying'), how many open rows wait behind it, and since
 * when (the oldest of them was created).  It walks outbox_parked_idx one
 * step per key, as the sweep does, so it costs the keys with parked rows,
 * not the table.
 */
CREATE FUNCTION queuebox.held_keys()
	RETURNS TABLE (key text, destination text, head_id bigint, head_state text,
				   behind bigint, since timestamptz)
	LANGUAGE sql STABLE
	AS $$
	WITH RECURSIVE k AS (
		(SELECT o.key FROM queuebox.outbox o
		 WHERE o.state = 'pending' AND o.hold = 'key' ORDER BY o.key LIMIT 1)
		UNION ALL
		SELECT x.key FROM k CROSS JOIN LATERAL (
			SELECT o.key FROM queuebox.outbox o
			WHERE o.state = 'pending' AND o.hold = 'key' AND o.key > k.key
			ORDER BY o.key LIMIT 1) x)
	SELECT k.key, h.destination, h.id,
		   CASE WHEN h.state = 'dead' THEN 'dead' ELSE 'retrying' END,
		   b.n, b.since
	FROM k
	CROSS JOIN LATERAL (
		SELECT e.id, e.state, e.attempt, e.destination FROM queuebox.outbox e
		WHERE e.key = k.key AND (e.state IN ('pending', 'processing') OR e.hold = 'dead')
		ORDER BY e.id LIMIT 1) h
	CROSS JOIN LATERAL (
		SELECT count(*) AS n, min(e.created_at) AS since FROM queuebox.outbox e
		WHERE e.key = k.key AND e.id > h.id AND e.state IN ('pending', 'processing')) b
	WHERE h.state = 'dead' OR (h.state = 'pending' AND h.attempt > 0)
	ORDER BY k.key
$$;

CREATE OR REPLACE FUNCTION queuebox._schema_version() RETURNS text
	LANGUAGE sql IMMUTABLE AS $$ SELECT '0.3.4'::text $$;
