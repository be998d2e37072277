/*-------------------------------------------------------------------------
 * pq_store.c
 *	  The libpq store's QbStore ops (pq_store_int.h): the outbox cycle, the
 *	  ops that count rows, the sweep, the relay, the inbox insert and
 *	  query_text, each one op (qbpq_txn) running the statements the SPI
 *	  store runs for it, and the results read into the core's structures.
 *
 * Claims record the store's claimer (qbpq_claimer) only while its session
 * holds the claimer lock (pq_conn.c, "Takeover").  The connection, the
 * transaction and the pipeline are pq_conn.c's and pq_txn.c's.
 *-------------------------------------------------------------------------
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pq_store_int.h"
#include "qb_claim_cols.h"
#include "qb_host.h"
#include "qb_relay.h"

/* the claimer a claim records: 0 records none */
static int64_t
qbpq_claimer(const QbPqStore *s)
{
	return s->takeover && s->claimer_held ? s->claimer_id : 0;
}

/* the claimer whose lock this session holds (0: none), whatever claims record */
static int64_t
qbpq_claimer_own(const QbPqStore *s)
{
	return s->claimer_held ? s->claimer_id : 0;
}

/* ---- reading results ---------------------------------------------------------- */

/* qbpq_dup: a column as a malloc'd string, NULL for SQL NULL; *oom on failure. */
static char *
qbpq_dup(const PGresult *res, int row, int col, bool *oom)
{
	char	   *v;

	if (PQgetisnull(res, row, col))
		return NULL;
	if ((v = strdup(PQgetvalue(res, row, col))) == NULL)
		*oom = true;
	return v;
}

static long long
qbpq_int(const PGresult *res, int row, int col)
{
	return PQgetisnull(res, row, col) ? 0 : strtoll(PQgetvalue(res, row, col), NULL, 10);
}

static bool
qbpq_bool(const PGresult *res, int row, int col)
{
	return !PQgetisnull(res, row, col) && PQgetvalue(res, row, col)[0] == 't';
}

/* qbpq_oom: the op's err for a copy that ran out of memory. */
static int
qbpq_oom(const char *what, char *err, size_t errlen)
{
	snprintf(err, errlen, "%s: out of memory copying its rows", what);
	return -1;
}

/*
 * qbpq_take_rows appends the rows of a claim-shaped result (QB_PG_OUTBOX_CLAIM,
 * QB_PG_OUTBOX_PROMOTE) to out->rows.  Each row is counted before it is
 * copied, so a row copied in part is freed with the rest.
 */
static int
qbpq_take_rows(const PGresult *res, QbCycleOut *out, const char *what, char *err, size_t errlen)
{
	int			n = PQntuples(res);
	QbOutboxRow *rows;
	bool		oom = false;

	if (n == 0)
		return 0;
	if ((rows = realloc(out->rows, (out->nrows + n) * sizeof(QbOutboxRow))) == NULL)
		return qbpq_oom(what, err, errlen);
	memset(rows + out->nrows, 0, n * sizeof(QbOutboxRow));
	out->rows = rows;
	for (int i = 0; i < n && !oom; i++)
	{
		QbOutboxRow *r = &out->rows[out->nrows++];

		r->id = qbpq_int(res, i, QB_CLAIM_COL_ID);
		snprintf(r->message_id, sizeof(r->message_id), "%s",
				 PQgetvalue(res, i, QB_CLAIM_COL_MESSAGE_ID));
		r->topic = qbpq_dup(res, i, QB_CLAIM_COL_TOPIC, &oom);
		r->key = qbpq_dup(res, i, QB_CLAIM_COL_KEY, &oom);
		r->payload = qbpq_dup(res, i, QB_CLAIM_COL_PAYLOAD, &oom);
		r->payload_len = r->payload ? strlen(r->payload) : 0;
		r->headers = qbpq_dup(res, i, QB_CLAIM_COL_HEADERS, &oom);
		r->attempt = (int) qbpq_int(res, i, QB_CLAIM_COL_ATTEMPT);
		r->max_attempts = (int) qbpq_int(res, i, QB_CLAIM_COL_MAX_ATTEMPTS);
		r->created_epoch = strtod(PQgetvalue(res, i, QB_CLAIM_COL_CREATED_EPOCH), NULL);
		r->claimed = qbpq_bool(res, i, QB_CLAIM_COL_CLAIMED);
		r->destination = qbpq_dup(res, i, QB_CLAIM_COL_DESTINATION, &oom);
		r->in_intake = qbpq_bool(res, i, QB_CLAIM_COL_IN_INTAKE);
		r->not_due = qbpq_bool(res, i, QB_CLAIM_COL_NOT_DUE);
		r->probe = qbpq_bool(res, i, QB_CLAIM_COL_PROBE);
	}
	return oom ? qbpq_oom(what, err, errlen) : 0;
}

/* ---- the outbox cycle -------------------------------------------------------- */

