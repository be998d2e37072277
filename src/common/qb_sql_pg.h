/*-------------------------------------------------------------------------
 * qb_sql_pg.h
 *	  The PostgreSQL statements of the outbox, one copy for every host.
 *
 * The background workers run them through SPI with saved plans; the
 * SQL-callable wrappers queuebox._outbox_claim() and friends run the same
 * text (so pg_regress and the isolation specs test exactly what the workers
 * run); the daemon's libpq store will send the same text.  Parameters are
 * typed by the caller ($n with the OIDs noted below).
 *
 * Why these shapes:
 *	- Ids go through ARRAY(...): the UPDATE is then a primary-key lookup per
 *	  id, whatever the planner guesses for a LIMIT it cannot see (a hash
 *	  join plan here scanned the whole table).
 *	- A keyed row is claimable only when no earlier row of its key is
 *	  pending or processing: one row per key in flight, in id order, across
 *	  every worker and replica.  SKIP LOCKED keeps claimers apart.
 *	- The settle is fenced by the claim token alone: only processing rows
 *	  carry one, and naming the state too lets the planner AND in the lease
 *	  index, a scan of every processing row per settled row.
 *-------------------------------------------------------------------------
 */
#ifndef QB_SQL_PG_H
#define QB_SQL_PG_H

/*
 * Claim: $1 int4 batch size, $2 int8 lease in ms, $3 int4 default
 * max_attempts, $4 uuid claim token.  Returns the claimed rows.
 */
#define QB_PG_OUTBOX_CLAIM \
	"UPDATE queuebox.outbox o" \
	" SET state = 'processing', claim_token = $4," \
	"     lease_until = now() + $2 * interval '1 millisecond'" \
	" WHERE o.id = ANY (ARRAY(" \
	"   SELECT c.id FROM queuebox.outbox c" \
	"   WHERE c.state = 'pending' AND c.scheduled_at <= now()" \
	"     AND (c.key IS NULL OR NOT EXISTS (" \
	"       SELECT 1 FROM queuebox.outbox e" \
	"       WHERE e.key = c.key AND e.id < c.id" \
	"         AND e.state IN ('pending', 'processing')))" \
	"   ORDER BY c.scheduled_at, c.id" \
	"   LIMIT $1" \
	"   FOR UPDATE SKIP LOCKED))" \
	" RETURNING o.id, o.message_id, o.topic, o.key, o.payload::text, o.headers::text," \
	"           o.attempt, coalesce(o.max_attempts, $3)," \
	"           extract(epoch FROM o.created_at)::float8"

/*
 * Settle: $1 uuid claim token, $2 int8[] ids, $3 text[] outcomes ('sent',
 * 'retry', 'dead', 'release'), $4 int4[] attempts, $5 int8[] retry delays in
 * ms, $6 text[] errors.  A retry is due after its delay; a release keeps the
 * row's attempt and due time.  The row count is the rows changed.
 */
#define QB_PG_OUTBOX_SETTLE \
	"UPDATE queuebox.outbox o" \
	" SET state = CASE s.outcome WHEN 'sent' THEN 'sent' WHEN 'dead' THEN 'dead'" \
	"                            ELSE 'pending' END," \
	"     attempt = s.attempt," \
	"     scheduled_at = CASE s.outcome" \
	"                      WHEN 'retry' THEN now() + s.delay_ms * interval '1 millisecond'" \
	"                      ELSE o.scheduled_at END," \
	"     last_error = CASE s.outcome WHEN 'sent' THEN o.last_error ELSE s.error END," \
	"     claim_token = NULL, lease_until = NULL" \
	" FROM unnest($2::bigint[], $3::text[], $4::int[], $5::bigint[], $6::text[])" \
	"      AS s(id, outcome, attempt, delay_ms, error)" \
	" WHERE o.id = s.id AND o.claim_token = $1"

/*
 * Reclaim: $1 int4 most rows.  Expired leases go back to pending; the
 * attempt is not counted (nobody knows whether it was made).
 */
