/*-------------------------------------------------------------------------
 * qb_sql_pg.h
 *	  The PostgreSQL statements of every store op (outbox, relay, inbox,
 *	  the named queries, the configuration), one copy for every host.
 *
 * The background workers run them through SPI with saved plans; the
 * SQL-callable wrappers queuebox._outbox_claim() and friends run the same
 * text (so pg_regress and the isolation specs test exactly what the workers
 * run); the daemon's libpq store sends the same text.  Each statement's
 * parameter types are in its descriptor (qb_pg_stmt.c), the comments below
 * say what each $n means.
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
 *	- Takeover (docs/operations.md, "After a crash"): a claim records its
 *	  claimer, an id whose session advisory lock the claiming session holds
 *	  for as long as it runs (QB_PG_CLAIMER_LOCK); 0 records NULL.  Every
 *	  claimer lives in this server, so the lock is free exactly when its
 *	  session ended: the worker exited, the postmaster restarted (the lock
 *	  table is in shared memory), the daemon's role or its connection died.
 *	  A processing row whose claimer's lock no session holds is taken over
 *	  at once (the reclaim, the relay claim) as an expired lease is: a new
 *	  claim gets a new token, so the old one's settle changes nothing.  A
 *	  lock held by someone else by chance only makes a gone claimer look
 *	  alive: the lease is still the safety net.  Each distinct claimer of
 *	  a processing row whose lease runs is tested once per statement (an
 *	  InitPlan, QB_PG_CLAIMERS_GONE), not the whole of pg_locks: reading
 *	  that copies the server's lock table under every partition lock, 23
 *	  ms with 50,000 locks held, once a second per worker.
 *-------------------------------------------------------------------------
 */

/*
 * QB_PG_CLAIMERS_GONE(rows, own): the claimers that are gone, as an array,
 * among the processing rows of rows (a table and its alias g, with a
 * condition on g, ending in AND) whose lease runs.  A claimer is gone when
 * its lock can be taken shared for this transaction: its session would
 * hold it exclusively.  own is the claimer this session holds (0 or NULL,
 * as the SQL functions pass it: none): a session's own lock never stops
 * it, so it would look gone.  The lock a
 * gone claimer's test takes only stops a new claimer from drawing that id
 * until this transaction ends.  DISTINCT keeps the volatile test on the
 * claimers, not their rows (a qual with one is never pushed into it).
 */
#define QB_PG_CLAIMERS_GONE(rows, own) \
	"ARRAY(SELECT d.c FROM (SELECT DISTINCT g.claimer AS c FROM " rows \
	"   g.state = 'processing' AND g.claimer IS NOT NULL AND g.lease_until >= now()) d" \
	" WHERE d.c IS DISTINCT FROM " own " AND pg_catalog.pg_try_advisory_xact_lock_shared(d.c))"

/*
 * Claimer lock: $1 int8 the claimer id.  Session level, held until the
 * session ends; false when another session holds it (the caller draws
 * another id).
 */
#define QB_PG_CLAIMER_LOCK \
	"SELECT pg_try_advisory_lock($1)"

#ifndef QB_SQL_PG_H
#define QB_SQL_PG_H

/*
 * The claim (docs/design/claim.md).  A pending row is in exactly one
 * place, each with its own partial index, and a claim reads only the
 * places that can give it a row now:
 *	- a destination's intake: new rows the outbox_route trigger routed at
 *	  insert (hold 'intake'), per destination $6 in id order from its floor
 *	  $9 (ids at or below it were all seen, except rows that committed
 *	  late, which the host reports by lowering the floors);
 *	- routed: rows whose destination is known and that a claim met before
 *	  (retries, rows written back, hold NULL), per destination in due
 *	  order.  A destination of $6 gives at most $7 rows from these two
 *	  places, routed rows first, and only when it takes rows now: the rows
 *	  of a full, slow or open destination are not read at all;
 *	- the unrouted intake: new rows inserted with no published routes
 *	  (destination and hold NULL), in id order from the floor $5;
 *	- ready: rows a settle or an operator made claimable again but that no
 *	  worker has routed yet (hold 'ready'), in due order.  From these two,
 *	  whose destinations are not known yet, at most $1 rows in all;
 *	- probes $8: one row of each destination whose half-open probe this
 *	  worker won: its oldest held row, or else its routed row due first
 *	  (due or not: a retry waiting out its backoff must not keep the
 *	  circuit from closing), or else its oldest intake row.
 * Rows held behind a key (hold 'key') or a destination (hold 'destination')
 * are in no claimed index, so however many there are the claim reads none.
 *
 * Of the candidates, a keyed row that an earlier open row of its key holds
 * back (QB_PG_OUTBOX_BLOCKER: at its destination, or not routed yet) is not
 * claimed, but for a fan-out row not copied yet (origin = id, no
 * destination: marked at insert), which is claimed whatever its key's
 * order and returned not_due: it is only copied and routed back, each copy
 * then waits at its own destination.  A blocked row is parked (hold 'key') when that earlier row could be locked
 * FOR SHARE and is still open, so the settle that ends the earlier row is
 * sure to see the park and promote it (QB_PG_OUTBOX_PROMOTE); when the
 * earlier row is locked by another transaction it is only moved to ready,
 * to be looked at again.  The others are claimed: processing, token $4,
 * lease $2 ms.  Nothing waits on a lock (SKIP LOCKED throughout).  Each
 * candidate's blocker (or none) is one row of blk, and its decision is
 * read from that row: a join of the candidates to their blockers ran as a
 * nested loop over two CTEs, quadratic in the batch (500 candidates that
 * all wait: 26-27 ms a claim, 14-18 without; bench/RESULTS.md).  The
 * decisions reach the UPDATE as three arrays, one aggregate over blk: an
 * aggregate reads all of its input before its row, so every decision and
 * every FOR SHARE lock of lk is made before the first row is written (a
 * plain join would decide later rows after earlier writes), and each row
 * finds its decision by the join, not by a search of an array per column
 * (quadratic too: 500 free candidates 14.5 ms a claim, 9.9 without).  The
 * rows come back in the candidates' order, not by id.
 *
 * $1 int4 rows from the unrouted intake and ready, $2 int8 lease ms, $3
 * int4 default max_attempts, $4 uuid token, $5 int8 unrouted intake floor,
 * $6 text[] destinations, $7 int4[] their limits, $8 text[] probe
 * destinations, $9 int8[] the destinations' intake floors, $10 int8 the
 * claimer (0: none, taken over by lease only).  Returns every
 * row changed: claimed ones with their content, parked and moved ones with
 * claimed false; in_intake says the row came from an intake (the caller's
 * floor of its destination, or the unrouted floor when destination is
 * NULL), not_due a row claimed before its scheduled_at (an intake row:
 * written back routed, not published), probe the row claimed as its
 * destination's probe.  A destination of $6 whose circuit is not closed,
 * or that is paused, gives no row (the list may be a cycle old).
 */
/*
 * The order of a key is kept per destination (docs/design/claim.md, "One
 * key, several destinations"): a row waits for the earlier open rows of its
 * key at its own destination and for those not routed yet; a row not
 * routed yet waits for every earlier open row of its key.  Earlier is by
 * place, coalesce(origin, id): a fan-out copy takes the place of the row
 * it was copied from.  QB_PG_OUTBOX_BLOCKER(x) is the nearest such row of
 * x (a row source with key, dest (NULL: not routed) and pos), as a
 * subquery of one column id and at most one row; each branch is one seek of
 * outbox_key_open_idx (key, coalesce(destination, ''), place), the last
 * only for a row not routed yet.
 */
#define QB_PG_OUTBOX_OPEN(e) "(" e ".state IN ('pending', 'processing') OR " e ".hold = 'dead')"
#define QB_PG_OUTBOX_BLOCKER(x) \
	" SELECT z.id FROM (" \
	"  (SELECT e.id, coalesce(e.origin, e.id) AS p FROM queuebox.outbox e" \
	"   WHERE e.key = " x ".key AND coalesce(e.destination, '') = ''" \
	"     AND coalesce(e.origin, e.id) < " x ".pos AND " QB_PG_OUTBOX_OPEN("e") \
	"   ORDER BY coalesce(e.origin, e.id) DESC LIMIT 1)" \
	"  UNION ALL" \
	"  (SELECT e.id, coalesce(e.origin, e.id) FROM queuebox.outbox e" \
	"   WHERE e.key = " x ".key AND coalesce(e.destination, '') = " x ".dest" \
	"     AND coalesce(e.origin, e.id) < " x ".pos AND " QB_PG_OUTBOX_OPEN("e") \
	"   ORDER BY coalesce(e.origin, e.id) DESC LIMIT 1)" \
	"  UNION ALL" \
	"  (SELECT e.id, coalesce(e.origin, e.id) FROM queuebox.outbox e" \
	"   WHERE " x ".dest IS NULL AND e.key = " x ".key AND coalesce(e.destination, '') > ''" \
	"     AND coalesce(e.origin, e.id) < " x ".pos AND " QB_PG_OUTBOX_OPEN("e") \
	"   LIMIT 1)) z ORDER BY z.p DESC LIMIT 1"