/* qbpq_breaker: QB_PG_OUTBOX_BREAKER_ROWS then QB_PG_OUTBOX_BREAKER. */
static int
qbpq_breaker(QbPqStore *s, const QbDestTally *t, int n, QbCycleOut *out,
			 char *err, size_t errlen)
{
	QbpqArgs	a = {0};
	PGresult   *res = NULL;
	bool		oom = false;
	int			rc = -1;

	for (int i = 0; i < n; i++)
	{
		qb_pg_array_add(&a.arr[0], t[i].destination);
		qb_pg_array_add_int(&a.arr[1], t[i].ok);
		qb_pg_array_add_int(&a.arr[2], t[i].failed);
		qb_pg_array_add_bool(&a.arr[3], t[i].gone);
		qb_pg_array_add_int(&a.arr[4], t[i].retry_after_ms);
		qb_pg_array_add(&a.arr[5], t[i].error);
		qb_pg_array_add_int(&a.arr[6], t[i].threshold);
		qb_pg_array_add_int(&a.arr[7], t[i].cooldown_ms);
		qb_pg_array_add_int(&a.arr[8], t[i].ok_sent_ago_us);
	}
	for (int i = 0; i < qb_pg_stmts[QB_PG_S_BREAKER].nparams; i++)
		qbpq_args_array(&a, i);
	if ((res = qbpq_run(s, QB_PG_S_BREAKER_ROWS, &a, PGRES_COMMAND_OK,
						"creating the circuit breaker rows", err, errlen)) == NULL)
		goto done;
	PQclear(res);
	if ((res = qbpq_run(s, QB_PG_S_BREAKER, &a, PGRES_TUPLES_OK,
						"the circuit breaker statement", err, errlen)) == NULL)
		goto done;
	if (PQntuples(res) > 0 &&
		(out->changes = calloc(PQntuples(res), sizeof(QbDestChange))) == NULL)
	{
		rc = qbpq_oom("the circuit breaker statement", err, errlen);
		goto done;
	}
	for (int i = 0; i < PQntuples(res); i++)
	{
		QbDestChange *c = &out->changes[out->nchanges++];

		c->destination = qbpq_dup(res, i, 0, &oom);
		c->old_state = qb_circuit_parse(PQgetvalue(res, i, 1));
		c->new_state = qb_circuit_parse(PQgetvalue(res, i, 2));
		c->paused = qbpq_bool(res, i, 3);
	}
	rc = oom ? qbpq_oom("the circuit breaker statement", err, errlen) : 0;
done:
	PQclear(res);
	qbpq_args_free(&a);
	return rc;
}

/*
 * qbpq_fanout: QB_PG_OUTBOX_FANOUT for the settles that copy their row (a
 * route with several destinations), before the settle, in its transaction.
 */
static int
qbpq_fanout(QbPqStore *s, const QbSettle *st, int n, char *err, size_t errlen)
{
	QbpqArgs	a = {0};
	PGresult   *res;
	int			m = 0;
	int			rc;

	for (int i = 0; i < n; i++)
	{
		if (st[i].copies == NULL)
			continue;
		qb_pg_array_add(&a.arr[0], st[i].token);
		qb_pg_array_add_int(&a.arr[1], st[i].id);
		qb_pg_array_add(&a.arr[2], st[i].copies);
		m++;
	}
	if (m == 0)
		return 0;
	for (int i = 0; i < 3; i++)
		qbpq_args_array(&a, i);
	res = qbpq_run(s, QB_PG_S_FANOUT, &a, PGRES_COMMAND_OK,
				   "copying the rows of routes with several destinations", err, errlen);
	rc = res != NULL ? 0 : -1;
	PQclear(res);
	qbpq_args_free(&a);
	return rc;
}

/*
 * qbpq_settle: QB_PG_OUTBOX_SETTLE.  p gets the parameters of
 * QB_PG_OUTBOX_PROMOTE for the keys whose row ended or was routed (*nkeys), run
 * by the caller in a statement of its own (its comment says why); with
 * claim, the promoted rows that are due are claimed under its token.
 */
