/*
 * sql/daemon/host.sql
 *	  What the daemon's PostgreSQL schema does in SQL where the extension
 *	  does it in C: the functions sql/schema/functions.sql calls, and the
 *	  wake at commit (a NOTIFY, opt-in).
 *
 * Between sql/schema/tables.sql and sql/schema/functions.sql.  No C, no
 * superuser: a managed PostgreSQL runs it as the daemon's own role.
 */

-- ---------------------------------------------------------------------------
-- Topic patterns, as the daemon's routes match them (src/common/lib/qb_route.c)
-- ---------------------------------------------------------------------------
/*
 * topic_matches: "*" is one segment (any text between dots, empty
 * included), "**" any number of segments, zero included; any other
 * segment matches itself, case included.  A pattern the routes would
 * refuse raises the extension's ERROR (22023), segment by segment as
 * qb_pattern_check says it.  The match is a regular expression over
 * "." || topic, each segment with the dot before it, and every character of
 * a literal segment that is not a letter, digit or '_' escaped (a backslash
 * before such a character stands for itself).  An empty topic has no
 * segment, so only a pattern made of "**" matches it.
 */
CREATE FUNCTION queuebox.topic_matches(pattern text, topic text) RETURNS boolean
	LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
	AS $$
DECLARE
	segs text[] := string_to_array(pattern, '.');
	re text := '';
	s text;
	why text;
BEGIN
	IF pattern = '' THEN
		why := 'the pattern is empty; use "**" to match every topic';
	ELSE
		FOR n IN 1 .. cardinality(segs) LOOP
			s := segs[n];
			IF s = '' THEN
				why := format('segment %s is empty (a leading, trailing or doubled dot); segments are separated by single dots, e.g. "orders.*.created"', n);
			ELSIF s ~ '[\x01-\x20\x7f]' THEN
				why := format('segment %s contains a space or a control character', n);
			ELSIF s NOT IN ('*', '**') AND strpos(s, '*') > 0 THEN
				why := format('segment %s "%s" mixes ''*'' with other text: a wildcard is a whole segment, "*" for one segment or "**" for any number', n, left(s, 40));
			END IF;
			EXIT WHEN why IS NOT NULL;
			re := re || CASE s WHEN '**' THEN '(\.[^.]*)*' WHEN '*' THEN '\.[^.]*'
							   ELSE '\.' || regexp_replace(s, '([^[:alnum:]_])', '\\\1', 'g') END;
		END LOOP;
	END IF;
	IF why IS NOT NULL THEN
		RAISE EXCEPTION 'invalid topic pattern "%": %', pattern, why
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = 'Segments are separated by single dots; "*" matches one segment, "**" any number.';
	END IF;
	IF topic = '' THEN
		RETURN pattern ~ '^\*\*(\.\*\*)*$';
	END IF;
	RETURN ('.' || topic) ~ ('^' || re || '$');
END
$$;
COMMENT ON FUNCTION queuebox.topic_matches(text, text) IS
	'True when the topic matches the pattern, as routes match: "*" one segment, "**" any number.';

/* route_of: the first route of the daemon's configuration that matches. */
CREATE FUNCTION queuebox.route_of(topic text) RETURNS text
	LANGUAGE sql STABLE STRICT
	AS $$
	SELECT r.destination FROM queuebox.config_route r
	WHERE queuebox.topic_matches(r.pattern, route_of.topic)
	ORDER BY r.position LIMIT 1
$$;
COMMENT ON FUNCTION queuebox.route_of(text) IS
	'The destination the active configuration routes a topic to, or NULL when no route matches.';

CREATE FUNCTION queuebox._destination_names() RETURNS text[]
	LANGUAGE sql STABLE
	AS $$
	SELECT coalesce(array_agg(d.name ORDER BY d.name), '{}') FROM queuebox.config_destination d
$$;

-- ---------------------------------------------------------------------------
-- The wake at commit: a NOTIFY once per inserting transaction
-- ---------------------------------------------------------------------------
-- PostgreSQL sends a notification once per transaction and payload, so one
-- statement trigger per table is enough.  The triggers are made disabled:
-- a NOTIFY takes a lock at commit that every notifying transaction of the
-- cluster queues on (docs/daemon.md), so the daemon enables them only with
-- database.listen: true.  The operations below notify either way: they are
-- rare, and a NOTIFY nobody listens to costs next to nothing.
CREATE FUNCTION queuebox._arm_outbox_wake() RETURNS void
	LANGUAGE sql VOLATILE
	AS $$ SELECT pg_notify('queuebox_outbox', '') $$;

CREATE FUNCTION queuebox._arm_relay_wake() RETURNS void
	LANGUAGE sql VOLATILE
	AS $$ SELECT pg_notify('queuebox_inbox', '') $$;

CREATE FUNCTION queuebox._notify_outbox() RETURNS trigger
	LANGUAGE plpgsql
	AS $$ BEGIN PERFORM pg_notify('queuebox_outbox', ''); RETURN NULL; END $$;
CREATE TRIGGER outbox_notify AFTER INSERT ON queuebox.outbox
	FOR EACH STATEMENT EXECUTE FUNCTION queuebox._notify_outbox();
ALTER TABLE queuebox.outbox DISABLE TRIGGER outbox_notify;

CREATE FUNCTION queuebox._notify_inbox() RETURNS trigger
	LANGUAGE plpgsql
	AS $$ BEGIN PERFORM pg_notify('queuebox_inbox', ''); RETURN NULL; END $$;
CREATE TRIGGER inbox_notify AFTER INSERT ON queuebox.inbox
	FOR EACH STATEMENT EXECUTE FUNCTION queuebox._notify_inbox();
ALTER TABLE queuebox.inbox DISABLE TRIGGER inbox_notify;