#define QB_PG_OUTBOX_CLAIM_WITH(probe_cte, probe_cand, probe_col) \
	"WITH c_dest AS (" \
	"   SELECT r.id, r.key, r.intake, d.name AS dest, r.pos, false AS fan FROM (" \
	"     SELECT * FROM unnest($6::text[], $7::int[], $9::bigint[]) AS u(name, lim, floor)" \
	"     WHERE NOT EXISTS (SELECT 1 FROM queuebox.destination_state s" \
	"                       WHERE s.destination = u.name" \
	"                         AND (s.state <> 'closed' OR s.paused_until > now()))) d" \
	"   CROSS JOIN LATERAL (" \
	"     SELECT x.id, x.key, x.intake, x.pos FROM (" \
	"       (SELECT * FROM (SELECT c.id, c.key, false AS intake, coalesce(c.origin, c.id) AS pos" \
	"        FROM queuebox.outbox c" \
	"        WHERE c.destination = d.name AND c.state = 'pending' AND c.hold IS NULL" \
	"          AND c.scheduled_at <= now()" \
	"        ORDER BY c.scheduled_at, c.id LIMIT d.lim FOR UPDATE SKIP LOCKED) b)" \
	"       UNION ALL" \
	"       (SELECT * FROM (SELECT c.id, c.key, true, coalesce(c.origin, c.id)" \
	"        FROM queuebox.outbox c" \
	"        WHERE c.destination = d.name AND c.state = 'pending' AND c.hold = 'intake'" \
	"          AND c.id > coalesce(d.floor, 0)" \
	"        ORDER BY c.id LIMIT d.lim FOR UPDATE SKIP LOCKED) b)) x" \
	"     LIMIT d.lim) r)," \
	" c_intake AS (" \
	"   SELECT c.id, c.key, NULL::text, coalesce(c.origin, c.id), c.origin = c.id, true" \
	"   FROM queuebox.outbox c" \
	"   WHERE c.state = 'pending' AND c.destination IS NULL AND c.hold IS NULL" \
	"     AND c.id > $5" \
	"   ORDER BY c.id LIMIT $1 FOR UPDATE SKIP LOCKED)," \
	" c_ready AS (" \
	"   SELECT c.id, c.key, c.destination, coalesce(c.origin, c.id)," \
	"          c.destination IS NULL AND c.origin = c.id, false FROM queuebox.outbox c" \
	"   WHERE c.state = 'pending' AND c.hold = 'ready' AND c.scheduled_at <= now()" \
	"   ORDER BY c.scheduled_at, c.id" \
	"   LIMIT greatest($1 - (SELECT count(*) FROM c_intake), 0) FOR UPDATE SKIP LOCKED)," \
	probe_cte \
	" cand AS (" \
	"   SELECT id, key, dest, pos, fan, intake FROM c_dest UNION ALL SELECT * FROM c_intake" \
	"   UNION ALL SELECT * FROM c_ready" probe_cand ")," \
	" blk AS (" \
	"   SELECT c.id AS cid, b.id AS bid, c.intake FROM cand c" \
	"   LEFT JOIN LATERAL (SELECT * FROM (" QB_PG_OUTBOX_BLOCKER("c") ") y" \
	"     WHERE c.key IS NOT NULL AND NOT coalesce(c.fan, false)) b ON true)," \
	" lk AS (" \
	"   SELECT e.id FROM queuebox.outbox e" \
	"   WHERE e.id = ANY (ARRAY(SELECT bid FROM blk)) AND (e.state IN ('pending', 'processing') OR e.hold = 'dead')" \
	"   FOR SHARE SKIP LOCKED)," \
	" dec AS (" \
	"   SELECT array_agg(b.cid) AS ids," \
	"          array_agg(CASE WHEN b.bid IS NULL THEN 'claim'" \
	"                         WHEN b.bid = ANY (ARRAY(SELECT id FROM lk)) THEN 'park'" \
	"                         ELSE 'ready' END) AS whats," \
	"          array_agg(b.intake) AS intakes" \
	"   FROM blk b)" \
	" UPDATE queuebox.outbox o" \
	" SET state = CASE WHEN x.what = 'claim' THEN 'processing' ELSE 'pending' END," \
	"     hold = CASE x.what WHEN 'claim' THEN NULL WHEN 'park' THEN 'key' ELSE 'ready' END," \
	"     claim_token = CASE WHEN x.what = 'claim' THEN $4 END," \
	"     lease_until = CASE WHEN x.what = 'claim' THEN now() + $2 * interval '1 millisecond' END," \
	"     claimer = CASE WHEN x.what = 'claim' THEN nullif($10, 0) END" \
	" FROM dec CROSS JOIN LATERAL unnest(dec.ids, dec.whats, dec.intakes) AS x(id, what, intake)" \
	" WHERE o.id = x.id" \
	" RETURNING o.id, o.message_id, o.topic, o.key, o.payload::text, o.headers::text," \
	"           o.attempt, coalesce(o.max_attempts, $3)," \
	"           extract(epoch FROM o.created_at)::float8," \
	"           o.state = 'processing', o.destination," \
	"           x.intake," \
	"           o.scheduled_at > now() OR coalesce(o.destination IS NULL AND o.origin = o.id, false)," \
	"           " probe_col

/* the probe rows (QB_PG_OUTBOX_CLAIM $8) */
#define QB_PG_OUTBOX_CLAIM_PROBES \
	" c_probe AS (" \
	"   SELECT r.id, r.key, d.name, r.pos, false, false FROM unnest($8::text[]) AS d(name)" \
	"   CROSS JOIN LATERAL (" \
	"     SELECT x.id, x.key, x.pos FROM (" \
	"       (SELECT * FROM (SELECT c.id, c.key, coalesce(c.origin, c.id) AS pos FROM queuebox.outbox c" \
	"        WHERE c.destination = d.name AND c.state = 'pending' AND c.hold = 'destination'" \
	"        ORDER BY c.id LIMIT 1 FOR UPDATE SKIP LOCKED) b)" \
	"       UNION ALL" \
	"       (SELECT * FROM (SELECT c.id, c.key, coalesce(c.origin, c.id) FROM queuebox.outbox c" \
	"        WHERE c.destination = d.name AND c.state = 'pending' AND c.hold IS NULL" \
	"        ORDER BY c.scheduled_at, c.id LIMIT 1 FOR UPDATE SKIP LOCKED) b)" \
	"       UNION ALL" \
	"       (SELECT * FROM (SELECT c.id, c.key, coalesce(c.origin, c.id) FROM queuebox.outbox c" \
	"        WHERE c.destination = d.name AND c.state = 'pending' AND c.hold = 'intake'" \
	"        ORDER BY c.id LIMIT 1 FOR UPDATE SKIP LOCKED) b)) x" \
	"     LIMIT 1) r),"

#define QB_PG_OUTBOX_CLAIM \
	QB_PG_OUTBOX_CLAIM_WITH(QB_PG_OUTBOX_CLAIM_PROBES, " UNION ALL SELECT * FROM c_probe", \
							"o.id = ANY (ARRAY(SELECT id FROM c_probe))")

/*
 * The claim when no probe is asked for ($8 empty), as it nearly always is:
 * without the probes' three index scans, which a generic plan starts
 * whether or not they read a row (a claim at 50 a second took a quarter
 * less time without them: bench/RESULTS.md, issue 37).  Its probe column
 * is false: $8 is an array, never NULL.
 */
#define QB_PG_OUTBOX_CLAIM_NO_PROBE \
	QB_PG_OUTBOX_CLAIM_WITH("", "", "$8::text[] IS NULL")

/*
 * Settle: $1 uuid[] claim tokens, $2 int8[] ids, $3 text[] outcomes, $4
 * int4[] attempts, $5 int8[] retry delays in ms, $6 text[] errors, $7
 * text[] the destination each row was routed to (NULL: not routed), $8
 * bool[] the row had no destination when it was claimed.  Outcomes: 'sent' and 'dead' are final; 'dead-hold' is dead and keeps
 * its key's later rows behind it (hold 'dead', onDead: holdKey; a row
 * without a key has none to keep); 'retry' is pending again, due
 * after its delay; 'release' is pending again with its attempt and due time
 * unchanged (a worker that stopped before it knew); 'route' is pending with
 * its destination recorded, attempt unchanged (claimed before it was due,
 * or more rows than the destination can take now); 'hold' waits for its
 * destination (hold 'destination': an open or disabled circuit, a
 * Retry-After pause).  A retry whose destination is not taking rows (the
 * breaker statement of the same transaction opened it) is held the same
 * way, its attempt counted.  Fenced by each row's token.  Returns the key,
 * state and destination of each row changed (NULL when it had none at its
 * claim: it held back its key at every destination), and whether the
 * caller promotes its key (QB_PG_OUTBOX_PROMOTE, a later statement): a row
 * that ended, or one routed now that had no destination at its claim (a
 * fan-out row routed to its first destination, a retry, a hold, a
 * release: it no longer holds back the rows of its key at the other
 * destinations; $8 NULL, not known: every routed row).  Each row is found
 * by its id from the arrays' row, one probe of outbox_pkey (the join on a
 * unique key: the planner takes it on an empty outbox too, with the
 * workers' and the daemon's session settings, qb_pg_stmt.c; the internal
 * SQL functions, queuebox._outbox_settle, plan it with their caller's).
 * Not bounded by "o.id = ANY ($2)" (before 2026-12-07): the planner then
 * read the rows by the array and matched each arrays' row against all of
 * them, quadratic in the batch (a sent row's settle took 12 µs at a batch
 * of 100 and 22 at 500; by id 8.5 and 7.6: bench/RESULTS.md, issue 37).
 * A retry's destination is read in the CASE, so only retries read it: as a
 * lateral join the planner probed destination_state for every row settled
 * (2 of a sent row's 16 blocks; bench/RESULTS.md, issue 37).
 */
#define QB_PG_OUTBOX_SETTLE \
	"UPDATE queuebox.outbox o" \
	" SET state = CASE WHEN s.outcome = 'sent' THEN 'sent'" \
	"                  WHEN s.outcome IN ('dead', 'dead-hold') THEN 'dead' ELSE 'pending' END," \
	"     attempt = s.attempt," \
	"     destination = coalesce(s.destination, o.destination)," \
	"     hold = CASE WHEN s.outcome = 'hold' THEN 'destination'" \
	"                 WHEN s.outcome = 'dead-hold' AND o.key IS NOT NULL THEN 'dead'" \
	"                 WHEN s.outcome = 'retry' AND coalesce((" \
	"                   SELECT d.state <> 'closed' OR coalesce(d.paused_until > now(), false)" \
	"                   FROM queuebox.destination_state d" \
	"                   WHERE d.destination = s.destination), false) THEN 'destination'" \
	"                 WHEN s.outcome IN ('release', 'route', 'retry')" \
	"                      AND coalesce(s.destination, o.destination) IS NULL THEN 'ready'" \
	"                 END," \
	"     scheduled_at = CASE s.outcome" \
	"                      WHEN 'retry' THEN now() + s.delay_ms * interval '1 millisecond'" \
	"                      ELSE o.scheduled_at END," \
	"     last_error = CASE WHEN s.outcome IN ('sent', 'route') THEN o.last_error ELSE s.error END," \
	"     claim_token = NULL, lease_until = NULL, claimer = NULL" \
	" FROM unnest($1::uuid[], $2::bigint[], $3::text[], $4::int[], $5::bigint[], $6::text[]," \
	"             $7::text[], $8::bool[])" \
	"   AS s(token, id, outcome, attempt, delay_ms, error, destination, unrouted)" \
	" WHERE o.id = s.id AND o.claim_token = s.token" \
	" RETURNING o.key, o.state, CASE WHEN NOT s.unrouted THEN o.destination END," \
	"           o.state IN ('sent', 'dead')" \
	"             OR (coalesce(s.unrouted, true) AND o.destination IS NOT NULL)"

