/*-------------------------------------------------------------------------
 * qb_store.h
 *	  The store interface: every way the engines touch the database.
 *
 * Wording (docs/design/claim.md):
 *	- A claim moves claimable pending rows to processing under a claim token
 *	  and a lease; a settle ends a claim (sent, retry, dead, release, route,
 *	  hold), fenced by the row's token so a stale worker changes nothing.
 *	- release puts a claimed row back to pending without spending an
 *	  attempt (a worker stops mid-batch); route records where the row goes
 *	  and puts it back (claimed early, or its destination full); hold parks
 *	  it until its destination takes rows again.
 *	- A cycle is one transaction: the settles, the circuit breakers they
 *	  move, the promotion of the next row of each key that ended, the claim.
 *	- A destination's circuit: closed (takes rows), open (rows held), half-
 *	  open (one probe row), disabled (410 Gone, until resumed); a Retry-After
 *	  pauses it.  An open or half-open circuit closes only on the success
 *	  of a request sent after it opened (the probe), not on an older one
 *	  settled late; the store compares on its own clock (QbDestTally).
 *	  The relay claims push inbox rows the same way; its forward
 *	  writes their outbox rows and settles them in one transaction.
 *	- A claimer: the store's session, named by an id whose session lock it
 *	  holds while it lives (QbStore.claimer).  A claim records it; the rows
 *	  of a claimer whose lock is free are taken over at once (takeover).
 *	- A limit take (QbStore.limits_take, the daemon's stores): the
 *	  destinations' limits of every replica on one database, kept in the
 *	  database (docs/delivery.md, "Limits"): each destination's token
 *	  bucket, and the maxConcurrent places each claimer holds; a gone
 *	  claimer's places are not counted.
 *
 * Transaction rules: each call is one short transaction, committed before
 * it returns; none spans a publish.  Errors come back as -1 with err, never
 * a longjmp.  Memory: the rows of outbox_cycle and relay_claim are malloc'd
 * (qb_outbox_rows_free, qb_relay_rows_free).
 *-------------------------------------------------------------------------
 */
#ifndef QB_STORE_H
#define QB_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define QB_UUID_LEN 36

typedef struct QbOutboxRow
{
	int64_t		id;
	char		message_id[QB_UUID_LEN + 1];
	char	   *topic;
	char	   *key;			/* NULL: takes part in no ordering */
	char	   *payload;		/* JSON text */
	size_t		payload_len;
	char	   *headers;		/* JSON object text */
	int			attempt;		/* attempts made before this claim */
	int			max_attempts;	/* the row's, or outbox.maxAttempts */
	double		created_epoch;	/* created_at in Unix seconds: for the latency metric */
	bool		claimed;		/* false: the claim parked it or moved it to ready */
	char	   *destination;	/* where an earlier claim routed it, or NULL */
	bool		in_intake;		/* read from intake: counts for the floor */
	bool		not_due;		/* claimed before its scheduled_at: route it back */
	bool		probe;			/* the half-open probe of its destination */
} QbOutboxRow;

/* A push inbox row the relay claimed: what the topic template needs. */
typedef struct QbRelayRow
{
	int64_t		id;
	char	   *source;
	char	   *event_type;		/* NULL: the message carries none */
	char	   *traceparent;	/* its traceparent header, NULL: none */
} QbRelayRow;

typedef enum QbSettleKind
{
	QB_SETTLE_SENT,
	QB_SETTLE_RETRY,
	QB_SETTLE_DEAD,
	QB_SETTLE_RELEASE,
	QB_SETTLE_ROUTE,
	QB_SETTLE_HOLD,
	QB_SETTLE_DEAD_HOLD			/* dead, and its key waits for it (onDead: holdKey) */
} QbSettleKind;

typedef struct QbSettle
{
	int64_t		id;
	const char *token;			/* the claim token the row was claimed with */
	QbSettleKind kind;
	int			attempt;		/* the row's attempt after this outcome */
	long		delay_ms;		/* RETRY: scheduled_at = now() + delay */
	const char *error;			/* last_error; NULL for SENT */
	const char *destination;	/* where the row was routed, or NULL */
	bool		unrouted;		/* the row had no destination when claimed */
	bool		fanout;			/* ... and was claimed whatever its key's
								 * order (a fan-out row, returned not_due):
								 * QB_PG_OUTBOX_PROMOTE_PAST after its end */
	const char *copies;			/* fan-out: a JSON array of the other
								 * destinations to copy the row to, or NULL */
} QbSettle;