#define QB_PG_OUTBOX_RECLAIM \
	"UPDATE queuebox.outbox o" \
	" SET state = 'pending', claim_token = NULL, lease_until = NULL," \
	"     last_error = 'lease expired: the claim was not settled within outbox.claimTimeoutMs; returned to pending'" \
	" WHERE o.id = ANY (ARRAY(" \
	"   SELECT x.id FROM queuebox.outbox x" \
	"   WHERE x.state = 'processing' AND x.lease_until < now()" \
	"   ORDER BY x.lease_until LIMIT $1" \
	"   FOR UPDATE SKIP LOCKED))"

/* Retention: $1 int8 seconds to keep, $2 int4 most rows. */
#define QB_PG_OUTBOX_RETENTION \
	"DELETE FROM queuebox.outbox o" \
	" WHERE o.id = ANY (ARRAY(" \
	"   SELECT x.id FROM queuebox.outbox x" \
	"   WHERE x.state = 'sent'" \
	"     AND x.created_at < now() - $1 * interval '1 second'" \
	"   LIMIT $2" \
	"   FOR UPDATE SKIP LOCKED))"

/*
 * Relay claim: $1 int4 batch size, $2 int8 lease in ms, $3 uuid claim token.
 * Push rows, pending and due or processing with an expired lease.  One
 * message of an aggregate is in flight across all push sources together, in
 * created_at order; rows without an aggregate take part in no ordering.
 */
#define QB_PG_RELAY_CLAIM \
	"UPDATE queuebox.inbox i" \
	" SET state = 'processing', claim_token = $3," \
	"     lease_until = now() + $2 * interval '1 millisecond'" \
	" WHERE i.id = ANY (ARRAY(" \
	"   SELECT c.id FROM queuebox.inbox c" \
	"   WHERE c.consumption = 'push' AND c.state IN ('pending', 'processing')" \
	"     AND ((c.state = 'pending' AND c.scheduled_at <= now())" \
	"          OR (c.state = 'processing' AND c.lease_until < now()))" \
	"     AND (c.aggregate_id IS NULL OR NOT EXISTS (" \
	"       SELECT 1 FROM queuebox.inbox e" \
	"       WHERE e.consumption = 'push' AND e.aggregate_id = c.aggregate_id" \
	"         AND e.state IN ('pending', 'processing')" \
	"         AND (e.created_at, e.id) < (c.created_at, c.id)))" \
	"   ORDER BY c.created_at, c.id" \
	"   LIMIT $1" \
	"   FOR UPDATE SKIP LOCKED))" \
	" RETURNING i.id, i.source, i.event_type, i.created_at"

/*
 * The inbox-to-outbox mapping, shared by the relay's forward and
 * queuebox.replay_inbox(): an INSERT from a relation c holding inbox rows
 * plus their rendered topic out_topic, in created_at order, skipping rows
 * whose topic rendered empty.  key = aggregate_id, the stored payload, the
 * received headers with x-inbox-id, x-source, x-idempotency-key and
 * X-Correlation-Id replacing any of those names in any letter case (the
 * received correlation id, whatever its case, is kept under the canonical
 * name).  max_attempts is the parameter named by the caller.
 */
#define QB_PG_INBOX_TO_OUTBOX(max_attempts_param) \
	"INSERT INTO queuebox.outbox (topic, key, payload, headers, max_attempts)" \
	" SELECT c.out_topic, c.aggregate_id, c.payload," \
	"   coalesce((SELECT jsonb_object_agg(h.k, h.v) FROM jsonb_each(c.headers) h(k, v)" \
	"             WHERE lower(h.k) NOT IN ('x-inbox-id', 'x-source', 'x-idempotency-key'," \
	"                                      'x-correlation-id')), '{}'::jsonb)" \
	"   || jsonb_build_object('x-inbox-id', c.id::text, 'x-source', c.source," \
	"                         'x-idempotency-key', c.idempotency_key)" \
	"   || coalesce((SELECT jsonb_build_object('X-Correlation-Id', h.v)" \
	"                FROM jsonb_each(c.headers) h(k, v)" \
	"                WHERE lower(h.k) = 'x-correlation-id' LIMIT 1), '{}'::jsonb)," \
	"   " max_attempts_param \
	" FROM c WHERE c.out_topic <> ''" \
	" ORDER BY c.created_at, c.id"

