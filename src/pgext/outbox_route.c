/*-------------------------------------------------------------------------
 * outbox_route.c
 *	  Routing at insert: the routes the workers publish in shared memory,
 *	  and the outbox_route trigger that reads them (docs/design/claim.md,
 *	  "Routed at insert"); the same trigger parks a row whose key has an
 *	  earlier open row (outbox_park.c, "Parked at insert").
 *
 * Wording:
 *	- the published routes (QbRouteTable in QbShared): the topic patterns
 *	  and destinations of the configuration a worker loaded last.
 *	  nroutes < 0: none usable (no document, or routes that do not fit);
 *	  the trigger then routes nothing.
 *	- a backend's copy: what the trigger matches against, refreshed when
 *	  the table's generation moved.
 *
 * Concurrency: a seqlock.  A publisher (a worker at each configuration
 * load, a configure() at commit; unchanged routes are not written) makes
 * the generation odd with a compare-and-swap, writes, and makes it even.
 * A reader keeps its copy only when it saw the same even generation before
 * and after; after QBR_READ_TRIES it routes nothing this row (the claim
 * routes it).  No lock is held, nothing waits on a backend.  A route change
 * applies to rows inserted after the workers loaded it.
 *-------------------------------------------------------------------------
 */
#include "postgres.h"
#include "pg_compat.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "commands/trigger.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "tcop/tcopprot.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/rel.h"

#include "qb_pg.h"
#include "qb_route.h"
#include "qb_trace.h"

PG_FUNCTION_INFO_V1(qb_sql_route_outbox);

/* a reader's spins while a publisher writes (microseconds), then it gives up */
#define QBR_READ_TRIES 10000
/* a publisher's waits of 100 us for another publisher (1 s), then it gives up */
#define QBR_PUBLISH_TRIES 10000

/* A backend's copy of the published routes. */
static QbPublishedRoute *qbor_copy = NULL;
static int	qbor_ncopy = -1;
static uint64 qbor_copy_gen = 0;

/* The outbox's attribute numbers, checked against its row type each time. */
static int	qbor_att_topic = 0;
static int	qbor_att_destination = 0;
static int	qbor_att_hold = 0;
static int	qbor_att_id = 0;
static int	qbor_att_key = 0;
static int	qbor_att_headers = 0;
static int	qbor_att_state = 0;
static int	qbor_att_origin = 0;	/* 0: a schema before 0.3.8 */

/*
 * The trace context of the statement being run, from its sqlcommenter
 * comment: looked up once per top-level statement (its start time and
 * text), not once per row of a many-row INSERT or COPY.
 */
static TimestampTz qbor_trace_stmt = 0;
static const char *qbor_trace_query = NULL;
static bool qbor_trace_found = false;
static char qbor_trace_tp[QB_TRACEPARENT_LEN + 1];
static char qbor_trace_ts[QB_TRACESTATE_MAX + 1];

/*
 * Routes staged for a publish: a worker's load, or a configure() whose
 * transaction has not committed yet.  staged_n: -1 none usable, -2
 * nothing staged.
 */
static QbPublishedRoute qbor_staged[QB_ROUTES_MAX];
static int	qbor_staged_n = -2;

/*
 * qbor_stage copies cfg's routes (NULL: no document) into the staging area;
 * -1 when they do not fit (more than QB_ROUTES_MAX, or a name too long).
 */
static int
qbor_stage(const QbConfig *cfg)
{
	if (cfg == NULL || cfg->nroutes > QB_ROUTES_MAX)
		return qbor_staged_n = -1;
	for (int i = 0; i < cfg->nroutes; i++)
	{
		if (strlen(cfg->routes[i].topic_pattern) >= QB_ROUTE_PATTERN_MAX ||
			strlen(cfg->routes[i].destination) >= QB_ROUTE_DEST_MAX)
			return qbor_staged_n = -1;
		/* zeroed first: the table is compared with memcmp */
		memset(&qbor_staged[i], 0, sizeof(QbPublishedRoute));
		strlcpy(qbor_staged[i].pattern, cfg->routes[i].topic_pattern, QB_ROUTE_PATTERN_MAX);
		/* fan-out: "", the row is left unrouted and copied at its first claim */
		if (cfg->routes[i].ndests == 1)
			strlcpy(qbor_staged[i].destination, cfg->routes[i].destination, QB_ROUTE_DEST_MAX);
	}
	return qbor_staged_n = cfg->nroutes;
}