static int
qbpq_settle(QbPqStore *s, const QbSettle *st, int n, const QbClaimReq *claim,
			QbpqArgs *p, int *nkeys, QbpqArgs *past, int *npast, QbCycleOut *out,
			char *err, size_t errlen)
{
	QbpqArgs	a = {0};
	PGresult   *res = NULL;
	int			rc = -1;
	bool		fanout = qb_settles_fanout(st, n);

	*nkeys = *npast = 0;
	if (qbpq_fanout(s, st, n, err, errlen) != 0)
		return -1;
	for (int i = 0; i < n; i++)
	{
		qb_pg_array_add(&a.arr[0], st[i].token);
		qb_pg_array_add_int(&a.arr[1], st[i].id);
		qb_pg_array_add(&a.arr[2], qb_settle_kind_name(st[i].kind));
		qb_pg_array_add_int(&a.arr[3], st[i].attempt);
		qb_pg_array_add_int(&a.arr[4], st[i].delay_ms);
		qb_pg_array_add(&a.arr[5], st[i].error);
		qb_pg_array_add(&a.arr[6], st[i].destination);
		qb_pg_array_add_bool(&a.arr[7], st[i].unrouted);
	}
	for (int i = 0; i < 8; i++)
		qbpq_args_array(&a, i);
	if ((res = qbpq_run(s, QB_PG_S_SETTLE, &a, PGRES_TUPLES_OK, "the outbox settle",
						err, errlen)) == NULL)
		goto done;
	out->nsettled = PQntuples(res);
	for (int i = 0; i < PQntuples(res); i++)
	{
		/* ended, or routed now: its key's rows elsewhere may go (QB_PG_OUTBOX_SETTLE) */
		if (!PQgetisnull(res, i, 0) && strcmp(PQgetvalue(res, i, 3), "t") == 0)
		{
			qb_pg_array_add(&p->arr[0], PQgetvalue(res, i, 0));
			qb_pg_array_add(&p->arr[5], PQgetisnull(res, i, 2) ? NULL : PQgetvalue(res, i, 2));
			(*nkeys)++;
			/* no destination at its claim, in a cycle that ended a fan-out row */
			if (fanout && PQgetisnull(res, i, 2))
			{
				qb_pg_array_add(&past->arr[0], PQgetvalue(res, i, 0));
				(*npast)++;
			}
		}
	}
	if (*npast > 0)
		qbpq_args_array(past, 0);
	if (*nkeys > 0)
	{
		qbpq_args_array(p, 0);
		qbpq_args_array(p, 5);
		if (claim != NULL)
		{
			p->v[1] = claim->token;
			qbpq_args_int(p, 2, claim->lease_ms);
			qbpq_args_int(p, 3, claim->default_max_attempts);
			qbpq_args_int(p, 4, qbpq_claimer(s));
		}
	}
	rc = 0;
done:
	PQclear(res);
	qbpq_args_free(&a);
	return rc;
}

/* qbpq_states: the result of QB_PG_OUTBOX_STATES into out; the probe names into probes. */
static int
qbpq_states(const PGresult *res, QbCycleOut *out, QbPgArray *probes, char *err, size_t errlen)
{
	bool		oom = false;
	int			n = PQntuples(res);

	if (n > 0 && (out->states = calloc(n, sizeof(QbDestState))) == NULL)
		oom = true;
	for (int i = 0; i < n && !oom; i++)
	{
		QbDestState *st = &out->states[out->nstates++];

		st->destination = qbpq_dup(res, i, 0, &oom);
		st->state = qb_circuit_parse(PQgetvalue(res, i, 1));
		st->failures = (int) qbpq_int(res, i, 2);
		st->paused = qbpq_bool(res, i, 3);
		st->probe = qbpq_bool(res, i, 4);
		if (st->probe)
			qb_pg_array_add(probes, st->destination);
	}
	return oom ? qbpq_oom("reading the destination states", err, errlen) : 0;
}

/*
 * qbpq_claim: QB_PG_OUTBOX_CLAIM (QB_PG_OUTBOX_CLAIM_NO_PROBE when no probe
 * is asked for), its rows into out.
 */
static int
qbpq_claim(QbPqStore *s, const QbClaimReq *c, QbPgArray *probes, QbCycleOut *out,
		   char *err, size_t errlen)
{
	QbpqArgs	a = {0};
	PGresult   *res;
	int			rc = -1;

	for (int i = 0; i < c->ndests; i++)
	{
		qb_pg_array_add(&a.arr[5], c->dests[i]);
		qb_pg_array_add_int(&a.arr[6], c->limits[i]);
		qb_pg_array_add_int(&a.arr[8], c->floors ? c->floors[i] : 0);
	}
	qbpq_args_int(&a, 0, c->batch_size);
	qbpq_args_int(&a, 1, c->lease_ms);
	qbpq_args_int(&a, 2, c->default_max_attempts);
	a.v[3] = c->token;
	qbpq_args_int(&a, 4, c->floor);
	qbpq_args_array(&a, 5);
	qbpq_args_array(&a, 6);
	if ((a.v[7] = qb_pg_array_text(probes)) == NULL)
		a.oom = true;
	qbpq_args_array(&a, 8);
	qbpq_args_int(&a, 9, qbpq_claimer(s));
	/* the cycle's last statement: its COMMIT goes with it */
	if ((res = qbpq_run_commit(s, probes->n > 0 ? QB_PG_S_CLAIM : QB_PG_S_CLAIM_NO_PROBE, &a,
							   PGRES_TUPLES_OK, "the outbox claim", err, errlen)) != NULL)
	{
		rc = qbpq_take_rows(res, out, "the outbox claim", err, errlen);
		PQclear(res);
	}
	qbpq_args_free(&a);
	return rc;
}