/*
 * Relay forward: $1 uuid claim token, $2 int8[] inbox ids, $3 text[] their
 * rendered topics, $4 int4 max_attempts for the outbox rows (NULL: the
 * outbox default).  In one statement, so in one transaction: each claimed
 * row with a non-empty topic becomes an outbox row (QB_PG_INBOX_TO_OUTBOX)
 * and is marked processed; a row whose topic rendered empty is marked dead.
 * Fenced by the token.  Returns one row: the inbox rows settled, the outbox
 * rows inserted.
 */
#define QB_PG_RELAY_FORWARD \
	"WITH s AS (" \
	"   SELECT * FROM unnest($2::bigint[], $3::text[]) AS s(id, topic))," \
	" c AS (" \
	"   SELECT i.*, s.topic AS out_topic FROM queuebox.inbox i JOIN s ON s.id = i.id" \
	"   WHERE i.claim_token = $1 AND i.state = 'processing')," \
	" ins AS (" \
	"   " QB_PG_INBOX_TO_OUTBOX("$4") \
	"   RETURNING 1)," \
	" u AS (" \
	"   UPDATE queuebox.inbox i" \
	"   SET state = CASE WHEN c.out_topic <> '' THEN 'processed' ELSE 'dead' END," \
	"       last_error = CASE WHEN c.out_topic <> '' THEN i.last_error" \
	"         ELSE 'the topic template rendered empty, so the message can reach no destination;" \
	" set eventTypePath or use {{ source }} in the topic, then requeue the row' END," \
	"       claim_token = NULL, lease_until = NULL" \
	"   FROM c WHERE i.id = c.id" \
	"   RETURNING 1)" \
	" SELECT (SELECT count(*) FROM u), (SELECT count(*) FROM ins)"

/*
 * Inbox insert (the ingress, the consumers): $1..$8 text[] of source,
 * idempotency key, event type, aggregate id, payload (JSON text), headers
 * (JSON text), consumption, and last_error (NULL: pending; else the row is
 * stored dead, spec: a broker message that is not JSON or that the
 * transform rejected).  Rows go in array order, so of two rows of one key in a call
 * the first is stored; a key that exists is skipped.  Returns the stored
 * rows' id, source and idempotency key.
 */
#define QB_PG_INBOX_INSERT \
	"INSERT INTO queuebox.inbox (source, idempotency_key, event_type, aggregate_id," \
	"                            payload, headers, consumption, state, last_error)" \
	" SELECT r.source, r.key, r.event_type, r.aggregate_id, r.payload::jsonb," \
	"        r.headers::jsonb, r.consumption," \
	"        CASE WHEN r.last_error IS NULL THEN 'pending' ELSE 'dead' END, r.last_error" \
	" FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[]," \
	"             $6::text[], $7::text[], $8::text[]) WITH ORDINALITY" \
	"      AS r(source, key, event_type, aggregate_id, payload, headers, consumption," \
	"           last_error, n)" \
	" ORDER BY r.n" \
	" ON CONFLICT (source, idempotency_key) DO NOTHING" \
	" RETURNING id, source, idempotency_key"

/*
 * The named queries of QbStore.query_text, indexed by QbQuery; parameters
 * are text and cast here.  Each returns one text value.
 */
#define QB_PG_DEAD_ROWS(table, cols) \
	"SELECT coalesce(json_agg(d ORDER BY d.id), '[]')::text FROM (" \
	"  SELECT " cols " FROM queuebox." table \
	"  WHERE state = 'dead' ORDER BY id LIMIT coalesce($1::int, 100)) d"