/* qbor_holds: the shared table holds the staged routes already. */
static bool
qbor_holds(const QbRouteTable *t, int n)
{
	return t->database == MyDatabaseId && t->nroutes == n &&
		(n <= 0 || memcmp(t->routes, qbor_staged, sizeof(QbPublishedRoute) * n) == 0);
}

/*
 * qbor_publish writes the staged routes into the shared table unless it
 * holds them already (most loads: every worker loads every document), which
 * it checks first as a reader, without making the generation odd.  Raises
 * no error: it also runs in the commit callback.
 */
static void
qbor_publish(void)
{
	QbRouteTable *t = &qb_shared->routes;
	int			n = qbor_staged_n;
	uint64		gen = pg_atomic_read_u64(&t->generation);

	if (gen % 2 == 0)
	{
		bool		same;

		pg_read_barrier();
		same = qbor_holds(t, n);
		pg_read_barrier();
		if (same && pg_atomic_read_u64(&t->generation) == gen)
			return;
	}
	for (int tries = 0;; tries++)
	{
		gen = pg_atomic_read_u64(&t->generation);
		if (gen % 2 == 0 && pg_atomic_compare_exchange_u64(&t->generation, &gen, gen + 1))
			break;
		/* another publisher writes for microseconds; never wait without end */
		if (tries >= QBR_PUBLISH_TRIES)
			return;
		pg_usleep(100L);
	}
	/* the compare-and-swap is a full barrier: the writes below follow it */
	if (qbor_holds(t, n))
	{
		pg_atomic_write_u64(&t->generation, gen);	/* a publisher before us wrote them */
		return;
	}
	t->database = MyDatabaseId;
	t->nroutes = n;
	if (n > 0)
		memcpy(t->routes, qbor_staged, sizeof(QbPublishedRoute) * n);
	pg_write_barrier();
	pg_atomic_write_u64(&t->generation, gen + 2);
}

/*
 * qb_publish_routes: a worker loaded cfg (NULL: no document stored).  Its
 * routes become the ones new rows are routed by.  Returns false when they
 * do not fit: rows are then routed at their claim.
 */
bool
qb_publish_routes(const QbConfig *cfg)
{
	int			n = qbor_stage(cfg);

	if (qb_shared != NULL)
		qbor_publish();
	qbor_staged_n = -2;
	return cfg == NULL || n >= 0;
}

/*
 * qb_stage_routes: configure() stored cfg in the database the workers
 * serve; its routes are published when the transaction commits
 * (qb_publish_staged_routes), so rows inserted after the commit are routed
 * by them even before a worker has loaded the document.  unknown: a
 * savepoint rolled back over a configure(), so what commits is not known
 * here; nothing is published and the workers publish at their load.
 */
void
qb_stage_routes(const QbConfig *cfg, bool unknown)
{
	if (unknown)
		qbor_staged_n = -2;
	else
		(void) qbor_stage(cfg);
}

/* qb_publish_staged_routes: at commit (queuebox.c's callback). */
void
qb_publish_staged_routes(void)
{
	if (qbor_staged_n != -2 && qb_shared != NULL)
		qbor_publish();
	qbor_staged_n = -2;
}

/* qb_clear_staged_routes: the transaction ended without a commit. */
void
qb_clear_staged_routes(void)
{
	qbor_staged_n = -2;
}