/*
 * qbpq_cycle_body: as the SPI store's qbs_cycle_body, statement for
 * statement.  The round trips: the breaker's two statements (when it has
 * tallies) and the settle; then the promote, the release past rows in
 * flight (QB_PG_OUTBOX_PROMOTE_PAST, when a fan-out row was settled) and
 * the destination states (none waits for another); then
 * the claim, which takes the promoted
 * rows and the probes into account, with the COMMIT.  The states are read
 * only when the engine asks (read_states: qbo_states_due), and neither
 * they nor the claim when it wants only the promoted rows (promoted_only).
 */
static int
qbpq_cycle_body(QbPqStore *s, void *arg, char *err, size_t errlen)
{
	QbCycleCall *cy = arg;
	const QbClaimReq *claim = cy->claim;
	QbClaimReq	req;
	QbPgArray	probes = {0};
	QbpqArgs	p = {0};
	QbpqArgs	sa = {0};
	QbpqArgs	pa = {0};
	QbpqStep	steps[3];
	int			nsteps = 0;
	int			nkeys = 0;
	int			npast = 0;
	int		   *limits = NULL;
	int			rc = -1;

	if (cy->ntallies > 0 &&
		qbpq_breaker(s, cy->tallies, cy->ntallies, cy->out, err, errlen) != 0)
		goto done;
	if (cy->nsettles > 0 &&
		qbpq_settle(s, cy->settles, cy->nsettles, claim, &p, &nkeys, &pa, &npast, cy->out,
					err, errlen) != 0)
		goto done;
	if (nkeys > 0)
		steps[nsteps++] = (QbpqStep) {.id = QB_PG_S_PROMOTE, .args = &p, .want = PGRES_TUPLES_OK,
		.what = "promoting the next row of each key"};
	if (npast > 0)
		steps[nsteps++] = (QbpqStep) {.id = QB_PG_S_PROMOTE_PAST, .args = &pa,
		.want = PGRES_COMMAND_OK, .what = "releasing the rows parked behind two ends at once"};
	if (claim != NULL && claim->read_states && !claim->promoted_only)
	{
		qbpq_args_int(&sa, 0, claim->probe_ms);
		steps[nsteps++] = (QbpqStep) {.id = QB_PG_S_STATES, .args = &sa, .want = PGRES_TUPLES_OK,
		.what = "reading the destination states"};
	}
	/* a settle alone, or with only its promoted rows to claim, commits with its promote */
	if (nsteps > 0 && qbpq_pipeline(s, steps, nsteps, claim == NULL || claim->promoted_only,
									err, errlen) != 0)
		goto done;
	if (nkeys > 0 && claim != NULL &&
		qbpq_take_rows(steps[0].res, cy->out, "promoting the next row of each key", err, errlen) != 0)
		goto done;
	if (claim == NULL || claim->promoted_only)
	{
		/* the promoted rows are claimed: nothing else is asked for */
		rc = 0;
		goto done;
	}
	if (claim->read_states &&
		qbpq_states(steps[nsteps - 1].res, cy->out, &probes, err, errlen) != 0)
		goto done;
	if ((limits = malloc(sizeof(int) * (claim->ndests + 1))) == NULL)
	{
		rc = qbpq_oom("the outbox claim", err, errlen);
		goto done;
	}
	qb_claim_left(claim, cy->out->rows, cy->out->nrows, &req, limits);
	rc = qbpq_claim(s, &req, &probes, cy->out, err, errlen);
done:
	/* the results of a pipeline that failed are cleared already (NULL) */
	for (int i = 0; i < nsteps; i++)
		PQclear(steps[i].res);
	qb_pg_array_free(&probes);
	qbpq_args_free(&p);
	qbpq_args_free(&pa);
	free(limits);
	return rc;
}

static int
qbpq_outbox_cycle(void *ctx, const QbDestTally *tallies, int ntallies,
				  const QbSettle *settles, int nsettles, const QbClaimReq *claim,
				  QbCycleOut *out, char *err, size_t errlen)
{
	QbCycleCall c = {.tallies = tallies, .ntallies = ntallies, .settles = settles,
		.nsettles = nsettles, .claim = claim, .out = out};
	int			rc;

	memset(out, 0, sizeof(*out));
	rc = qbpq_txn(ctx, claim ? "settle and claim" : "settle", 0, qbpq_cycle_body, &c,
				  err, errlen);
	if (rc != 0)
		qb_cycle_out_free(out);
	return rc;
}

/* ---- the ops that count rows ------------------------------------------------- */

typedef struct QbpqCount
{
	int			id;
	const char *what;
	QbpqArgs	args;
	int			count;
} QbpqCount;

static int
qbpq_count_body(QbPqStore *s, void *arg, char *err, size_t errlen)
{
	QbpqCount  *c = arg;
	PGresult   *res = qbpq_run_commit(s, c->id, &c->args, PGRES_COMMAND_OK, c->what, err,
										errlen);

	if (res == NULL)
		return -1;
	c->count = atoi(PQcmdTuples(res));
	PQclear(res);
	return 0;
}