static const char *const qb_pg_queries[] = {
	/* QB_Q_READY: the queue tables are there and readable */
	"SELECT count(*)::text FROM queuebox.config",
	/* QB_Q_GAUGES: each count walks a partial index over the open states */
	"SELECT json_build_object("
	"  'outbox_pending', (SELECT count(*) FROM queuebox.outbox WHERE state = 'pending'),"
	"  'outbox_processing', (SELECT count(*) FROM queuebox.outbox WHERE state = 'processing'),"
	"  'outbox_oldest', coalesce((SELECT extract(epoch FROM now() - min(created_at))"
	"                             FROM queuebox.outbox WHERE state = 'pending'), 0),"
	"  'inbox_pending', (SELECT count(*) FROM queuebox.inbox WHERE state = 'pending'),"
	"  'inbox_processing', (SELECT count(*) FROM queuebox.inbox WHERE state = 'processing'),"
	"  'inbox_oldest', coalesce((SELECT extract(epoch FROM now() - min(created_at))"
	"                            FROM queuebox.inbox WHERE state = 'pending'), 0))::text",
	QB_PG_DEAD_ROWS("outbox", "id, message_id, topic, key, attempt, max_attempts, last_error, created_at"),
	QB_PG_DEAD_ROWS("inbox", "id, source, idempotency_key, event_type, aggregate_id, consumption, attempt, last_error, created_at"),
	"SELECT json_build_object('id', queuebox.replay_outbox($1::bigint))::text",
	"SELECT json_build_object('requeued', queuebox.requeue_outbox($1::bigint))::text",
	"SELECT json_build_object('id', queuebox.replay_inbox($1::bigint))::text",
	"SELECT json_build_object('requeued', queuebox.requeue_inbox($1::bigint))::text",
	"SELECT json_build_object('replayed', queuebox.replay_outbox($1::text, $2::text,"
	"  $3::timestamptz, $4::timestamptz))::text",
	"SELECT json_build_object('requeued', queuebox.requeue_outbox($1::text,"
	"  $2::timestamptz, $3::timestamptz))::text",
	"SELECT json_build_object('replayed', queuebox.replay_inbox($1::text, $2::text,"
	"  $3::timestamptz, $4::timestamptz))::text",
	"SELECT json_build_object('requeued', queuebox.requeue_inbox($1::text,"
	"  $2::timestamptz, $3::timestamptz))::text",
};

/* the number of text parameters of each query, indexed by QbQuery */
static const int qb_pg_query_nparams[] = {0, 0, 1, 1, 1, 1, 1, 1, 4, 3, 4, 3};

/*
 * Replay, the rows to replay: $1 int8 one id (NULL: by filter), $2 text
 * state (NULL: any), $3 text source (NULL: any), $4 timestamptz since, $5
 * timestamptz until (NULL: open).  In created_at, id order; the caller
 * renders each row's topic from the current configuration.
 */
#define QB_PG_INBOX_REPLAY_SELECT \
	"SELECT i.id, i.source, i.event_type FROM queuebox.inbox i" \
	" WHERE ($1::bigint IS NULL OR i.id = $1)" \
	"   AND ($2::text IS NULL OR i.state = $2)" \
	"   AND ($3::text IS NULL OR i.source = $3)" \
	"   AND ($4::timestamptz IS NULL OR i.created_at >= $4)" \
	"   AND ($5::timestamptz IS NULL OR i.created_at < $5)" \
	" ORDER BY i.created_at, i.id"

/*
 * Replay, the insert: $1 int8[] inbox ids, $2 text[] their rendered topics,
 * $3 int4 max_attempts.  New outbox rows through the relay's mapping, in
 * created_at, id order; the inbox rows are not changed.  Returns the new
 * outbox ids.
 */
#define QB_PG_INBOX_REPLAY \
	"WITH s AS (" \
	"   SELECT * FROM unnest($1::bigint[], $2::text[]) AS s(id, topic))," \
	" c AS (" \
	"   SELECT i.*, s.topic AS out_topic FROM queuebox.inbox i JOIN s ON s.id = i.id)" \
	" " QB_PG_INBOX_TO_OUTBOX("$3") \
	" RETURNING id"

/* The stored configuration document. */
#define QB_PG_CONFIG_LOAD \
	"SELECT document FROM queuebox.config WHERE id = 1"

#endif							/* QB_SQL_PG_H */