/*
 * qbor_refresh: the backend's copy is the published table as of now, or
 * false when it could not be read (a publisher kept writing): route
 * nothing this time.
 */
static bool
qbor_refresh(void)
{
	QbRouteTable *t = &qb_shared->routes;

	if (qbor_copy == NULL)
	{
		qbor_copy = malloc(sizeof(QbPublishedRoute) * QB_ROUTES_MAX);
		if (qbor_copy == NULL)
			return false;
	}
	for (int tries = 0; tries < QBR_READ_TRIES; tries++)
	{
		uint64		g1 = pg_atomic_read_u64(&t->generation);
		int			n;

		if (g1 == qbor_copy_gen)
			return true;
		if (g1 % 2 == 1)
		{
			pg_spin_delay();
			continue;
		}
		pg_read_barrier();
		n = t->database == MyDatabaseId ? t->nroutes : -1;
		if (n > 0)
			memcpy(qbor_copy, t->routes, sizeof(QbPublishedRoute) * n);
		pg_read_barrier();
		if (pg_atomic_read_u64(&t->generation) == g1)
		{
			qbor_ncopy = n;
			qbor_copy_gen = g1;
			return true;
		}
	}
	return false;
}

/* qbor_is: attribute attnum of desc is the live column name. */
static bool
qbor_is(TupleDesc desc, int attnum, const char *name)
{
	Form_pg_attribute a;

	if (attnum < 1 || attnum > desc->natts)
		return false;
	a = TupleDescAttr(desc, attnum - 1);
	return !a->attisdropped && strcmp(NameStr(a->attname), name) == 0;
}

/*
 * qbor_attnums finds topic, destination, hold, id, key, headers and state
 * in the outbox's row type.  The numbers found last are checked first
 * (seven name compares): a column dropped and added again by an upgrade
 * moves them.
 */
static bool
qbor_attnums(Relation rel)
{
	TupleDesc	desc = RelationGetDescr(rel);

	if (qbor_is(desc, qbor_att_topic, "topic") && qbor_is(desc, qbor_att_destination, "destination") &&
		qbor_is(desc, qbor_att_hold, "hold") && qbor_is(desc, qbor_att_id, "id") &&
		qbor_is(desc, qbor_att_key, "key") && qbor_is(desc, qbor_att_headers, "headers") &&
		qbor_is(desc, qbor_att_state, "state"))
		return true;
	qbor_att_topic = qbor_att_destination = qbor_att_hold = qbor_att_id = qbor_att_key = 0;
	qbor_att_headers = qbor_att_state = qbor_att_origin = 0;
	for (int i = 1; i <= desc->natts; i++)
	{
		if (qbor_is(desc, i, "topic"))
			qbor_att_topic = i;
		else if (qbor_is(desc, i, "destination"))
			qbor_att_destination = i;
		else if (qbor_is(desc, i, "origin"))
			qbor_att_origin = i;
		else if (qbor_is(desc, i, "hold"))
			qbor_att_hold = i;
		else if (qbor_is(desc, i, "id"))
			qbor_att_id = i;
		else if (qbor_is(desc, i, "key"))
			qbor_att_key = i;
		else if (qbor_is(desc, i, "headers"))
			qbor_att_headers = i;
		else if (qbor_is(desc, i, "state"))
			qbor_att_state = i;
	}
	return qbor_att_topic != 0 && qbor_att_destination != 0 && qbor_att_hold != 0 &&
		qbor_att_id != 0 && qbor_att_key != 0 && qbor_att_headers != 0 && qbor_att_state != 0;
}

/* qbor_text_or_null: a text column of tup as a C string, or NULL. */
static const char *
qbor_text_or_null(HeapTuple tup, TupleDesc desc, int attnum)
{
	bool		isnull;
	Datum		d = heap_getattr(tup, attnum, desc, &isnull);

	return isnull ? NULL : TextDatumGetCString(d);
}

/*
 * qbor_route: the destination of the first published route topic matches,
 * or NULL; *fanout says that route has several destinations.
 */