/* qbpq_count runs c's statement as an op; *count is the rows it changed. */
static int
qbpq_count(QbPqStore *s, QbpqCount *c, int *count, char *err, size_t errlen)
{
	int			rc = qbpq_txn(s, c->what, 0, qbpq_count_body, c, err, errlen);

	*count = rc == 0 ? c->count : 0;
	qbpq_args_free(&c->args);
	return rc;
}

/* qbpq_names: parameter 0 is the text[] of names. */
static void
qbpq_names(QbpqArgs *a, const char *const *names, int n)
{
	for (int i = 0; i < n; i++)
		qb_pg_array_add(&a->arr[0], names[i]);
	qbpq_args_array(a, 0);
}

static int
qbpq_outbox_unpark(void *ctx, const char *const *dests, int n, int limit, int *nmoved,
				   char *err, size_t errlen)
{
	QbpqCount	c = {.id = QB_PG_S_UNPARK, .what = "unpark"};

	qbpq_names(&c.args, dests, n);
	qbpq_args_int(&c.args, 1, limit);
	return qbpq_count(ctx, &c, nmoved, err, errlen);
}

static int
qbpq_outbox_unroute(void *ctx, const char *const *dests, int n, int *nmoved,
					char *err, size_t errlen)
{
	QbpqCount	c = {.id = QB_PG_S_UNROUTE, .what = "unroute"};

	qbpq_names(&c.args, dests, n);
	return qbpq_count(ctx, &c, nmoved, err, errlen);
}

static int
qbpq_outbox_reclaim(void *ctx, int limit, int *n, char *err, size_t errlen)
{
	QbpqCount	c = {.id = QB_PG_S_RECLAIM, .what = "reclaim"};

	qbpq_args_int(&c.args, 0, limit);
	qbpq_args_int(&c.args, 1, qbpq_claimer_own(ctx));
	return qbpq_count(ctx, &c, n, err, errlen);
}

/* A retention batch: its floor in and out, the rows it deleted. */
typedef struct QbpqRetention
{
	QbpqArgs	args;
	int64_t		after;
	int			deleted;
} QbpqRetention;

static int
qbpq_retention_body(QbPqStore *s, void *arg, char *err, size_t errlen)
{
	QbpqRetention *r = arg;
	PGresult   *res = qbpq_run_commit(s, QB_PG_S_RETENTION, &r->args, PGRES_TUPLES_OK,
									  "retention", err, errlen);

	if (res == NULL)
		return -1;
	if (PQntuples(res) != 1)
	{
		snprintf(err, errlen, "retention answered %d rows, not one", PQntuples(res));
		PQclear(res);
		return -1;
	}
	r->deleted = (int) qbpq_int(res, 0, 0);
	if (!PQgetisnull(res, 0, 1))
		r->after = qbpq_int(res, 0, 1);
	PQclear(res);
	return 0;
}

static int
qbpq_outbox_retention(void *ctx, long retention_sec, int limit, int64_t *after, int *n,
					  char *err, size_t errlen)
{
	QbpqRetention r = {.after = *after};
	int			rc;

	qbpq_args_int(&r.args, 0, retention_sec);
	qbpq_args_int(&r.args, 1, limit);
	qbpq_args_int(&r.args, 2, *after);
	rc = qbpq_txn(ctx, "retention", 0, qbpq_retention_body, &r, err, errlen);
	qbpq_args_free(&r.args);
	*n = rc == 0 ? r.deleted : 0;
	if (rc == 0)
		*after = r.after;
	return rc;
}

typedef struct QbpqSweep
{
	QbpqArgs	args;
	int			released;
	char	   *next;			/* malloc'd */
} QbpqSweep;

static int
qbpq_sweep_body(QbPqStore *s, void *arg, char *err, size_t errlen)
{
	QbpqSweep  *w = arg;
	PGresult   *res = qbpq_run_commit(s, QB_PG_S_SWEEP, &w->args, PGRES_TUPLES_OK, "sweep",
									  err, errlen);

	if (res == NULL)
		return -1;
	if (PQntuples(res) != 1)
	{
		snprintf(err, errlen, "the sweep of parked rows answered %d rows, not one", PQntuples(res));
		PQclear(res);
		return -1;
	}
	w->released = atoi(PQgetvalue(res, 0, 0));
	if (!PQgetisnull(res, 0, 1) && (w->next = strdup(PQgetvalue(res, 0, 1))) == NULL)
	{
		snprintf(err, errlen, "out of memory for the sweep's next key");
		PQclear(res);
		return -1;
	}
	PQclear(res);
	return 0;
}

static int
qbpq_outbox_sweep(void *ctx, const char *after, int limit, int *nreleased, char **next,
				  char *err, size_t errlen)
{
	QbpqSweep	w = {.args = {.v = {after}}};
	int			rc;

	qbpq_args_int(&w.args, 1, limit);
	rc = qbpq_txn(ctx, "sweep", 0, qbpq_sweep_body, &w, err, errlen);
	if (rc != 0)
	{
		free(w.next);
		w.next = NULL;
	}
	*nreleased = rc == 0 ? w.released : 0;
	*next = w.next;
	return rc;
}