/*
 * Fan-out: $1 uuid[] claim tokens, $2 int8[] ids, $3 text[] each row's
 * copies: a JSON array of destination names, or NULL.  A row a route with
 * several destinations matched is copied at its first claim, before the
 * settle that records its first destination, in the same transaction: one
 * copy per other destination, with the row's message_id, topic, key,
 * payload, headers, max_attempts, scheduled_at and created_at, routed
 * (hold NULL: claimable when due), and origin = the row's id, its place in
 * its key's order; the row itself gets origin = its id too (the insert
 * trigger set it already when it knew the route), which marks it a fan-out
 * row (requeue, replay and unroute keep it to its own destination).
 * Fenced by each row's token, and only while the row is not routed: a row
 * is copied once.  The insert trigger leaves a copy as it is.  Each row is
 * found by its id, as in QB_PG_OUTBOX_SETTLE (and for its reason).
 */
#define QB_PG_OUTBOX_FANOUT \
	"WITH r AS (" \
	"   UPDATE queuebox.outbox o SET origin = o.id" \
	"   FROM unnest($1::uuid[], $2::bigint[], $3::text[]) AS s(token, id, copies)" \
	"   WHERE o.id = s.id AND o.claim_token = s.token" \
	"     AND s.copies IS NOT NULL AND o.destination IS NULL" \
	"     AND (o.origin IS NULL OR o.origin = o.id)" \
	"   RETURNING o.*, s.copies)" \
	" INSERT INTO queuebox.outbox (message_id, topic, key, payload, headers, max_attempts," \
	"                              scheduled_at, created_at, destination, origin)" \
	" SELECT r.message_id, r.topic, r.key, r.payload, r.headers, r.max_attempts," \
	"        r.scheduled_at, r.created_at, d.name, r.id" \
	" FROM r CROSS JOIN LATERAL jsonb_array_elements_text(r.copies::jsonb)" \
	"   WITH ORDINALITY AS d(name, n)" \
	" ORDER BY r.id, d.n"

/*
 * A dead row with hold 'dead' (onDead: holdKey) counts as open for its key
 * here, in the claim and in the sweep, until it is requeued or skipped
 * (docs/design/claim.md, "A dead head that holds its key").
 *
 * Promote: $1 text[] keys whose row just ended (sent or dead) or was just
 * routed, $6 text[] the destination of each (NULL: it had none when
 * claimed), in a statement after the settle, so its snapshot sees every
 * park made while the ended row was open (the claim parked them holding a
 * FOR SHARE lock on that row, which the settle's update waited for).  The
 * rows the ended row may have held back are looked at: of its key at its
 * destination, the first open row there or among the rows not routed yet
 * (one seek of outbox_key_open_idx finds the key's first open row, ''
 * first: it is the answer when it waits at that destination, and only when
 * it is not routed or waits at another does a second seek look at the
 * destination); of a row that had no destination, the first open row of its
 * key at each destination and among those not routed.  Only parked rows are
 * released, so the second seek, and every look after a row that had no
 * destination, wait on QB_PG_OUTBOX_KEY_PARKED: a key with nothing parked
 * costs the first seek or less.  Each is released if
 * it is parked behind the key and nothing else holds it back
 * (QB_PG_OUTBOX_BLOCKER).  The first row not routed yet waits for rows at
 * every destination, which may end at once in other transactions: each
 * promotion would see the others open and none release it.  So a row in
 * flight (processing) does not keep it parked here: released, the claim
 * checks its order again and parks it again under a lock of what still
 * holds it back (QB_PG_OUTBOX_ROUTED_WAITING).  A row a claim has
 * not met yet is left where it is (in intake or routed), for the claim
 * that meets it: that costs no write, and a claim can no longer park it
 * behind the row that ended.  With a token $2 (the cycle claims too), a due
 * released row is claimed at once with it (lease $3 ms, default
 * max_attempts $4, claimer $5 as the claim's $10): a hot key moves one row per cycle without a claim of
 * its own.  Without one, it goes to ready (not routed yet) or back to its
 * destination's routed rows.  Returns the rows as the claim does.  The
 * rows are found by id: "coalesce(hold, '') = 'key'" keeps the planner from
 * reading them through outbox_parked_idx instead, which it would on an
 * outbox without statistics (each predicate's default selectivity makes
 * the partial index look nearly empty), and which holds every row parked
 * at insert: 73 ms a promotion behind 90,000 of them.
 */
/*
 * An open row of key k placed before pos at a destination that is not in
 * flight (pending, or dead holding its key), as a subquery for NOT EXISTS:
 * what keeps a parked row not routed yet parked at a promotion.  One seek
 * of outbox_key_open_idx.
 */
#define QB_PG_OUTBOX_ROUTED_WAITING(k, pos) \
	" SELECT 1 FROM queuebox.outbox e" \
	" WHERE e.key = " k " AND coalesce(e.destination, '') > ''" \
	"   AND coalesce(e.origin, e.id) < " pos " AND " QB_PG_OUTBOX_OPEN("e") \
	"   AND e.state <> 'processing'"

/*
 * A released row the promotion claims at once: the cycle claims ($2), the
 * row is due, and it is routed, or no earlier row of its key is in flight
 * at a destination (one seek of outbox_key_open_idx: "in flight" is
 * written as open, not pending, not a held dead row, which the planner
 * cannot serve from outbox_lease_idx and its walk of every row in flight;
 * an earlier row in flight and not routed would have kept it from being
 * the first).  A row not routed yet is released past rows in
 * flight (QB_PG_OUTBOX_ROUTED_WAITING) only for the claim to look again:
 * claimed here it would be published beside them.
 */
#define QB_PG_OUTBOX_PROMOTE_CLAIMS \
	"$2::uuid IS NOT NULL AND o.scheduled_at <= now() AND (o.destination IS NOT NULL OR NOT EXISTS (" \
	" SELECT 1 FROM queuebox.outbox e WHERE e.key = o.key AND coalesce(e.destination, '') > ''" \
	"   AND coalesce(e.origin, e.id) < coalesce(o.origin, o.id) AND " QB_PG_OUTBOX_OPEN("e") \
	"   AND e.state <> 'pending' AND coalesce(e.hold, '') <> 'dead'))"

/*
 * Has key k a parked row (hold 'key')?  One seek of outbox_parked_idx, for
 * a promotion whose key's first open row is not parked: a promotion
 * releases only parked rows, so without one it has nothing to look for.
 * On the extension a key's next row is parked at insert and this is
 * seldom asked; the daemon parks only at a claim, and a claim after the
 * key's earlier rows ended parks nothing, so this small index answers what
 * two more seeks of outbox_key_open_idx would (bench/RESULTS.md,
 * 2026-12-07: 14.5 blocks a delivered row for no promoted row).  OFFSET 0
 * keeps it a seek per key: a generic plan made while the table looked
 * small (before its first ANALYZE) turned the EXISTS into a hashed subplan
 * that read the whole index at every promotion (2,125 blocks for 10,000
 * parked rows; TAP 077).
 */
#define QB_PG_OUTBOX_KEY_PARKED(k) \
	"EXISTS (SELECT 1 FROM queuebox.outbox p" \
	"  WHERE p.key = " k " AND p.state = 'pending' AND p.hold = 'key' OFFSET 0)"

#define QB_PG_OUTBOX_PROMOTE \
	"UPDATE queuebox.outbox o" \
	" SET state = CASE WHEN " QB_PG_OUTBOX_PROMOTE_CLAIMS " THEN 'processing' ELSE 'pending' END," \
	"     hold = CASE WHEN " QB_PG_OUTBOX_PROMOTE_CLAIMS " THEN NULL" \
	"                 WHEN o.destination IS NULL THEN 'ready' END," \
	"     claim_token = CASE WHEN " QB_PG_OUTBOX_PROMOTE_CLAIMS " THEN $2::uuid END," \
	"     lease_until = CASE WHEN " QB_PG_OUTBOX_PROMOTE_CLAIMS \
	"                        THEN now() + $3 * interval '1 millisecond' END," \
	"     claimer = CASE WHEN " QB_PG_OUTBOX_PROMOTE_CLAIMS " THEN nullif($5, 0) END" \
	" WHERE o.id = ANY (ARRAY(" \
	"   SELECT f.id FROM unnest($1::text[], $6::text[]) AS k(key, dest)" \
	"   CROSS JOIN LATERAL (" \
	"     SELECT e.id, coalesce(e.destination, '') AS g, coalesce(e.origin, e.id) AS pos," \
	"            coalesce(e.hold, '') AS hold" \
	"     FROM queuebox.outbox e" \
	"     WHERE k.dest IS NOT NULL AND e.key = k.key AND " QB_PG_OUTBOX_OPEN("e") \
	"     ORDER BY coalesce(e.destination, ''), coalesce(e.origin, e.id) LIMIT 1) h" \
	"   CROSS JOIN LATERAL (" \
	"     SELECT x.id, nullif(x.g, '') AS dest, x.pos, x.hold FROM (" \
	"       SELECT h.id, h.g, h.pos, h.hold WHERE h.g IN ('', k.dest)" \
	"       UNION ALL" \
	"       (SELECT e.id, coalesce(e.destination, ''), coalesce(e.origin, e.id), coalesce(e.hold, '')" \
	"        FROM queuebox.outbox e" \
	"        WHERE h.g <> k.dest AND (h.hold = 'key' OR " QB_PG_OUTBOX_KEY_PARKED("k.key") ")" \
	"          AND e.key = k.key AND coalesce(e.destination, '') = k.dest" \
	"          AND " QB_PG_OUTBOX_OPEN("e") \
	"        ORDER BY coalesce(e.origin, e.id) LIMIT 1)) x" \
	"     ORDER BY x.pos LIMIT 1) f" \
	"   WHERE f.hold = 'key' AND (f.dest IS NOT NULL OR NOT EXISTS (" \
	QB_PG_OUTBOX_ROUTED_WAITING("k.key", "f.pos") "))" \
	"   UNION ALL" \
	"   SELECT f.id FROM unnest($1::text[], $6::text[]) AS k(key, dest)" \
	"   CROSS JOIN LATERAL (" \
	"     SELECT k.key, x.id, nullif(x.g, '') AS dest, x.pos, x.hold FROM (" \
	"       (SELECT e.id, '' AS g, coalesce(e.origin, e.id) AS pos, coalesce(e.hold, '') AS hold" \
	"        FROM queuebox.outbox e" \
	"        WHERE e.key = k.key AND coalesce(e.destination, '') = '' AND " QB_PG_OUTBOX_OPEN("e") \
	"        ORDER BY coalesce(e.origin, e.id) LIMIT 1)" \
	"       UNION ALL" \
	"       (SELECT DISTINCT ON (coalesce(e.destination, '')) e.id, coalesce(e.destination, '')," \
	"               coalesce(e.origin, e.id), coalesce(e.hold, '') FROM queuebox.outbox e" \
	"        WHERE e.key = k.key AND coalesce(e.destination, '') > ''" \
	"          AND " QB_PG_OUTBOX_OPEN("e") \
	"        ORDER BY coalesce(e.destination, ''), coalesce(e.origin, e.id))) x" \
	"     WHERE k.dest IS NULL AND " QB_PG_OUTBOX_KEY_PARKED("k.key") ") f" \
	"   WHERE f.hold = 'key'" \
	"     AND CASE WHEN f.dest IS NULL THEN NOT EXISTS (" QB_PG_OUTBOX_ROUTED_WAITING("f.key", "f.pos") ")" \
	"              ELSE NOT EXISTS (" QB_PG_OUTBOX_BLOCKER("f") ") END))" \
	"   AND o.state = 'pending' AND coalesce(o.hold, '') = 'key'" \
	" RETURNING o.id, o.message_id, o.topic, o.key, o.payload::text, o.headers::text," \
	"           o.attempt, coalesce(o.max_attempts, $4)," \
	"           extract(epoch FROM o.created_at)::float8," \
	"           o.state = 'processing', o.destination, false, false, false"

