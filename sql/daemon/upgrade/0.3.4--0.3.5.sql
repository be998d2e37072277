/*
 * sql/daemon/upgrade/0.3.4--0.3.5.sql
 *	  What the daemon alone changes from 0.3.4 to 0.3.5, after the shared
 *	  step (sql/schema/upgrade/0.3.4--0.3.5.sql): scripts/embed-schema.sh
 *	  appends it to the daemon's step.
 *
 *	- Trace context at insert (the extension's C trigger does it there).
 */
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