/* ---- the relay ------------------------------------------------------------------ */

typedef struct QbpqRelayClaim
{
	int			batch_size;
	long		lease_ms;
	const char *token;
	QbRelayRow *rows;
	int			nrows;
} QbpqRelayClaim;

static int
qbpq_relay_claim_body(QbPqStore *s, void *arg, char *err, size_t errlen)
{
	QbpqRelayClaim *c = arg;
	QbpqArgs	a = {0};
	PGresult   *res;
	bool		oom = false;
	int			n;

	qbpq_args_int(&a, 0, c->batch_size);
	qbpq_args_int(&a, 1, c->lease_ms);
	a.v[2] = c->token;
	qbpq_args_int(&a, 3, qbpq_claimer(s));
	qbpq_args_int(&a, 4, qbpq_claimer_own(s));
	if ((res = qbpq_run_commit(s, QB_PG_S_RELAY_CLAIM, &a, PGRES_TUPLES_OK, "relay claim",
						err, errlen)) == NULL)
		return -1;
	n = PQntuples(res);
	if (n > 0 && (c->rows = calloc(n, sizeof(QbRelayRow))) == NULL)
		oom = true;
	for (int i = 0; i < n && !oom; i++)
	{
		QbRelayRow *r = &c->rows[c->nrows++];

		r->id = qbpq_int(res, i, 0);
		r->source = qbpq_dup(res, i, 1, &oom);
		r->event_type = qbpq_dup(res, i, 2, &oom);
		r->traceparent = PQnfields(res) >= 5 ? qbpq_dup(res, i, 4, &oom) : NULL;
	}
	PQclear(res);
	return oom ? qbpq_oom("relay claim", err, errlen) : 0;
}

static int
qbpq_relay_claim(void *ctx, int batch_size, long lease_ms, const char *token,
				 QbRelayRow **rows, int *nrows, char *err, size_t errlen)
{
	QbpqRelayClaim c = {.batch_size = batch_size, .lease_ms = lease_ms, .token = token};
	int			rc = qbpq_txn(ctx, "relay claim", 0, qbpq_relay_claim_body, &c, err, errlen);

	if (rc != 0)
	{
		qb_relay_rows_free(c.rows, c.nrows);
		c.rows = NULL;
		c.nrows = 0;
	}
	*rows = c.rows;
	*nrows = c.nrows;
	return rc;
}

typedef struct QbpqForward
{
	QbpqArgs	args;
	int			nsettled;
	int			ninserted;
} QbpqForward;

/*
 * the forward, then QB_PG_RELAY_PROMOTE with the same ids, in a later
 * statement (its parameters are the forward's, so both go in one round
 * trip, with the BEGIN and the COMMIT)
 */
static int
qbpq_relay_forward_body(QbPqStore *s, void *arg, char *err, size_t errlen)
{
	QbpqForward *f = arg;
	QbpqArgs	p = {.v = {f->args.v[1]}};
	QbpqStep	steps[2] = {
		{.id = QB_PG_S_RELAY_FORWARD, .args = &f->args, .want = PGRES_TUPLES_OK,
		.what = "the relay forward"},
		{.id = QB_PG_S_RELAY_PROMOTE, .args = &p, .want = PGRES_COMMAND_OK,
		.what = "promoting the next row of each aggregate"},
	};

	if (qbpq_durable(s, err, errlen) != 0 || qbpq_pipeline(s, steps, 2, true, err, errlen) != 0)
		return -1;
	f->nsettled = (int) qbpq_int(steps[0].res, 0, 0);
	f->ninserted = (int) qbpq_int(steps[0].res, 0, 1);
	PQclear(steps[0].res);
	PQclear(steps[1].res);
	return 0;
}

static int
qbpq_relay_forward(void *ctx, const char *token, const int64_t *ids,
				   const char *const *topics, const bool *holds, int n, int max_attempts,
				   int *nsettled, int *ninserted, char *err, size_t errlen)
{
	QbpqForward f = {.args = {.v = {token}}};
	int			rc;

	for (int i = 0; i < n; i++)
	{
		qb_pg_array_add_int(&f.args.arr[1], ids[i]);
		qb_pg_array_add(&f.args.arr[2], topics[i]);
		qb_pg_array_add_bool(&f.args.arr[4], holds != NULL && holds[i]);
	}
	qbpq_args_array(&f.args, 1);
	qbpq_args_array(&f.args, 2);
	qbpq_args_int(&f.args, 3, max_attempts);
	qbpq_args_array(&f.args, 4);
	rc = qbpq_txn(ctx, "relay forward", 0, qbpq_relay_forward_body, &f, err, errlen);
	qbpq_args_free(&f.args);
	*nsettled = rc == 0 ? f.nsettled : 0;
	*ninserted = rc == 0 ? f.ninserted : 0;
	return rc;
}

/* ---- the inbox insert --------------------------------------------------------- */

typedef struct QbpqInsert
{
	const QbInboxRow *rows;
	int			n;
	int64_t    *ids;
	QbpqArgs	args;
} QbpqInsert;