/*
 * Two ends at once (docs/design/claim.md): a fan-out row is claimed
 * whatever its key's order, so while a worker routes it (not routed yet,
 * in flight) it can end at the same time as the row before it at a
 * destination D, in another transaction; a row C parked at D behind both
 * is then left parked by both promotions, each seeing the other row open.
 * So after the promotion in a cycle that ended a fan-out row, for the keys
 * of rows that had no destination when claimed ($1 text[]; a routed row's
 * promotion needs none of this: the fan-out row that ended beside it ran
 * this; no other row is in flight out of its key's order), a statement
 * of its own releases, unclaimed, each destination's first parked row
 * (the first open row there, or the one after it when that one is in
 * flight) whose earlier open rows (at D and not routed yet) are all in
 * flight and one of them is being ended by another transaction now (its
 * lock held: skipped) or has ended since this statement's snapshot (its
 * latest version is not in flight): that transaction's promotion may have
 * left it parked.  Released to its destination's routed rows, the claim
 * checks its order again under a lock (claims it, or parks it again behind
 * a row still open, one that was retried say).  The rows in flight it can
 * lock stay locked FOR SHARE until its commit: their settles wait for it,
 * and their promotions see this end.  So of two ends at once, at least
 * one releases C.  Only keys with a parked row are looked at
 * (QB_PG_OUTBOX_KEY_PARKED), with the promotion's seeks.
 */
#define QB_PG_OUTBOX_PAST_OPEN(k, g, pos, what) \
	" (SELECT 1 FROM queuebox.outbox e" \
	"  WHERE e.key = " k " AND coalesce(e.destination, '') = " g \
	"    AND coalesce(e.origin, e.id) < " pos " AND " QB_PG_OUTBOX_OPEN("e") " AND " what ")"
#define QB_PG_OUTBOX_PAST_WAITING "(e.state = 'pending' OR e.hold = 'dead')"
#define QB_PG_OUTBOX_PAST_ENDING \
	"e.state <> 'pending' AND coalesce(e.hold, '') <> 'dead'" \
	" AND NOT EXISTS (SELECT 1 FROM queuebox.outbox l WHERE l.id = e.id" \
	"   AND l.state <> 'pending' AND l.state <> 'sent' AND l.state <> 'dead' FOR SHARE SKIP LOCKED)"
#define QB_PG_OUTBOX_PAST(k, d, pos) \
	"NOT EXISTS" QB_PG_OUTBOX_PAST_OPEN(k, "''", pos, QB_PG_OUTBOX_PAST_WAITING) \
	" AND NOT EXISTS" QB_PG_OUTBOX_PAST_OPEN(k, d, pos, QB_PG_OUTBOX_PAST_WAITING) \
	" AND (EXISTS" QB_PG_OUTBOX_PAST_OPEN(k, "''", pos, QB_PG_OUTBOX_PAST_ENDING) \
	"      OR EXISTS" QB_PG_OUTBOX_PAST_OPEN(k, d, pos, QB_PG_OUTBOX_PAST_ENDING) ")"

#define QB_PG_OUTBOX_PROMOTE_PAST \
	"UPDATE queuebox.outbox o SET hold = NULL" \
	" WHERE o.id = ANY (ARRAY(" \
	"   SELECT r.id FROM (SELECT DISTINCT key FROM unnest($1::text[]) AS u(key)) k" \
	"   CROSS JOIN LATERAL (" \
	"     SELECT DISTINCT ON (coalesce(e.destination, '')) k.key, e.id, e.destination AS dest," \
	"            coalesce(e.origin, e.id) AS pos, coalesce(e.hold, '') AS hold, e.state AS st" \
	"     FROM queuebox.outbox e" \
	"     WHERE " QB_PG_OUTBOX_KEY_PARKED("k.key") " AND e.key = k.key" \
	"       AND coalesce(e.destination, '') > '' AND " QB_PG_OUTBOX_OPEN("e") \
	"     ORDER BY coalesce(e.destination, ''), coalesce(e.origin, e.id)) f" \
	"   LEFT JOIN LATERAL (SELECT * FROM (" QB_PG_OUTBOX_BLOCKER("f") ") z" \
	"     WHERE f.hold = 'key' OFFSET 0) b ON true" \
	"   LEFT JOIN LATERAL (" \
	"     SELECT e.id, coalesce(e.origin, e.id) AS pos, coalesce(e.hold, '') AS hold" \
	"     FROM queuebox.outbox e" \
	"     WHERE f.st = 'processing' AND e.key = f.key AND coalesce(e.destination, '') = f.dest" \
	"       AND coalesce(e.origin, e.id) > f.pos AND " QB_PG_OUTBOX_OPEN("e") \
	"     ORDER BY coalesce(e.origin, e.id) LIMIT 1) n ON true" \
	"   CROSS JOIN LATERAL (VALUES" \
	"     (f.id, b.id IS NOT NULL AND " QB_PG_OUTBOX_PAST("f.key", "f.dest", "f.pos") ")," \
	"     (n.id, n.hold = 'key' AND " QB_PG_OUTBOX_PAST("f.key", "f.dest", "n.pos") ")" \
	"   ) r(id, ok)" \
	"   WHERE r.ok))" \
	"   AND o.state = 'pending' AND coalesce(o.hold, '') = 'key'"

/*
 * Breaker: $1 text[] destinations (sorted, so two settles lock them in one
 * order), $2 int4[] attempts that succeeded, $3 int4[] attempts that
 * failed, $4 bool[] a 410 Gone among them, $5 int8[] Retry-After in ms (0:
 * none), $6 text[] the last error, $7 int4[] circuitBreaker.failures, $8
 * int8[] circuitBreaker.cooldownMs, $9 int8[] how many microseconds before
 * the tally was made the latest success was sent (NULL: just now).  The
 * shared state of each destination (queuebox.destination_state), read
 * under a row lock and written only when it changes:
 *	- closed -> open after `failures` consecutive failed attempts (counted
 *	  by every worker and replica together; a success resets the count);
 *	- half-open -> open when the probe fails, -> closed when it succeeds;
 *	- an open or half-open circuit counts a success only when it was sent
 *	  at or after opened_at (the probe, or a request of a worker that had
 *	  not seen it open yet): a request answered just before a partition and
 *	  settled late must not close it mid-partition.  Its send time is
 *	  now() less $9, on the database's clock as opened_at is (the worker
 *	  measured only the duration); it is late by the time from the tally
 *	  to this transaction's start, a round trip;
 *	- any -> disabled on a 410, until queuebox.resume_destination();
 *	- a Retry-After pauses the destination (paused_until) without changing
 *	  its state.
 * Every row exists: QB_PG_OUTBOX_BREAKER_ROWS creates the missing ones in
 * the statement before.  Returns each destination's state before and
 * after, and whether it is paused now.
 */
#define QB_PG_OUTBOX_BREAKER \
	"WITH t AS (" \
	"   SELECT * FROM unnest($1::text[], $2::int[], $3::int[], $4::bool[], $5::bigint[]," \
	"                        $6::text[], $7::int[], $8::bigint[], $9::bigint[])" \
	"   AS t(destination, n_ok, n_fail, gone, retry_after_ms, error, threshold, cooldown_ms," \
	"        ok_sent_ago_us))," \
	" cur AS (" \
	"   SELECT d.destination, d.state, d.failures, d.paused_until, d.opened_at" \
	"   FROM queuebox.destination_state d WHERE d.destination = ANY ($1::text[])" \
	"   ORDER BY d.destination FOR UPDATE)," \
	" tc AS (" \
	"   SELECT t.*, c.state AS old_state, c.failures AS old_failures, c.paused_until AS old_paused," \
	"     t.n_ok > 0 AND (c.state NOT IN ('open', 'half-open') OR c.opened_at IS NULL" \
	"       OR now() - coalesce(t.ok_sent_ago_us, 0) * interval '1 microsecond' >= c.opened_at) AS ok" \
	"   FROM t JOIN cur c ON c.destination = t.destination)," \
	" nx AS (" \
	"   SELECT tc.*," \
	"     CASE WHEN tc.gone OR tc.old_state = 'disabled' THEN 'disabled'" \
	"          WHEN tc.ok THEN 'closed'" \
	"          WHEN tc.n_fail > 0 AND tc.old_state IN ('open', 'half-open') THEN 'open'" \
	"          WHEN tc.n_fail > 0 AND tc.old_failures + tc.n_fail >= tc.threshold THEN 'open'" \
	"          ELSE tc.old_state END AS new_state," \
	"     CASE WHEN tc.ok AND NOT tc.gone THEN 0" \
	"          ELSE tc.old_failures + tc.n_fail END AS new_failures," \
	"     CASE WHEN tc.retry_after_ms > 0" \
	"          THEN greatest(tc.old_paused, now() + tc.retry_after_ms * interval '1 millisecond')" \
	"          ELSE tc.old_paused END AS new_paused" \
	"   FROM tc)," \
	" up AS (" \
	"   UPDATE queuebox.destination_state s" \
	"   SET state = nx.new_state, failures = nx.new_failures," \
	"       opened_at = CASE WHEN nx.new_state = s.state THEN s.opened_at" \
	"                        WHEN nx.new_state IN ('open', 'disabled') THEN now() END," \
	"       probe_at = CASE WHEN nx.new_state = 'open' AND s.state = 'open' THEN s.probe_at" \
	"                       WHEN nx.new_state = 'open'" \
	"                       THEN now() + nx.cooldown_ms * interval '1 millisecond' END," \
	"       paused_until = nx.new_paused," \
	"       last_error = coalesce(CASE WHEN nx.n_fail > 0 THEN nx.error END, s.last_error)," \
	"       changed_at = CASE WHEN nx.new_state = s.state THEN s.changed_at ELSE now() END" \
	"   FROM nx" \
	"   WHERE s.destination = nx.destination" \
	"     AND (nx.new_state <> nx.old_state OR nx.new_failures <> nx.old_failures" \
	"          OR nx.new_paused IS DISTINCT FROM nx.old_paused)" \
	"   RETURNING 1)" \
	" SELECT nx.destination, nx.old_state, nx.new_state," \
	"        coalesce(nx.new_paused > now(), false), (SELECT count(*) FROM up)" \
	" FROM nx ORDER BY nx.destination"