typedef enum QbCircuit
{
	QB_CIRCUIT_CLOSED,
	QB_CIRCUIT_OPEN,
	QB_CIRCUIT_HALF_OPEN,
	QB_CIRCUIT_DISABLED
} QbCircuit;

/* What one cycle's settles did at one destination: for its breaker. */
typedef struct QbDestTally
{
	const char *destination;
	int			ok;				/* attempts that succeeded */
	int64_t		ok_sent_ago_us; /* how long before the tally was made the
								 * latest of them was sent (a monotonic
								 * duration): it closes an open circuit only
								 * when sent after the circuit opened */
	int			failed;			/* attempts that failed (a 410 included) */
	bool		gone;			/* one answered 410 Gone */
	long		retry_after_ms; /* the longest Retry-After, 0: none */
	const char *error;			/* the last failure's text */
	int			threshold;		/* circuitBreaker.failures */
	long		cooldown_ms;	/* circuitBreaker.cooldownMs */
} QbDestTally;

/* A destination whose circuit a cycle's breaker statement looked at. */
typedef struct QbDestChange
{
	char	   *destination;
	QbCircuit	old_state;
	QbCircuit	new_state;
	bool		paused;
} QbDestChange;

/* A destination that does not simply take rows now, as the claim saw it. */
typedef struct QbDestState
{
	char	   *destination;
	QbCircuit	state;
	int			failures;		/* consecutive failed attempts counted */
	bool		paused;			/* a Retry-After is in force */
	bool		probe;			/* this claim moved it half-open: send its probe */
} QbDestState;

/* What a cycle claims (QB_PG_OUTBOX_CLAIM's parameters). */
typedef struct QbClaimReq
{
	int			batch_size;		/* rows from unrouted intake and ready, in all */
	long		lease_ms;
	int			default_max_attempts;
	const char *token;
	int64_t		floor;			/* unrouted intake ids above this only */
	const char *const *dests;	/* routed and intake rows of these destinations ... */
	const int  *limits;			/* ... at most this many each */
	const int64_t *floors;		/* ... intake ids above this only */
	int			ndests;
	long		probe_ms;		/* how long a half-open probe may take */
	bool		read_states;	/* read the circuits too (a store may skip it otherwise) */
	bool		promoted_only;	/* only the rows the cycle's promotion releases
								 * (a store may claim more) */
} QbClaimReq;

/* What a cycle returns; free with qb_cycle_out_free(). */
typedef struct QbCycleOut
{
	int			nsettled;		/* rows the settles changed (fenced ones not) */
	QbDestChange *changes;
	int			nchanges;
	QbDestState *states;		/* only when a claim ran */
	int			nstates;
	QbOutboxRow *rows;			/* claimed, parked and moved rows */
	int			nrows;
} QbCycleOut;

/*
 * The arguments of one outbox_cycle call, as a store hands them to the
 * body of its transaction skeleton.
 */
typedef struct QbCycleCall
{
	const QbDestTally *tallies;
	int			ntallies;
	const QbSettle *settles;
	int			nsettles;
	const QbClaimReq *claim;
	QbCycleOut *out;
} QbCycleCall;

/*
 * One destination's part of a limit take (QbStore.limits_take).  held and
 * give say where this claimer stands since its last take; want is what it
 * asks for now: as many tokens and as many places.
 */
typedef struct QbLimitTake
{
	const char *destination;
	double		per_sec;		/* rateLimit.perSecond; 0: no rate limit */
	int			burst;
	int			max_concurrent; /* 0: none */
	int			held;			/* the places this claimer holds now, in use */
	int			out;			/* tokens it took before and has not spent yet */
	int			give;			/* tokens taken before and not used: back to the bucket */
	int			want;
	int			got;			/* out: tokens and places given, 0..want */
	long		wait_ms;		/* out, when got < want: in how many ms a token
								 * comes; -1: a place is missing */
} QbLimitTake;

/* One received message for inbox_insert; strings borrowed from the caller. */
typedef struct QbInboxRow
{
	const char *source;
	const char *idempotency_key;
	const char *event_type;		/* NULL when the source has none */
	const char *aggregate_id;	/* NULL: takes part in no ordering */
	const char *payload;		/* JSON text */
	const char *headers;		/* JSON object text */
	bool		pull;			/* consumption pull (else push) */
	const char *dead_error;		/* NULL: pending; else stored dead with this last_error */
} QbInboxRow;