static int
qbpq_inbox_insert_body(QbPqStore *s, void *arg, char *err, size_t errlen)
{
	QbpqInsert *a = arg;
	PGresult   *res;

	if (qbpq_durable(s, err, errlen) != 0)
		return -1;
	if ((res = qbpq_run_commit(s, QB_PG_S_INBOX_INSERT, &a->args, PGRES_TUPLES_OK, "the inbox insert",
						err, errlen)) == NULL)
		return -1;
	/* match each stored row to the first request of its key */
	for (int r = 0; r < PQntuples(res); r++)
		(void) qb_inbox_match(a->rows, a->n, a->ids, qbpq_int(res, r, 0),
							  PQgetvalue(res, r, 1), PQgetvalue(res, r, 2));
	PQclear(res);
	return 0;
}

static int
qbpq_inbox_insert(void *ctx, const QbInboxRow *rows, int n, long timeout_ms,
				  int64_t *ids, char *err, size_t errlen)
{
	QbpqInsert	a = {.rows = rows, .n = n, .ids = ids};
	int			rc;

	memset(ids, 0, sizeof(int64_t) * n);
	for (int i = 0; i < n; i++)
	{
		qb_pg_array_add(&a.args.arr[0], rows[i].source);
		qb_pg_array_add(&a.args.arr[1], rows[i].idempotency_key);
		qb_pg_array_add(&a.args.arr[2], rows[i].event_type);
		qb_pg_array_add(&a.args.arr[3], rows[i].aggregate_id);
		qb_pg_array_add(&a.args.arr[4], rows[i].payload);
		qb_pg_array_add(&a.args.arr[5], rows[i].headers);
		qb_pg_array_add(&a.args.arr[6], rows[i].pull ? "pull" : "push");
		qb_pg_array_add(&a.args.arr[7], rows[i].dead_error);
	}
	for (int i = 0; i < 8; i++)
		qbpq_args_array(&a.args, i);
	rc = qbpq_txn(ctx, "storing received messages", timeout_ms, qbpq_inbox_insert_body, &a,
				  err, errlen);
	if (rc != 0)
		memset(ids, 0, sizeof(int64_t) * n);
	qbpq_args_free(&a.args);
	return rc;
}

/* ---- query_text --------------------------------------------------------------- */

typedef struct QbpqQuery
{
	QbQuery		query;
	const char *const *params;
	char	  **out;
} QbpqQuery;

/* qbpq_replay's state: the store and its select's result, which the rows point into. */
typedef struct QbpqReplay
{
	QbPqStore  *s;
	PGresult   *sel;
	int64_t    *ids;
	const char **sources;
	const char **types;
} QbpqReplay;

/* qbpq_replay_select: QB_PG_INBOX_REPLAY_SELECT (qb_replay_run's select). */
static int
qbpq_replay_select(void *ctx, const char *const *v, const int64_t **ids,
				   const char *const **sources, const char *const **types, int *n,
				   char *err, size_t errlen)
{
	QbpqReplay *p = ctx;
	QbpqArgs	a = {0};
	int			nt;

	for (int i = 0; i < 5; i++)
		a.v[i] = v[i];
	if ((p->sel = qbpq_run(p->s, QB_PG_S_REPLAY_SELECT, &a, PGRES_TUPLES_OK,
						   "reading the inbox rows to replay", err, errlen)) == NULL)
		return -1;
	nt = PQntuples(p->sel);
	p->ids = malloc(sizeof(int64_t) * (nt + 1));
	p->sources = malloc(sizeof(char *) * (nt + 1));
	p->types = malloc(sizeof(char *) * (nt + 1));
	if (p->ids == NULL || p->sources == NULL || p->types == NULL)
		return qbpq_oom("the replay", err, errlen);
	for (int i = 0; i < nt; i++)
	{
		p->ids[i] = qbpq_int(p->sel, i, 0);
		p->sources[i] = PQgetvalue(p->sel, i, 1);
		p->types[i] = PQgetisnull(p->sel, i, 2) ? NULL : PQgetvalue(p->sel, i, 2);
	}
	*ids = p->ids;
	*sources = p->sources;
	*types = p->types;
	*n = nt;
	return 0;
}

/* qbpq_replay_insert: QB_PG_INBOX_REPLAY (qb_replay_run's insert). */
static int
qbpq_replay_insert(void *ctx, const QbReplay *r, int max_attempts, long long *nrows,
				   bool *first_null, long long *first_id, char *err, size_t errlen)
{
	QbpqReplay *p = ctx;
	QbpqArgs	ins = {0};
	PGresult   *res;

	for (int i = 0; i < r->n; i++)
	{
		qb_pg_array_add_int(&ins.arr[0], r->ids[i]);
		qb_pg_array_add(&ins.arr[1], r->topics[i]);
	}
	qbpq_args_array(&ins, 0);
	qbpq_args_array(&ins, 1);
	qbpq_args_int(&ins, 2, max_attempts);
	res = qbpq_run(p->s, QB_PG_S_REPLAY, &ins, PGRES_TUPLES_OK,
				   "inserting the replayed outbox rows", err, errlen);
	qbpq_args_free(&ins);
	if (res == NULL)
		return -1;
	*nrows = PQntuples(res);
	*first_null = PQntuples(res) == 0;
	*first_id = *first_null ? 0 : qbpq_int(res, 0, 0);
	PQclear(res);
	return 0;
}