/*
 * Breaker rows: $1 text[] the destinations of QB_PG_OUTBOX_BREAKER, run in a
 * statement of the same transaction just before it.  It creates the state
 * row of each destination that has none yet (closed, no failures), so the
 * breaker statement always counts into a row it has locked: two settles
 * that both found no row would each insert the row from nothing, and the
 * second's ON CONFLICT update would overwrite the first's count.  Waits for
 * a concurrent creator of the same row; writes nothing for a destination
 * that has its row.
 */
#define QB_PG_OUTBOX_BREAKER_ROWS \
	"INSERT INTO queuebox.destination_state (destination)" \
	" SELECT d FROM unnest($1::text[]) AS d ORDER BY d" \
	" ON CONFLICT (destination) DO NOTHING"

/*
 * States: $1 int8 how long a probe may take (ms).  Every destination that
 * does not simply take rows now: not closed, failures counted, or paused.
 * An open destination whose cooldown is over goes half-open here, and the
 * one claim that moves it names it in `probe`: that worker claims one held
 * row of it as the probe (QB_PG_OUTBOX_CLAIM $8).  A half-open destination
 * whose probe never settled (probe_at passed) is probed again.
 */
#define QB_PG_OUTBOX_STATES \
	"WITH p AS (" \
	"   UPDATE queuebox.destination_state d" \
	"   SET state = 'half-open', probe_at = now() + $1 * interval '1 millisecond'," \
	"       changed_at = now()" \
	"   WHERE d.destination IN (" \
	"     SELECT x.destination FROM queuebox.destination_state x" \
	"     WHERE x.state IN ('open', 'half-open') AND x.probe_at <= now()" \
	"     FOR UPDATE SKIP LOCKED)" \
	"   RETURNING d.destination)" \
	" SELECT d.destination, CASE WHEN p.destination IS NOT NULL THEN 'half-open' ELSE d.state END," \
	"        d.failures, coalesce(d.paused_until > now(), false), p.destination IS NOT NULL," \
	"        d.state" \
	" FROM queuebox.destination_state d LEFT JOIN p ON p.destination = d.destination" \
	" WHERE d.state <> 'closed' OR d.failures > 0 OR d.paused_until > now()" \
	"    OR p.destination IS NOT NULL"

/*
 * Unpark: $1 text[] destinations taking rows again, $2 int4 most rows.
 * Rows held for them become claimable, due now at the latest: they waited
 * for the destination, not for their own backoff.  Returns the rows moved.
 * A destination of $1 whose stored circuit is not closed, or that is
 * paused, keeps its rows (the caller's view may be stale, as a worker's is
 * before its first claim): they are its half-open probes.  The rows are
 * found by id, "coalesce(hold, '') = 'destination'" as at the promotion:
 * a plan made on an empty outbox read every held row through
 * outbox_held_idx instead, at every unpark, moving none or not (2,939
 * blocks with 20,000 rows held at an open circuit; 3 now).
 */
#define QB_PG_OUTBOX_UNPARK \
	"UPDATE queuebox.outbox o" \
	" SET hold = NULL, scheduled_at = least(o.scheduled_at, now())" \
	" WHERE o.id = ANY (ARRAY(" \
	"   SELECT x.id FROM (" \
	"     SELECT u.name FROM unnest($1::text[]) AS u(name)" \
	"     WHERE NOT EXISTS (SELECT 1 FROM queuebox.destination_state s" \
	"                       WHERE s.destination = u.name" \
	"                         AND (s.state <> 'closed' OR s.paused_until > now()))) d" \
	"   CROSS JOIN LATERAL (" \
	"     SELECT c.id FROM queuebox.outbox c" \
	"     WHERE c.destination = d.name AND c.state = 'pending' AND c.hold = 'destination'" \
	"     ORDER BY c.id LIMIT $2 FOR UPDATE SKIP LOCKED) x))" \
	"   AND o.state = 'pending' AND coalesce(o.hold, '') = 'destination'"

/*
 * Sweep: $1 text the key to start at ('' : the first), $2 int4 most keys.
 * A row parked behind its key whose earlier rows have all ended waits for
 * a promotion that already ran: the park relies on a share lock that some
 * engines do not take (Babelfish ignores it), and an operator who ends a
 * row by UPDATE skips the promotion.  The sweep releases such rows, as the
 * promotion would have (to ready, or back to its destination's routed
 * rows; the claim checks the key's order again, so a release is always
 * safe).  It walks the keys and destinations that have parked rows in key
 * order, from $1, one step of outbox_parked_idx each (however many rows
 * one has parked), takes the first parked row of each and probes
 * outbox_key_open_idx for what holds it back (QB_PG_OUTBOX_BLOCKER): $2
 * steps, at most $2 rows.  Returns one row: the rows released, and the key
 * to start the next sweep at (NULL: the walk reached the last key, start
 * again at ''; the key's destinations are walked again from its first).  The probe is
 * a LATERAL ... LIMIT 1 and the release finds its rows by id (as the
 * promotion does): on an outbox without statistics the planner turned a
 * NOT EXISTS into an anti join over the whole of outbox_key_open_idx and
 * read the release's rows through outbox_parked_idx, 690 ms a sweep of
 * 1,000 keys with 30,000 rows parked.
 */
#define QB_PG_OUTBOX_SWEEP \
	"WITH RECURSIVE k AS (" \
	"   (SELECT o.key, coalesce(o.destination, '') AS g, o.destination AS dest, o.id," \
	"           coalesce(o.origin, o.id) AS pos, 1 AS n FROM queuebox.outbox o" \
	"    WHERE o.state = 'pending' AND o.hold = 'key' AND o.key >= $1::text" \
	"    ORDER BY o.key, coalesce(o.destination, ''), coalesce(o.origin, o.id) LIMIT 1)" \
	"   UNION ALL" \
	"   SELECT x.key, x.g, x.dest, x.id, x.pos, k.n + 1 FROM k CROSS JOIN LATERAL (" \
	"     SELECT o.key, coalesce(o.destination, '') AS g, o.destination AS dest, o.id," \
	"            coalesce(o.origin, o.id) AS pos FROM queuebox.outbox o" \
	"     WHERE o.state = 'pending' AND o.hold = 'key'" \
	"       AND (o.key, coalesce(o.destination, '')) > (k.key, k.g)" \
	"     ORDER BY o.key, coalesce(o.destination, ''), coalesce(o.origin, o.id) LIMIT 1) x" \
	"   WHERE k.n < $2::int)," \
	" s AS (" \
	"   SELECT k.id FROM k LEFT JOIN LATERAL (" QB_PG_OUTBOX_BLOCKER("k") ") b ON true" \
	"   WHERE b.id IS NULL)," \
	" u AS (" \
	"   UPDATE queuebox.outbox o SET hold = CASE WHEN o.destination IS NULL THEN 'ready' END" \
	"   WHERE o.id = ANY (ARRAY(" \
	"     SELECT x.id FROM queuebox.outbox x" \
	"     WHERE x.id = ANY (ARRAY(SELECT id FROM s)) AND x.state = 'pending'" \
	"       AND coalesce(x.hold, '') = 'key'" \
	"     FOR UPDATE SKIP LOCKED))" \
	"     AND o.state = 'pending' AND coalesce(o.hold, '') = 'key'" \
	"   RETURNING 1)" \
	" SELECT (SELECT count(*) FROM u)::int4, (SELECT k.key FROM k WHERE k.n = $2::int)"

/*
 * Unroute: $1 text[] the destinations of the configuration.  Rows routed
 * to a destination that no longer exists are routed again by the next
 * claim (to ready; a row parked behind its key stays parked); a fan-out
 * row (origin set) belongs to its destination, and goes dead saying so
 * (routed again, it would be delivered twice elsewhere).  Run once
 * after a reload; it reads every routed pending row.
 */
#define QB_PG_OUTBOX_UNROUTE \
	"UPDATE queuebox.outbox o" \
	" SET destination = CASE WHEN o.origin IS NOT NULL THEN o.destination END," \
	"     state = CASE WHEN o.origin IS NOT NULL THEN 'dead' ELSE 'pending' END," \
	"     hold = CASE WHEN o.origin IS NOT NULL THEN NULL" \
	"                 WHEN o.hold = 'key' THEN 'key' ELSE 'ready' END," \
	"     last_error = CASE WHEN o.origin IS NOT NULL" \
	"                       THEN 'destination ' || o.destination || ' is no longer in the configuration;" \
	" add it back and requeue the row (queuebox.requeue_outbox), or leave it dead'" \
	"                       ELSE o.last_error END" \
	" WHERE o.state = 'pending' AND o.destination IS NOT NULL" \
	"   AND NOT (o.destination = ANY ($1::text[]))"

