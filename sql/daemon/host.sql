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

/*
 * outbox_trace: a row takes the trace context of its transaction or
 * statement (docs/observability.md, "Trace context"), as the extension's
 * C trigger does: the row's own traceparent header wins; then SET LOCAL
 * queuebox.traceparent (and queuebox.tracestate); then a sqlcommenter
 * comment in the inserting statement (traceparent='00-...'). A value that
 * is not a valid traceparent is passed over.  It costs a setting read and,
 * only when the statement's text holds "traceparent=", a regexp per row.
 */
CREATE FUNCTION queuebox._trace_outbox() RETURNS trigger
	LANGUAGE plpgsql
	AS $$
DECLARE
	tp	text := nullif(current_setting('queuebox.traceparent', true), '');
	ts	text := nullif(current_setting('queuebox.tracestate', true), '');
	q	text;
BEGIN
	IF NEW.headers ? 'traceparent' THEN
		RETURN NEW;
	END IF;
	IF tp IS NULL THEN
		q := current_query();
		IF q IS NULL OR strpos(q, 'traceparent=''') = 0 THEN
			RETURN NEW;
		END IF;
		tp := (regexp_match(q, '/\*[^*]*?traceparent=''([^'']*)'''))[1];
		-- sqlcommenter URL-encodes the values; a tracestate with another escape is dropped
		ts := replace(replace(replace((regexp_match(q, '/\*[^*]*?tracestate=''([^'']*)'''))[1],
									  '%2C', ','), '%3D', '='), '%20', ' ');
		IF strpos(ts, '%') > 0 THEN
			ts := NULL;
		END IF;
	END IF;
	IF tp IS NULL OR tp !~ '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}(-.*)?$'
	   OR left(tp, 2) = 'ff' OR (left(tp, 2) = '00' AND length(tp) <> 55)
	   OR substr(tp, 4, 32) = repeat('0', 32) OR substr(tp, 37, 16) = repeat('0', 16) THEN
		RETURN NEW;
	END IF;
	NEW.headers := NEW.headers || jsonb_build_object('traceparent', '00' || substr(tp, 3, 53))
		|| CASE WHEN ts IS NOT NULL AND length(ts) <= 512 AND ts ~ '^[\x20-\x7e]*$' AND ts !~ '["\\]'
				THEN jsonb_build_object('tracestate', ts) ELSE '{}' END;
	RETURN NEW;
END $$;
CREATE TRIGGER outbox_trace BEFORE INSERT ON queuebox.outbox
	FOR EACH ROW EXECUTE FUNCTION queuebox._trace_outbox();

/*
 * outbox_fanout: a row whose topic's first route has several destinations
 * (fan-out) is marked (origin = its id), so the first claim copies it
 * whatever its key's order, and each copy waits at its own destination
 * (docs/design/claim.md, "One key, several destinations"), as the
 * extension's C trigger does.  Made disabled: the daemon enables it only
 * while its configuration has a fan-out route, so other installs pay
 * nothing; a row inserted before it was enabled is copied all the same,
 * only after its key's earlier rows everywhere.
 */
CREATE FUNCTION queuebox._fanout_outbox() RETURNS trigger
	LANGUAGE plpgsql
	AS $$
BEGIN
	IF NEW.destination IS NULL AND NEW.origin IS NULL
	   AND coalesce((SELECT r.fanout FROM queuebox.config_route r
					 WHERE queuebox.topic_matches(r.pattern, NEW.topic)
					 ORDER BY r.position LIMIT 1), false) THEN
		NEW.origin := NEW.id;
	END IF;
	RETURN NEW;
END
$$;
CREATE TRIGGER outbox_fanout BEFORE INSERT ON queuebox.outbox
	FOR EACH ROW EXECUTE FUNCTION queuebox._fanout_outbox();
ALTER TABLE queuebox.outbox DISABLE TRIGGER outbox_fanout;