/*
 * qbpq_replay: QB_Q_REPLAY_INBOX and QB_Q_REPLAY_INBOX_BULK without the
 * extension's queuebox.replay_inbox() (a plain-SQL schema has none): the
 * rows (QB_PG_INBOX_REPLAY_SELECT), their topics from the configuration in
 * force (qb_replay_render, as the extension renders them), the insert
 * (QB_PG_INBOX_REPLAY); the answers and failures are the extension's.
 */
static int
qbpq_replay(QbPqStore *s, QbpqQuery *q, char *err, size_t errlen)
{
	static const QbReplayCalls calls = {
		.select = qbpq_replay_select,
		.insert = qbpq_replay_insert,
		.oom = "the replay: out of memory copying its rows",
	};
	QbpqReplay	p = {.s = s};
	int			rc;

	rc = qb_replay_run(s->cfg, q->query == QB_Q_REPLAY_INBOX, q->params, &calls, &p, q->out,
					   err, errlen);
	PQclear(p.sel);
	free(p.ids);
	free(p.sources);
	free(p.types);
	return rc;
}

static int
qbpq_query_text_body(QbPqStore *s, void *arg, char *err, size_t errlen)
{
	QbpqQuery  *q = arg;
	QbpqArgs	a = {0};
	PGresult   *res;
	bool		oom = false;

	if (q->query == QB_Q_REPLAY_INBOX || q->query == QB_Q_REPLAY_INBOX_BULK)
		return qbpq_replay(s, q, err, errlen);
	for (int i = 0; i < qb_pg_stmts[QB_PG_S_QUERY + q->query].nparams; i++)
		a.v[i] = q->params[i];
	if ((res = qbpq_run_commit(s, QB_PG_S_QUERY + q->query, &a, PGRES_TUPLES_OK, "query", err,
						errlen)) == NULL)
		return -1;
	if (PQntuples(res) > 0)
		*q->out = qbpq_dup(res, 0, 0, &oom);
	PQclear(res);
	return oom ? qbpq_oom("query", err, errlen) : 0;
}

static int
qbpq_query_text(void *ctx, QbQuery query, const char *const *params, long timeout_ms,
				char **out, char *err, size_t errlen)
{
	QbPqStore  *s = ctx;
	QbpqQuery	q = {.query = query, .params = params, .out = out};
	int			rc;

	_Static_assert(QB_PG_NQUERIES == QB_NQUERIES, "one statement per QbQuery");
	*out = NULL;
	rc = qbpq_txn(s, "query", timeout_ms, qbpq_query_text_body, &q, err, errlen);
	if (rc == 0)
		return 0;
	free(*out);
	*out = NULL;
	/* the store's own codes stand; a failed statement says what its SQLSTATE means */
	return rc == -1 ? qb_query_failure(s->sqlstate) : rc;
}

/* The daemon reads its document from a file: this op is replaced. */
static int
qbpq_config_load(void *ctx, char **text, char *err, size_t errlen)
{
	*text = NULL;
	return 0;
}

/*
 * qbpq_claimer_op: QbStore.claimer.  A lock once taken is kept while the
 * connection lives, also when takeover is turned off: rows claimed under it
 * may still be in flight.
 */
static int
qbpq_claimer_op(void *ctx, bool on, char *err, size_t errlen)
{
	QbPqStore  *s = ctx;

	s->takeover = on;
	if (!on || s->claimer_held || s->unnamed)
		return 0;
	if (qbpq_ensure(s, err, errlen) != 0)
		return -1;
	/* a fresh connection took it in its session set-up */
	return qbpq_claimer_lock(s, err, errlen);
}


/* ---- the ops table ------------------------------------------------------------------ */

void
qb_pq_store_ops(QbPqStore *s, QbStore *store)
{
	*store = (QbStore) {
		.ctx = s,
		.config_load = qbpq_config_load,
		.outbox_cycle = qbpq_outbox_cycle,
		.outbox_unpark = qbpq_outbox_unpark,
		.outbox_unroute = qbpq_outbox_unroute,
		.outbox_reclaim = qbpq_outbox_reclaim,
		.outbox_retention = qbpq_outbox_retention,
		.outbox_sweep = qbpq_outbox_sweep,
		.inbox_insert = qbpq_inbox_insert,
		.query_text = qbpq_query_text,
		.claimer = qbpq_claimer_op,
		.limits_take = qbpq_limits_take,
		.relay_claim = qbpq_relay_claim,
		.relay_forward = qbpq_relay_forward,
	};
}