/*
 * Reclaim: $1 int4 most rows, $2 int8 the claimer this session holds (0:
 * none).  Expired leases, and the claims of claimers
 * that are gone (takeover), go back to pending; the attempt is not counted
 * (nobody knows whether it was made).  A row that was never routed goes to
 * ready, not back into intake (below the floors).  A row claimed by a
 * live claimer is left alone until its lease ends.
 */
#define QB_PG_OUTBOX_RECLAIM \
	"UPDATE queuebox.outbox o" \
	" SET state = 'pending', claim_token = NULL, lease_until = NULL, claimer = NULL," \
	"     hold = CASE WHEN o.destination IS NULL THEN 'ready' END," \
	"     last_error = CASE WHEN o.lease_until < now()" \
	"       THEN 'lease expired: the claim was not settled within outbox.claimTimeoutMs; returned to pending'" \
	"       ELSE 'taken over: the worker that claimed it is gone (its session ended); returned to pending' END" \
	" WHERE o.id = ANY (ARRAY(" \
	"   SELECT x.id FROM queuebox.outbox x" \
	"   WHERE x.state = 'processing'" \
	"     AND (x.lease_until < now() OR x.claimer = ANY (" \
	QB_PG_CLAIMERS_GONE("queuebox.outbox g WHERE", "$2") "))" \
	"   ORDER BY x.lease_until LIMIT $1" \
	"   FOR UPDATE SKIP LOCKED))"

/*
 * Retention: $1 int8 seconds to keep, $2 int4 most rows, $3 int8 the floor:
 * the walk starts after this id (NULL, as the two-argument SQL function
 * passes it: from the start).  Sent rows created more than $1 seconds ago
 * are deleted, in id order: ids follow created_at (the default, now()), so
 * the oldest rows come first.  The walk of outbox_pkey (w) takes the first
 * $2 rows past the floor that are either to be deleted or too young to be
 * (created since the cutoff, not dated in the future), and d deletes the
 * first kind: a batch reads about $2 rows, and the young rows at the end of
 * the old ones end the last batch of a run after $2 rows too.  One row
 * answers: the rows deleted and the highest id the walk took (NULL: it took
 * none).  Within a retention run the engine passes that id as the next
 * batch's floor, so the old rows a batch kept (dead, still pending, or
 * dated in the future) and the index entries of the rows it deleted are
 * not walked again; a run starts from the start, so a row kept once is
 * looked at again by the next run.  No filtered scan serves this on the
 * workers' plans (enable_bitmapscan and enable_seqscan off): it was a
 * sequential scan that read to the table's end in the last batch of every
 * run (bench/retention, bench/RESULTS.md); the BRIN on created_at that it
 * could not use went in schema 0.3.7.
 * A row whose created_at is later than that of rows inserted after it is
 * deleted late, once the rows before it are.
 */
#define QB_PG_OUTBOX_RETENTION \
	"WITH w AS (" \
	"   SELECT w.id FROM queuebox.outbox w" \
	"   WHERE w.id > coalesce($3, 0)" \
	"     AND CASE WHEN w.created_at < now() - $1 * interval '1 second'" \
	"       THEN w.state = 'sent' ELSE w.created_at <= now() END" \
	"   ORDER BY w.id LIMIT $2)," \
	" d AS (" \
	"   DELETE FROM queuebox.outbox o" \
	"   WHERE o.id = ANY (ARRAY(" \
	"     SELECT x.id FROM queuebox.outbox x" \
	"     WHERE x.id = ANY (ARRAY(SELECT w.id FROM w))" \
	"       AND x.state = 'sent'" \
	"       AND x.created_at < now() - $1 * interval '1 second'" \
	"     FOR UPDATE SKIP LOCKED))" \
	"   RETURNING o.id)" \
	" SELECT (SELECT count(*) FROM d)::int4 AS deleted," \
	"   (SELECT max(w.id) FROM w) AS walked"

/*
 * Relay claim: $1 int4 batch size, $2 int8 lease in ms, $3 uuid claim token,
 * $4 int8 the claimer the claim records (0: none), $5 int8 the claimer this
 * session holds (0: none; it holds one with takeover turned off too).
 * One message of an aggregate is in flight across all push sources
 * together, in created_at order; rows without an aggregate take part in no
 * ordering.  As the outbox claim (docs/design/claim.md, "The inbox: pull
 * and relay"), O(batch), whatever waits:
 *	- candidates: push rows whose lease expired or whose claimer is gone
 *	  (a takeover), then pending
 *	  unparked due push rows in due order, up to $1 together: a head
 *	  retried later is not walked, and parked rows are in neither index;
 *	- for each candidate with an aggregate, its nearest earlier open push
 *	  row (created_at, id) of that aggregate: none, the row is claimed;
 *	  one this statement can lock FOR SHARE and that is still open, the
 *	  row is parked (pending, hold 'aggregate'; a takeover loses its
 *	  expired claim), and the forward that ends the earlier row must wait
 *	  for that lock, so its promotion (QB_PG_RELAY_PROMOTE, a later
 *	  statement) sees the park; one locked by another transaction, the row
 *	  is left as it is, a candidate again next time.  Each candidate is
 *	  one row of blk, its decision read from it, and the decisions reach
 *	  the UPDATE as arrays of one aggregate, all made before its first
 *	  write (as the outbox claim's: no join of two CTEs and no search of
 *	  an array per row, both quadratic in the batch).
 * A dead row with hold 'dead' (its source's onDead: holdKey) is open for
 * its aggregate here and in the promotion, until it is requeued or skipped
 * (docs/design/claim.md, "A dead head that holds its key").
 * Nothing waits (SKIP LOCKED throughout).  Returns the claimed rows only,
 * each with its traceparent header (any letter case), for the forward's span.
 */
#define QB_PG_RELAY_CLAIM \
	"WITH c_lease AS MATERIALIZED (" \
	"   SELECT c.id, c.aggregate_id, c.created_at FROM queuebox.inbox c" \
	"   WHERE c.consumption = 'push' AND c.state = 'processing'" \
	"     AND (c.lease_until < now() OR c.claimer = ANY (" \
	QB_PG_CLAIMERS_GONE("queuebox.inbox g WHERE g.consumption = 'push' AND", "$5") "))" \
	"   ORDER BY c.lease_until LIMIT $1 FOR UPDATE SKIP LOCKED)," \
	" c_due AS MATERIALIZED (" \
	"   SELECT c.id, c.aggregate_id, c.created_at FROM queuebox.inbox c" \
	"   WHERE c.consumption = 'push' AND c.state = 'pending' AND c.hold IS NULL" \
	"     AND c.scheduled_at <= now()" \
	"   ORDER BY c.scheduled_at, c.created_at, c.id" \
	"   LIMIT greatest($1 - (SELECT count(*) FROM c_lease), 0) FOR UPDATE SKIP LOCKED)," \
	" cand AS (SELECT * FROM c_lease UNION ALL SELECT * FROM c_due)," \
	" blk AS MATERIALIZED (" \
	"   SELECT c.id AS cid, b.id AS bid FROM cand c" \
	"   LEFT JOIN LATERAL (" \
	"     SELECT e.id FROM queuebox.inbox e" \
	"     WHERE e.consumption = 'push' AND e.aggregate_id = c.aggregate_id" \
	"       AND (e.state IN ('pending', 'processing') OR e.hold = 'dead')" \
	"       AND (e.created_at, e.id) < (c.created_at, c.id)" \
	"     ORDER BY e.created_at DESC, e.id DESC LIMIT 1) b ON true)," \
	" lk AS MATERIALIZED (" \
	"   SELECT e.id FROM queuebox.inbox e" \
	"   WHERE e.id = ANY (ARRAY(SELECT bid FROM blk))" \
	"     AND (e.state IN ('pending', 'processing') OR e.hold = 'dead')" \
	"   FOR SHARE SKIP LOCKED)," \
	" dec AS (" \
	"   SELECT array_agg(b.cid) AS ids, array_agg(b.bid IS NULL) AS claims FROM blk b" \
	"   WHERE b.bid IS NULL OR b.bid = ANY (ARRAY(SELECT id FROM lk)))," \
	" u AS (" \
	"   UPDATE queuebox.inbox i" \
	"   SET state = CASE WHEN x.claim THEN 'processing' ELSE 'pending' END," \
	"       hold = CASE WHEN x.claim THEN NULL ELSE 'aggregate' END," \
	"       claim_token = CASE WHEN x.claim THEN $3::uuid END," \
	"       lease_until = CASE WHEN x.claim THEN now() + $2 * interval '1 millisecond' END," \
	"       claimer = CASE WHEN x.claim THEN nullif($4, 0) END" \
	"   FROM dec CROSS JOIN LATERAL unnest(dec.ids, dec.claims) AS x(id, claim)" \
	"   WHERE i.id = x.id" \
	"   RETURNING i.id, i.source, i.event_type, i.created_at, x.claim AS claimed," \
	"     (SELECT h.v FROM jsonb_each_text(i.headers) h(k, v)" \
	"      WHERE lower(h.k) = 'traceparent' LIMIT 1) AS traceparent)" \
	" SELECT u.id, u.source, u.event_type, u.created_at, u.traceparent FROM u WHERE u.claimed" \
	" ORDER BY u.created_at, u.id"

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
 * outbox default), $5 bool[] per row: its source's onDead is holdKey (NULL:
 * none is).  In one statement, so in one transaction: each claimed
 * row with a non-empty topic becomes an outbox row (QB_PG_INBOX_TO_OUTBOX)
 * and is marked processed; a row whose topic rendered empty is marked dead,
 * with hold 'dead' when it holds its aggregate (holdKey, and it has one).
 * Fenced by the token.  Returns one row: the inbox rows settled, the outbox
 * rows inserted.  The caller then runs QB_PG_RELAY_PROMOTE with the same
 * ids, in a later statement of the same transaction.  Each row is found by
 * its id: with "state = 'processing'" as it is, a plan made on an empty
 * inbox walked every open row through inbox_open_idx at each forward
 * (4,779 blocks for 50 rows with 71,000 in the inbox; 1,395 now, as with
 * statistics).
 */