static const char *
qbor_route(HeapTuple tup, TupleDesc desc, bool *fanout)
{
	bool		isnull;
	Datum		topic;
	char	   *t;
	const char *dest = NULL;

	if (!qbor_refresh() || qbor_ncopy <= 0)
		return NULL;
	topic = heap_getattr(tup, qbor_att_topic, desc, &isnull);
	if (isnull)
		return NULL;			/* the NOT NULL constraint says why */
	t = TextDatumGetCString(topic);
	for (int i = 0; i < qbor_ncopy; i++)
		if (qb_topic_match(qbor_copy[i].pattern, t))
		{
			/* first match wins; "" is a fan-out route: copied at its claim */
			if (qbor_copy[i].destination[0] != '\0')
				dest = qbor_copy[i].destination;
			else
				*fanout = true;
			break;
		}
	pfree(t);
	return dest;
}

/*
 * qbor_trace: the headers with the trace context a row inserted now takes
 * (docs/observability.md, "Trace context"), or 0 when they stay as they
 * are: the row's own traceparent header wins; then queuebox.traceparent
 * (SET LOCAL); then a sqlcommenter comment in the inserting statement.
 */
static Datum
qbor_trace(HeapTuple tup, TupleDesc desc)
{
	const char *tp = NULL;
	const char *ts = "";
	bool		isnull;
	Datum		headers;
	char		add[QB_TRACEPARENT_LEN + QB_TRACESTATE_MAX + 48];

	if (qb_traceparent != NULL && qb_traceparent[0] != '\0')
	{
		tp = qb_traceparent;	/* its check hook parsed it */
		ts = qb_tracestate != NULL ? qb_tracestate : "";
	}
	else
	{
		if (GetCurrentStatementStartTimestamp() != qbor_trace_stmt || debug_query_string != qbor_trace_query)
		{
			qbor_trace_stmt = GetCurrentStatementStartTimestamp();
			qbor_trace_query = debug_query_string;
			qbor_trace_found = qb_trace_from_sql(debug_query_string, qbor_trace_tp, qbor_trace_ts);
		}
		if (qbor_trace_found)
		{
			tp = qbor_trace_tp;
			ts = qbor_trace_ts;
		}
	}
	if (tp == NULL)
		return (Datum) 0;
	headers = heap_getattr(tup, qbor_att_headers, desc, &isnull);
	if (isnull || DatumGetBool(DirectFunctionCall2(jsonb_exists, headers,
												   CStringGetTextDatum("traceparent"))))
		return (Datum) 0;		/* NOT NULL says why; or the row's own wins */
	/* both values are checked: no character needs escaping */
	if (ts[0] != '\0')
		snprintf(add, sizeof(add), "{\"traceparent\": \"%s\", \"tracestate\": \"%s\"}", tp, ts);
	else
		snprintf(add, sizeof(add), "{\"traceparent\": \"%s\"}", tp);
	return DirectFunctionCall2(jsonb_concat, headers, DirectFunctionCall1(jsonb_in, CStringGetDatum(add)));
}

/* qbor_changed: tup with its n columns cols set to values (none null), as the trigger's result. */
static Datum
qbor_changed(HeapTuple tup, TupleDesc desc, int n, int *cols, Datum *values)
{
	bool		nulls[3] = {false, false, false};

	Assert(n <= lengthof(nulls));
	return PointerGetDatum(n == 0 ? tup : heap_modify_tuple_by_cols(tup, desc, n, cols, values, nulls));
}

/*
 * qbor_note_unparked: a new row with this id is left unparked, claimable
 * from its insert: wake a worker at commit, and report its id for the
 * workers' intake floors (the late-commit report, claim.md).
 */
static void
qbor_note_unparked(Datum id, bool id_null)
{
	qb_note_outbox_first_id(id_null ? -1 : DatumGetInt64(id) - 1);
	qb_note_outbox_row(false);
}

