/*
 * sql/daemon/upgrade/0.3.7--0.3.8.sql
 *	  What the daemon alone changes from 0.3.7 to 0.3.8, after the shared
 *	  step (sql/schema/upgrade/0.3.7--0.3.8.sql): scripts/embed-schema.sh
 *	  appends it to the daemon's step.
 *
 *	- Fan-out: config_route.fanout (the route has several destinations;
 *	  its destination column lists them), and the outbox_fanout trigger
 *	  that marks such a row at insert (the extension's C trigger does it
 *	  there).
 */
ALTER TABLE queuebox.config_route ADD COLUMN IF NOT EXISTS fanout boolean NOT NULL DEFAULT false;

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