#define QB_PG_RELAY_FORWARD \
	"WITH s AS (" \
	"   SELECT * FROM unnest($2::bigint[], $3::text[], $5::boolean[]) AS s(id, topic, holds)" \
	"   WHERE s.id IS NOT NULL)," \
	" c AS (" \
	"   SELECT i.*, s.topic AS out_topic, coalesce(s.holds, false) AS holds" \
	"   FROM queuebox.inbox i JOIN s ON s.id = i.id" \
	"   WHERE i.claim_token = $1 AND coalesce(i.state, '') = 'processing')," \
	" ins AS (" \
	"   " QB_PG_INBOX_TO_OUTBOX("$4") \
	"   RETURNING 1)," \
	" u AS (" \
	"   UPDATE queuebox.inbox i" \
	"   SET state = CASE WHEN c.out_topic <> '' THEN 'processed' ELSE 'dead' END," \
	"       hold = CASE WHEN c.out_topic = '' AND c.holds AND i.aggregate_id IS NOT NULL" \
	"                   THEN 'dead' END," \
	"       last_error = CASE WHEN c.out_topic <> '' THEN i.last_error" \
	"         ELSE 'the topic template rendered empty, so the message can reach no destination;" \
	" set eventTypePath or use {{ source }} in the topic, then requeue the row' END," \
	"       claim_token = NULL, lease_until = NULL, claimer = NULL" \
	"   FROM c WHERE i.id = c.id" \
	"   RETURNING 1)" \
	" SELECT (SELECT count(*) FROM u), (SELECT count(*) FROM ins)"

/*
 * Relay promote: $1 int8[] the inbox rows the forward just ended (processed
 * or dead), in a statement after it, so its snapshot sees every park made
 * while they were open (the claim parked them holding a FOR SHARE lock on
 * the ended row, which the forward's update waited for).  For each ended
 * row with an aggregate, two units may have been waiting on it:
 *	- the aggregate across push sources: its first open push row;
 *	- the row's (source, aggregate) for pull rows (a pull row waits for
 *	  earlier open rows of its source, push ones too): the first open row
 *	  of the source and aggregate, when it is a pull row.
 * A dead row holding its aggregate (hold 'dead') is its first open push
 * row: the promotion of its own forward finds it, not pending, and changes
 * nothing, so the rows behind it stay parked (onDead: holdKey).
 * Each such first row, when pending, is released (hold NULL).  A row that
 * looks unparked is updated too: if a claim is parking it at that moment
 * the update waits for it and releases the parked version.  Rows of the
 * first kind that are not first stay parked behind their own earlier row.
 * Returns the rows released.
 */
#define QB_PG_RELAY_PROMOTE \
	"WITH x AS (" \
	"   SELECT i.source, i.aggregate_id FROM queuebox.inbox i" \
	"   WHERE i.id = ANY ($1::bigint[]) AND i.aggregate_id IS NOT NULL" \
	"     AND i.state IN ('processed', 'dead'))," \
	" nx AS (" \
	"   SELECT (SELECT e.id FROM queuebox.inbox e" \
	"           WHERE e.consumption = 'push' AND e.aggregate_id = x.aggregate_id" \
	"             AND (e.state IN ('pending', 'processing') OR e.hold = 'dead')" \
	"           ORDER BY e.created_at, e.id LIMIT 1) AS id FROM x" \
	"   UNION ALL" \
	"   SELECT f.id FROM x CROSS JOIN LATERAL (" \
	"     SELECT e.id, e.consumption FROM queuebox.inbox e" \
	"     WHERE e.source = x.source AND e.aggregate_id = x.aggregate_id" \
	"       AND e.state IN ('pending', 'processing')" \
	"     ORDER BY e.created_at, e.id LIMIT 1) f" \
	"   WHERE f.consumption = 'pull')" \
	" UPDATE queuebox.inbox o SET hold = NULL" \
	/* by id: a plan made on an empty inbox walked inbox_open_idx (12,998 blocks, 2,005 now) */ \
	" WHERE o.id = ANY (ARRAY(SELECT id FROM nx WHERE id IS NOT NULL))" \
	"   AND coalesce(o.state, '') = 'pending'"

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
 * The named queries of QbStore.query_text, one per QbQuery (qb_pg_stmt.c
 * lists them in its order); parameters are text and cast here.  Each
 * returns one text value.
 */

/*
 * QB_PG_AS_ACTOR(n, expr): expr with queuebox_admin.actor set to $n for this
 * transaction, so the audit rows it writes name who asked (outbox_audit's
 * done_by default reads it).  The subquery runs first: a volatile target
 * list keeps the planner from pulling it up.
 */
#define QB_PG_AS_ACTOR(n, expr) \
	"SELECT " expr " FROM (SELECT set_config('queuebox_admin.actor', $" n "::text, true)) qb_actor"

/* the schema is there (both hosts' schemas have the function) */
#define QB_PG_Q_READY \
	"SELECT queuebox._schema_version()"

/* each count walks a partial index over the open states */
#define QB_PG_Q_GAUGES \
	"SELECT json_build_object(" \
	"  'outbox_pending', (SELECT count(*) FROM queuebox.outbox WHERE state = 'pending')," \
	"  'outbox_processing', (SELECT count(*) FROM queuebox.outbox WHERE state = 'processing')," \
	"  'outbox_oldest', coalesce((SELECT extract(epoch FROM now() - min(created_at))" \
	"                             FROM queuebox.outbox WHERE state = 'pending'), 0)," \
	"  'inbox_pending', (SELECT count(*) FROM queuebox.inbox WHERE state = 'pending')," \
	"  'inbox_processing', (SELECT count(*) FROM queuebox.inbox WHERE state = 'processing')," \
	"  'inbox_oldest', coalesce((SELECT extract(epoch FROM now() - min(created_at))" \
	"                            FROM queuebox.inbox WHERE state = 'pending'), 0)," \
	"  'circuits', (SELECT coalesce(json_object_agg(destination, state), '{}')" \
	"               FROM queuebox.destination_state))::text"

#define QB_PG_Q_DEAD_OUTBOX \
	"SELECT queuebox.dead_outbox($1::text, $2::text, $3::text, $4::text, $5::timestamptz," \
	"  $6::timestamptz, $7::bigint, coalesce($8::int, 100))::text"
#define QB_PG_Q_DEAD_INBOX \
	"SELECT queuebox.dead_inbox($1::text, $2::text, $3::text, $4::text, $5::text, $6::timestamptz," \
	"  $7::timestamptz, $8::bigint, coalesce($9::int, 100))::text"
#define QB_PG_Q_REPLAY_OUTBOX \
	QB_PG_AS_ACTOR("2", "json_build_object('id', queuebox.replay_outbox($1::bigint))::text")
#define QB_PG_Q_REQUEUE_OUTBOX \
	QB_PG_AS_ACTOR("2", "json_build_object('requeued', queuebox.requeue_outbox($1::bigint))::text")
#define QB_PG_Q_REPLAY_INBOX \
	QB_PG_AS_ACTOR("2", "json_build_object('id', queuebox.replay_inbox($1::bigint))::text")
#define QB_PG_Q_REQUEUE_INBOX \
	QB_PG_AS_ACTOR("2", "json_build_object('requeued', queuebox.requeue_inbox($1::bigint))::text")
#define QB_PG_Q_REPLAY_OUTBOX_BULK \
	QB_PG_AS_ACTOR("5", "json_build_object('replayed', queuebox.replay_outbox($1::text, $2::text," \
	"  $3::timestamptz, $4::timestamptz))::text")
#define QB_PG_Q_REQUEUE_OUTBOX_BULK \
	QB_PG_AS_ACTOR("4", "json_build_object('requeued', queuebox.requeue_outbox($1::text," \
	"  $2::timestamptz, $3::timestamptz))::text")
#define QB_PG_Q_REPLAY_INBOX_BULK \
	QB_PG_AS_ACTOR("5", "json_build_object('replayed', queuebox.replay_inbox($1::text, $2::text," \
	"  $3::timestamptz, $4::timestamptz))::text")
#define QB_PG_Q_REQUEUE_INBOX_BULK \
	QB_PG_AS_ACTOR("4", "json_build_object('requeued', queuebox.requeue_inbox($1::text," \
	"  $2::timestamptz, $3::timestamptz))::text")
#define QB_PG_Q_HELD_KEYS \
	"SELECT coalesce(json_agg(h ORDER BY h.key), '[]')::text FROM (" \
	"  SELECT * FROM queuebox.held_keys() LIMIT coalesce($1::int, 100)) h"
#define QB_PG_Q_SKIP_OUTBOX \
	QB_PG_AS_ACTOR("2", "json_build_object('skipped', queuebox.skip_outbox($1::bigint))::text")
#define QB_PG_Q_REQUEUE_OUTBOX_EDITED \
	QB_PG_AS_ACTOR("3", "json_build_object('requeued', queuebox.requeue_outbox($1::bigint, $2::jsonb))::text")
/* onDead: holdKey in the relay's aggregate order */
#define QB_PG_Q_HELD_AGGREGATES \
	"SELECT coalesce(json_agg(h ORDER BY h.aggregate_id), '[]')::text FROM (" \
	"  SELECT * FROM queuebox.held_aggregates() LIMIT coalesce($1::int, 100)) h"
#define QB_PG_Q_SKIP_INBOX \
	QB_PG_AS_ACTOR("2", "json_build_object('skipped', queuebox.skip_inbox($1::bigint))::text")
#define QB_PG_Q_REQUEUE_INBOX_EDITED \
	QB_PG_AS_ACTOR("3", "json_build_object('requeued', queuebox.requeue_inbox($1::bigint, $2::jsonb))::text")
#define QB_PG_Q_RESUME_DESTINATION \
	QB_PG_AS_ACTOR("2", "json_build_object('known', $1::text = ANY (queuebox._destination_names())," \
	"  'resumed', queuebox.resume_destination($1::text))::text")
#define QB_PG_Q_OUTBOX_ROW \
	"SELECT queuebox.outbox_row($1::bigint)::text"
#define QB_PG_Q_INBOX_ROW \
	"SELECT queuebox.inbox_row($1::bigint)::text"
#define QB_PG_Q_INBOX_LOOKUP \
	"SELECT queuebox.inbox_lookup($1::text, $2::text)::text"
/* an unknown name raises no_data_found: the route's 404 */
#define QB_PG_Q_PAUSE_DESTINATION \
	QB_PG_AS_ACTOR("3", "json_build_object('paused_until', queuebox.pause_destination($1::text," \
	"  now() + $2::int * interval '1 second'), 'known', true)::text")
#define QB_PG_Q_RESET_DESTINATION \
	QB_PG_AS_ACTOR("2", "json_build_object('known', $1::text = ANY (queuebox._destination_names())," \
	"  'reset', queuebox.reset_destination($1::text))::text")