/*
 * The queries of query_text, and the text parameters each takes.  The
 * admin routes' writes take last the actor, who asked ("admin route from
 * 127.0.0.1"): the store records it as the done_by of the audit rows the
 * operation writes (queuebox_admin.actor on PostgreSQL, SESSION_CONTEXT on SQL
 * Server), else the database role.
 */
typedef enum QbQuery
{
	QB_Q_READY,					/* () */
	QB_Q_GAUGES,				/* () -> {"outbox_pending": .., ..., "circuits": {name: state}} */
	QB_Q_DEAD_OUTBOX,			/* (destination, topic, key, error, since, until, after,
								 * limit) -> {"rows": [rows], "next_after": id|null} */
	QB_Q_DEAD_INBOX,			/* (source, event_type, idempotency_key, aggregate_id,
								 * error, since, until, after, limit) -> the same */
	QB_Q_REPLAY_OUTBOX,			/* (id, actor) -> {"id": new id | null} */
	QB_Q_REQUEUE_OUTBOX,		/* (id, actor) -> {"requeued": bool} */
	QB_Q_REPLAY_INBOX,			/* (id, actor) -> {"id": new outbox id} */
	QB_Q_REQUEUE_INBOX,			/* (id, actor) -> {"requeued": bool} */
	QB_Q_REPLAY_OUTBOX_BULK,	/* (state, topicPattern, since, until, actor) -> {"replayed": n} */
	QB_Q_REQUEUE_OUTBOX_BULK,	/* (topicPattern, since, until, actor) -> {"requeued": n} */
	QB_Q_REPLAY_INBOX_BULK,		/* (state, source, since, until, actor) -> {"replayed": n} */
	QB_Q_REQUEUE_INBOX_BULK,	/* (source, since, until, actor) -> {"requeued": n} */
	QB_Q_RESUME_DESTINATION,	/* (name, actor) -> {"resumed": bool, "known": bool} */
	QB_Q_HELD_KEYS,				/* (limit) -> [held_keys() rows] */
	QB_Q_SKIP_OUTBOX,			/* (id, actor) -> {"skipped": bool} */
	QB_Q_REQUEUE_OUTBOX_EDITED, /* (id, payload JSON text, actor) -> {"requeued": bool} */
	QB_Q_OVERVIEW,				/* () -> {"destinations": [destination_status rows
								 * + intake, retrying, parked, oldest_pending_sec],
								 * "outbox"|"inbox": {"pending", "processing", "dead",
								 * "oldest_pending_sec"}} */
	/* onDead: holdKey in the relay's aggregate order (the inbox's) */
	QB_Q_HELD_AGGREGATES,		/* (limit) -> [held_aggregates() rows] */
	QB_Q_SKIP_INBOX,			/* (id, actor) -> {"skipped": bool} */
	QB_Q_REQUEUE_INBOX_EDITED,	/* (id, payload JSON text, actor) -> {"requeued": bool} */
	QB_Q_OUTBOX_ROW,			/* (id) -> outbox_row(id), NULL when none */
	QB_Q_INBOX_ROW,				/* (id) -> inbox_row(id), NULL when none */
	QB_Q_INBOX_LOOKUP,			/* (source, idempotency_key) -> inbox_row, NULL when none */
	QB_Q_PAUSE_DESTINATION,		/* (name, seconds, actor) -> {"paused_until": ts,
								 * "known": true}; not found for an unknown name */
	QB_Q_RESET_DESTINATION,		/* (name, actor) -> {"reset": bool, "known": bool} */
	QB_NQUERIES
} QbQuery;

#define QB_QUERY_BAD_INPUT (-2)
#define QB_QUERY_NOT_FOUND (-3)	/* the row named by id does not exist */