/*
 * BEFORE INSERT FOR EACH ROW on queuebox.outbox: a row takes the trace
 * context of its transaction or statement (qbor_trace); then, for a row
 * inserted without a hold, one with no destination gets its topic's
 * destination; then a
 * keyed row whose key has an earlier open row is parked (hold 'key',
 * outbox_park.c), and a routed row that is not goes to its destination's
 * intake (hold 'intake').  A row no published route matches (or inserted
 * before any worker published) is left unrouted: the claim routes it, or
 * gives it its "no route" outcome.
 */
Datum
qb_sql_route_outbox(PG_FUNCTION_ARGS)
{
	TriggerData *td = (TriggerData *) fcinfo->context;
	HeapTuple	tup;
	TupleDesc	desc;
	bool		isnull;
	bool		no_dest;
	bool		parked;
	const char *dest = NULL;
	Datum		id;
	bool		id_null;
	Datum		key;
	Datum		traced;
	bool		fanout = false;
	int			cols[3];
	Datum		values[3];
	int			n = 0;
	QbParkAtts	atts;

	if (!CALLED_AS_TRIGGER(fcinfo) || !TRIGGER_FIRED_BEFORE(td->tg_event) ||
		!TRIGGER_FIRED_FOR_ROW(td->tg_event) || !TRIGGER_FIRED_BY_INSERT(td->tg_event))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("queuebox._route_outbox() must be called as a BEFORE INSERT FOR EACH ROW trigger")));
	tup = td->tg_trigtuple;
	if (qb_shared == NULL || !qbor_attnums(td->tg_relation))
	{
		qb_note_outbox_first_id(-1);	/* its id unknown: from the start */
		return PointerGetDatum(tup);
	}
	desc = RelationGetDescr(td->tg_relation);
	id = heap_getattr(tup, qbor_att_id, desc, &id_null);
	atts = (QbParkAtts) {
		.id = qbor_att_id,.key = qbor_att_key,.state = qbor_att_state,.hold = qbor_att_hold,
		.destination = qbor_att_destination,
	};
	if ((traced = qbor_trace(tup, desc)) != (Datum) 0)
	{
		cols[n] = qbor_att_headers;
		values[n++] = traced;
	}
	(void) heap_getattr(tup, qbor_att_hold, desc, &isnull);
	if (!isnull || (qbor_att_origin != 0 && !heap_attisnull(tup, qbor_att_origin, desc)))
	{
		qbor_note_unparked(id, id_null);	/* placed by its inserter: it may be claimable */
		return qbor_changed(tup, desc, n, cols, values);
	}
	(void) heap_getattr(tup, qbor_att_destination, desc, &no_dest);
	if (no_dest && (dest = qbor_route(tup, desc, &fanout)) != NULL)
	{
		cols[n] = qbor_att_destination;
		values[n++] = CStringGetTextDatum(dest);
	}
	if (fanout && qbor_att_origin != 0)
	{
		/*
		 * A fan-out row: marked (origin = its id) and left unparked, so the
		 * first claim copies it whatever its key's order; each copy waits
		 * at its own destination (claim.md, "One key, several destinations").
		 */
		cols[n] = qbor_att_origin;
		values[n++] = id;
		qbor_note_unparked(id, id_null);
		return qbor_changed(tup, desc, n, cols, values);
	}
	key = heap_getattr(tup, qbor_att_key, desc, &isnull);
	parked = !isnull && qb_park_at_insert(td->tg_relation, &atts, DatumGetInt64(id), key,
										  dest != NULL ? dest : qbor_text_or_null(tup, desc, qbor_att_destination));
	if (parked)
		qb_note_outbox_row(true);
	else
		qbor_note_unparked(id, id_null);
	if (parked || dest != NULL)
	{
		cols[n] = qbor_att_hold;
		values[n++] = CStringGetTextDatum(parked ? "key" : "intake");
	}
	return qbor_changed(tup, desc, n, cols, values);
}