/* the console's overview: the open and dead rows only, so sent rows are not read */
#define QB_PG_OVERVIEW_COUNTS(table) \
	"(SELECT json_build_object('pending', count(*) FILTER (WHERE state = 'pending')," \
	"   'processing', count(*) FILTER (WHERE state = 'processing')," \
	"   'dead', count(*) FILTER (WHERE state = 'dead')," \
	"   'oldest_pending_sec', coalesce(extract(epoch FROM now() - min(created_at)" \
	"                                  FILTER (WHERE state = 'pending')), 0))" \
	" FROM queuebox." table " WHERE state IN ('pending', 'processing', 'dead'))"
/*
 * Each destination's status and its pending rows by where they wait:
 * intake (new), retrying (an attempt failed, due at scheduled_at), parked
 * (behind an open row of its key), held (destination_status's), with the
 * oldest one's age; rows not routed yet count for their topic's route, as
 * destination_status counts them (route_of once per topic).
 */
#define QB_PG_Q_OVERVIEW \
	"SELECT json_build_object(" \
	"  'destinations', (SELECT coalesce(json_agg(d ORDER BY d.destination), '[]') FROM (" \
	"    SELECT s.*, coalesce(w.intake, 0) AS intake, coalesce(w.retrying, 0) AS retrying," \
	"           coalesce(w.parked, 0) AS parked," \
	"           coalesce(extract(epoch FROM now() - w.oldest), 0) AS oldest_pending_sec" \
	"    FROM queuebox.destination_status() s LEFT JOIN (" \
	"      SELECT coalesce(p.destination, queuebox.route_of(p.topic)) AS n, sum(p.intake)::bigint AS intake," \
	"             sum(p.retrying)::bigint AS retrying, sum(p.parked)::bigint AS parked, min(p.oldest) AS oldest" \
	"      FROM (SELECT destination, topic," \
	"              count(*) FILTER (WHERE hold = 'intake' OR (hold IS NULL AND destination IS NULL)) AS intake," \
	"              count(*) FILTER (WHERE hold IS NULL AND destination IS NOT NULL AND attempt > 0) AS retrying," \
	"              count(*) FILTER (WHERE hold = 'key') AS parked, min(created_at) AS oldest" \
	"            FROM queuebox.outbox WHERE state = 'pending' GROUP BY destination, topic) p" \
	"      GROUP BY 1) w ON w.n = s.destination) d)," \
	"  'outbox', " QB_PG_OVERVIEW_COUNTS("outbox") "," \
	"  'inbox', " QB_PG_OVERVIEW_COUNTS("inbox") ")::text"

/*
 * Replay, the rows to replay: $1 int8 one id (NULL: by filter), $2 text
 * state (NULL: any), $3 text source (NULL: any), $4 timestamptz since, $5
 * timestamptz until (NULL: open).  In created_at, id order; the caller
 * renders each row's topic from the current configuration.  One id and
 * the filters are two branches: a generic plan of "($1 IS NULL OR id =
 * $1)" cannot probe inbox_pkey, and read the whole inbox to replay one
 * row (the daemon's prepared statement; TAP 077).
 */
#define QB_PG_INBOX_REPLAY_FILTERS \
	"($2::text IS NULL OR i.state = $2)" \
	" AND ($3::text IS NULL OR i.source = $3)" \
	" AND ($4::timestamptz IS NULL OR i.created_at >= $4)" \
	" AND ($5::timestamptz IS NULL OR i.created_at < $5)"
#define QB_PG_INBOX_REPLAY_SELECT \
	"SELECT r.id, r.source, r.event_type FROM (" \
	"   SELECT i.id, i.source, i.event_type, i.created_at FROM queuebox.inbox i" \
	"   WHERE i.id = $1::bigint AND " QB_PG_INBOX_REPLAY_FILTERS \
	"   UNION ALL" \
	"   SELECT i.id, i.source, i.event_type, i.created_at FROM queuebox.inbox i" \
	"   WHERE $1::bigint IS NULL AND " QB_PG_INBOX_REPLAY_FILTERS ") r" \
	" ORDER BY r.created_at, r.id"

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

/* A setting of the session or (local) of the transaction, as SET does (libpq). */
#define QB_PG_SET_CONFIG \
	"SELECT set_config($1, $2, $3)"

/*
 * The destinations' limits across the daemon's replicas (QbStore.
 * limits_take; docs/delivery.md, "Limits"), three statements of one
 * transaction: QB_PG_LIMITS_ENSURE makes the bucket rows that are missing,
 * QB_PG_LIMITS_LOCK locks them in name order (so two takes never deadlock),
 * and QB_PG_LIMITS_TAKE, a statement of its own so that its snapshot is
 * taken once the locks are held, reads and writes what they guard: the
 * places every claimer holds are read after the last take that changed
 * them committed.  A place row's claimer is live while its session holds
 * the claimer's lock (alive_until NULL: the lock test of
 * QB_PG_CLAIMERS_GONE), or through a pooler until alive_until.
 *
 * Ensure: $1 text[] the destinations, $2 int4[] their bursts (a new
 * bucket is full).
 */
#define QB_PG_LIMITS_ENSURE \
	"INSERT INTO queuebox.destination_limit (destination, tokens, refilled_at)" \
	" SELECT i.d, i.b, statement_timestamp() FROM unnest($1::text[], $2::int4[]) AS i(d, b)" \
	" ON CONFLICT (destination) DO NOTHING"

/* Lock: $1 text[] the destinations. */
#define QB_PG_LIMITS_LOCK \
	"SELECT l.destination FROM queuebox.destination_limit l" \
	" WHERE l.destination = ANY ($1::text[]) ORDER BY l.destination FOR UPDATE"

/*
 * Take: $1 text[] the destinations, $2 text[] their perSecond (0: no rate
 * limit), $3 int4[] bursts, $4 int4[] maxConcurrent (0: none), $5 int4[]
 * the places this claimer holds in use, $6 int4[] the tokens it gives
 * back, $7 int4[] what it asks for, $8 int4[] the tokens it took before
 * and has not spent, $9 int8 the claimer, $10 int8 its lease in ms (0: its
 * session lock shows it alive).  One row per destination: what it got,
 * and in how many ms a token comes when tokens cut it (-1: places did, or
 * it got all).  The bucket is refilled on the database's clock
 * (statement_timestamp: the same for every row) up to burst less the
 * tokens the live claimers' rows count out: those rows were as they are
 * since the last take, which refilled the bucket too, so a token spent
 * late counts as taken when its claimer's take says it was spent
 * (qb_ratelimit.h).  The place rows of gone claimers are deleted.
 */
#define QB_PG_LIMITS_TAKE \
	"WITH i AS (" \
	"   SELECT * FROM unnest($1::text[], $2::text[]::float8[], $3::int4[], $4::int4[]," \
	"     $5::int4[], $6::int4[], $7::int4[], $8::int4[])" \
	"     AS i(destination, per_sec, burst, max_concurrent, held, give, want, tokens_out))," \
	" o AS (" \
	"   SELECT p.destination, coalesce(sum(p.held) FILTER (WHERE p.claimer <> $9), 0)::int AS held," \
	"     sum(p.tokens_out)::int AS tokens_out" \
	"   FROM queuebox.destination_limit_place p" \
	"   WHERE p.destination = ANY ($1::text[]) AND (p.held > 0 OR p.tokens_out > 0)" \
	"     AND (p.claimer = $9 OR CASE WHEN p.alive_until IS NULL" \
	"       THEN NOT pg_catalog.pg_try_advisory_xact_lock_shared(p.claimer)" \
	"       ELSE p.alive_until >= statement_timestamp() END)" \
	"   GROUP BY p.destination)," \
	" b AS (" \
	"   SELECT i.*, coalesce(o.held, 0) AS others_held," \
	"     CASE WHEN i.per_sec > 0 THEN least(i.burst::float8, i.give" \
	"       + least(greatest(0, i.burst - coalesce(o.tokens_out, 0))::float8, l.tokens" \
	"       + i.per_sec * greatest(0, extract(epoch FROM statement_timestamp() - l.refilled_at)::float8)))" \
	"     END AS tokens" \
	"   FROM i JOIN queuebox.destination_limit l ON l.destination = i.destination" \
	"   LEFT JOIN o ON o.destination = i.destination)," \
	" f AS (" \
	"   SELECT b.*, CASE WHEN b.max_concurrent > 0" \
	"       THEN b.max_concurrent - b.held - b.others_held END AS places" \
	"   FROM b)," \
	" g AS (" \
	"   SELECT f.*, greatest(0, least(f.want, coalesce(f.places, f.want)," \
	"       CASE WHEN f.per_sec > 0 THEN floor(f.tokens + 1e-9)::int ELSE f.want END)) AS got" \
	"   FROM f)," \
	" u AS (" \
	"   UPDATE queuebox.destination_limit l" \
	"   SET tokens = g.tokens - g.got, refilled_at = statement_timestamp()" \
	"   FROM g WHERE l.destination = g.destination AND g.per_sec > 0)," \
	" h AS (" \
	"   INSERT INTO queuebox.destination_limit_place AS p" \
	"     (destination, claimer, held, tokens_out, alive_until)" \
	"   SELECT g.destination, $9, CASE WHEN g.max_concurrent > 0 THEN g.held + g.got ELSE 0 END," \
	"     CASE WHEN g.per_sec > 0 THEN g.tokens_out + g.got ELSE 0 END," \
	"     CASE WHEN $10 > 0 THEN statement_timestamp() + $10 * interval '1 millisecond' END" \
	"   FROM g" \
	"   ON CONFLICT (destination, claimer) DO UPDATE" \
	"   SET held = excluded.held, tokens_out = excluded.tokens_out, alive_until = excluded.alive_until)," \
	" x AS (" \
	"   DELETE FROM queuebox.destination_limit_place p" \
	"   WHERE p.destination = ANY ($1::text[]) AND p.claimer <> $9" \
	"     AND CASE WHEN p.alive_until IS NULL" \
	"       THEN pg_catalog.pg_try_advisory_xact_lock_shared(p.claimer)" \
	"       ELSE p.alive_until < statement_timestamp() END)" \
	" SELECT g.destination, g.got," \
	"   CASE WHEN g.got < g.want AND g.per_sec > 0 AND (g.places IS NULL OR g.got < g.places)" \
	"     THEN greatest(0, ceil((1 - (g.tokens - g.got)) * 1000 / g.per_sec))::int ELSE -1 END" \
	" FROM g"

#endif							/* QB_SQL_PG_H */