typedef struct QbStore
{
	void	   *ctx;

	/* The raw configuration document, malloc'd, or NULL when none is stored. */
	int			(*config_load) (void *ctx, char **text, char *err, size_t errlen);

	/*
	 * One cycle, one transaction: the tallies into the circuit breakers,
	 * the settles, the promotion of the keys that ended, then (claim not
	 * NULL) the destination states and the claim.  On -1 nothing of it is
	 * committed: the settled rows stay processing until their lease ends.
	 */
	int			(*outbox_cycle) (void *ctx, const QbDestTally *tallies, int ntallies,
								 const QbSettle *settles, int nsettles,
								 const QbClaimReq *claim, QbCycleOut *out,
								 char *err, size_t errlen);
	/* rows held for these destinations (taking rows again) become claimable */
	int			(*outbox_unpark) (void *ctx, const char *const *dests, int n, int limit,
								  int *nmoved, char *err, size_t errlen);
	/* rows routed to a destination not among these are routed again */
	int			(*outbox_unroute) (void *ctx, const char *const *dests, int n,
								   int *nmoved, char *err, size_t errlen);
	/* processing rows whose lease expired go back to pending */
	int			(*outbox_reclaim) (void *ctx, int limit, int *nreclaimed,
								   char *err, size_t errlen);
	/*
	 * Delete up to limit sent rows created more than retention_sec ago.  A
	 * store that walks the rows in id order starts after *after_id (0: from
	 * the start) and sets it to the highest id its walk took, which the
	 * engine passes to the next batch of the same run; one that needs no
	 * floor leaves it as it is.
	 */
	int			(*outbox_retention) (void *ctx, long retention_sec, int limit,
									 int64_t *after_id, int *ndeleted,
									 char *err, size_t errlen);
	/*
	 * Rows parked behind a key none of whose earlier rows is open (their
	 * promotion was missed) become claimable: up to limit keys that have
	 * parked rows, in key order from after ("": the first).  *next is the
	 * key the next sweep starts at (malloc'd), or NULL when this one
	 * reached the last key.
	 */
	int			(*outbox_sweep) (void *ctx, const char *after, int limit, int *nreleased,
								 char **next, char *err, size_t errlen);

	/*
	 * Store received messages in one transaction, committed before return:
	 * ids[i] is the new row's id, or 0 when (source, idempotency_key)
	 * already existed (a duplicate, also of an earlier row of the same
	 * call).  The statement may take at most timeout_ms; -1 with err when it
	 * fails, and then nothing of the call is stored.
	 */
	int			(*inbox_insert) (void *ctx, const QbInboxRow *rows, int n,
								 long timeout_ms, int64_t *ids,
								 char *err, size_t errlen);

	/*
	 * One named query (QbQuery) with text parameters (NULL for SQL NULL),
	 * returning one text value, in a transaction of its own: readiness, the
	 * metrics gauges and the admin operations.  Each store has its own text
	 * for each query.  *out is malloc'd, or NULL for no row or SQL NULL.
	 * Returns 0, -1 when the database failed, QB_QUERY_BAD_INPUT when it
	 * refused a parameter (a malformed timestamp, an unknown state), or
	 * QB_QUERY_NOT_FOUND when the operation raised "no data found".
	 */
	int			(*query_text) (void *ctx, QbQuery query, const char *const *params,
							   long timeout_ms, char **out, char *err, size_t errlen);

	/*
	 * Takeover (docs/operations.md, "After a crash"): on, this store's
	 * claims from now on record it as their claimer, whose liveness the
	 * database sees (a session lock held for as long as its session lives),
	 * so a peer takes them over at once when it is gone; off, they record
	 * none and are taken over when their lease ends.  A store that cannot
	 * show liveness (a connection through a pooler in transaction mode)
	 * records none and returns 0.  NULL: no claimer, ever.
	 */
	int			(*claimer) (void *ctx, bool on, char *err, size_t errlen);

	/*
	 * The destinations' limits across every replica on this database, in
	 * one transaction: for each take, the bucket is refilled on the
	 * database's clock and given back give tokens, then up to want tokens
	 * and places are taken (places: maxConcurrent less those every other
	 * live claimer holds, less held); this claimer's places become held +
	 * got.  A claimer is live while its session lock is held (lease_ms 0
	 * when it has one), else, through a pooler, for lease_ms after its
	 * take.  On -1 nothing changed.  NULL: the store has no shared limits
	 * (the extension: one server, its shared memory).
	 */
	int			(*limits_take) (void *ctx, QbLimitTake *takes, int n, long lease_ms,
								char *err, size_t errlen);

	/* claim up to batch_size push inbox rows under token with a lease */
	int			(*relay_claim) (void *ctx, int batch_size, long lease_ms,
								const char *token, QbRelayRow **rows, int *nrows,
								char *err, size_t errlen);

	/*
	 * Forward claimed rows: topics[i] is the rendered topic of ids[i] ("" :
	 * dead); holds[i]: a dead ids[i] keeps its aggregate's later rows
	 * behind it (its source's onDead: holdKey; holds NULL: none does).  One
	 * transaction.  *nsettled is the inbox rows settled (fewer than n when
	 * a lease was taken over), *ninserted the outbox rows.
	 */
	int			(*relay_forward) (void *ctx, const char *token, const int64_t *ids,
								  const char *const *topics, const bool *holds,
								  int n, int max_attempts,
								  int *nsettled, int *ninserted,
								  char *err, size_t errlen);
} QbStore;

/* QbStore's functions: each must be set (qb_ops.h; qb_engine_tables_check) */
#define QB_STORE_OPS(X, T) X(T, config_load) X(T, outbox_cycle) X(T, outbox_unpark) \
	X(T, outbox_unroute) X(T, outbox_reclaim) X(T, outbox_sweep) X(T, outbox_retention) X(T, inbox_insert) \
	X(T, query_text) X(T, relay_claim) X(T, relay_forward)
#define QB_STORE_OPS_OPTIONAL(X, T) X(T, claimer) X(T, limits_take)

extern void qb_outbox_rows_free(QbOutboxRow *rows, int n);
extern void qb_outbox_rows_free_one(QbOutboxRow *row);
extern void qb_cycle_out_free(QbCycleOut *out);

/* "closed", "open", "half-open", "disabled" and back (unknown: closed) */
extern const char *qb_circuit_name(QbCircuit c);
extern QbCircuit qb_circuit_parse(const char *name);
extern void qb_relay_rows_free(QbRelayRow *rows, int n);

/* A settle's outcome as QB_PG_OUTBOX_SETTLE names it: "sent", "retry", ... */
extern const char *qb_settle_kind_name(QbSettleKind k);

/* a fan-out row among the settles: the store runs QB_PG_OUTBOX_PROMOTE_PAST */
extern bool qb_settles_fanout(const QbSettle *st, int n);

/* a store's answer for destination dest into the take of that name; false: none has it */
extern bool qb_limit_take_answer(QbLimitTake *takes, int n, const char *dest,
								 long long got, long wait_ms);

/* A random (version 4) UUID in canonical text form, from OpenSSL RAND_bytes. */
extern bool qb_uuid_v4(char out[QB_UUID_LEN + 1]);

/*
 * A claimer id: random, positive, not 0 (0 stands for none); 0 when no
 * random bytes could be had.
 */
extern int64_t qb_claimer_id(void);

/*
 * qb_store_takeover asks store for takeover on or off (QbStore.claimer,
 * when it has one) and logs a warning on the host when it failed: the
 * claims then record no claimer until the next call.
 */
struct QbHost;
extern void qb_store_takeover(const struct QbHost *host, const QbStore *store, bool on);

/*
 * What a store's failed query_text statement means to its caller, from the
 * statement's SQLSTATE (five characters; PostgreSQL, libpq and ODBC all
 * report them): QB_QUERY_NOT_FOUND for "no data found" (P0002, the row an
 * operation names does not exist), QB_QUERY_BAD_INPUT for an error the
 * caller's parameters caused (class 22 data exception, class 23 integrity
 * constraint violation), else -1 (the database failed).
 */
extern int	qb_query_failure(const char *sqlstate);

/*
 * What a cycle's claim asks for once its promotion claimed rows (the rows
 * promoted first, QB_PG_OUTBOX_PROMOTE): each destination only the room
 * they left it, the unrouted places what is left of the batch.  *req is
 * claim with batch_size lowered and limits pointing at limits[] (ndests
 * elements, the caller's), lowered per destination.
 */
extern void qb_claim_left(const QbClaimReq *claim, const QbOutboxRow *rows, int nrows,
						  QbClaimReq *req, int *limits);

/*
 * The inbox insert's answer, row by row: a stored row (id, source, key) is
 * the first request of rows[] with that source and idempotency key whose
 * ids[] is still 0.  Returns its index, or -1.
 */
extern int	qb_inbox_match(const QbInboxRow *rows, int n, int64_t *ids, int64_t id,
						   const char *source, const char *key);

#endif							/* QB_STORE_H */
