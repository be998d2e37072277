/*-------------------------------------------------------------------------
 * pq_limits.c
 *	  The libpq store's limit take (QbStore.limits_take): the destinations'
 *	  rateLimit and maxConcurrent across every daemon replica on one
 *	  PostgreSQL database (qb_sql_pg.h, QB_PG_LIMITS_TAKE; docs/delivery.md,
 *	  "Limits").
 *
 * Wording (qb_store.h's, and):
 *	- The places a take records are this store's claimer's: the id whose
 *	  session advisory lock its connection holds (pq_conn.c, "Takeover").
 *	  The lock is taken here when takeover is off too (claims still record
 *	  no claimer then: qbpq_claimer), so a replica's places stop counting
 *	  the moment its session ends: kill -9, a lost connection.
 *	- Through a pooler in transaction mode no session lock shows a claimer
 *	  alive: its places count until the lease the take writes (the
 *	  engine's claimTimeoutMs) has passed, and each take renews it.
 *
 * One op, one transaction: the three statements go in one round trip
 * (qbpq_pipeline), with BEGIN and COMMIT.
 *-------------------------------------------------------------------------
 */
#include <stdio.h>
#include <stdlib.h>

#include "pq_store_int.h"
#include "qb_store.h"

typedef struct QbpqLimits
{
	QbLimitTake *takes;
	int			n;
	QbpqArgs	args;			/* QB_PG_LIMITS_TAKE's; ENSURE and LOCK borrow its arrays */
} QbpqLimits;

/* qbpq_limits_read: the take's answer, one row per destination, into takes */
static int
qbpq_limits_read(const PGresult *res, QbLimitTake *t, int n, char *err, size_t errlen)
{
	int			seen = 0;

	for (int r = 0; r < PQntuples(res); r++)
		seen += qb_limit_take_answer(t, n, PQgetvalue(res, r, 0), strtoll(PQgetvalue(res, r, 1), NULL, 10),
									 strtol(PQgetvalue(res, r, 2), NULL, 10));
	if (seen == n)
		return 0;
	snprintf(err, errlen, "the limit take answered %d of %d destinations", seen, n);
	return -1;
}

static int
qbpq_limits_body(QbPqStore *s, void *arg, char *err, size_t errlen)
{
	QbpqLimits *l = arg;
	QbpqArgs	ensure = {.v = {l->args.v[0], l->args.v[2]}};
	QbpqArgs	lock = {.v = {l->args.v[0]}};
	QbpqStep	steps[3] = {
		{.id = QB_PG_S_LIMITS_ENSURE, .args = &ensure, .want = PGRES_COMMAND_OK,
		.what = "making the limits' buckets"},
		{.id = QB_PG_S_LIMITS_LOCK, .args = &lock, .want = PGRES_TUPLES_OK,
		.what = "locking the limits' buckets"},
		{.id = QB_PG_S_LIMITS_TAKE, .args = &l->args, .want = PGRES_TUPLES_OK,
		.what = "the limit take"},
	};
	int			rc;

	if (qbpq_pipeline(s, steps, 3, true, err, errlen) != 0)
		return -1;
	rc = qbpq_limits_read(steps[2].res, l->takes, l->n, err, errlen);
	for (int i = 0; i < 3; i++)
		PQclear(steps[i].res);
	return rc;
}

/*
 * qbpq_limits_claimer: this store's claimer for the places, its lock held
 * when a session can hold it; *lease_ms 0 then, else the take's lease.
 */
static int
qbpq_limits_claimer(QbPqStore *s, long *lease_ms, char *err, size_t errlen)
{
	if (!s->claimer_held && !s->unnamed &&
		(qbpq_ensure(s, err, errlen) != 0 || qbpq_claimer_lock(s, err, errlen) != 0))
		return -1;
	if (s->claimer_held)
		*lease_ms = 0;
	else if (s->claimer_id == 0 && (s->claimer_id = qb_claimer_id()) == 0)
	{
		snprintf(err, errlen, "no random bytes for a claimer id");
		return -1;
	}
	return 0;
}

int
qbpq_limits_take(void *ctx, QbLimitTake *t, int n, long lease_ms, char *err, size_t errlen)
{
	QbPqStore  *s = ctx;
	QbpqLimits	l = {.takes = t, .n = n};
	char		num[32];
	int			rc;

	if (n <= 0)
		return 0;
	if (qbpq_limits_claimer(s, &lease_ms, err, errlen) != 0)
		return -1;
	for (int i = 0; i < n; i++)
	{
		snprintf(num, sizeof(num), "%.17g", t[i].per_sec > 0 ? t[i].per_sec : 0.0);
		qb_pg_array_add(&l.args.arr[0], t[i].destination);
		qb_pg_array_add(&l.args.arr[1], num);
		qb_pg_array_add_int(&l.args.arr[2], t[i].burst > 0 ? t[i].burst : 1);
		qb_pg_array_add_int(&l.args.arr[3], t[i].max_concurrent);
		qb_pg_array_add_int(&l.args.arr[4], t[i].held);
		qb_pg_array_add_int(&l.args.arr[5], t[i].give);
		qb_pg_array_add_int(&l.args.arr[6], t[i].want);
		qb_pg_array_add_int(&l.args.arr[7], t[i].out);
	}
	for (int i = 0; i < 8; i++)
		qbpq_args_array(&l.args, i);
	qbpq_args_int(&l.args, 8, s->claimer_id);
	qbpq_args_int(&l.args, 9, lease_ms);
	rc = qbpq_txn(s, "limit take", 0, qbpq_limits_body, &l, err, errlen);
	qbpq_args_free(&l.args);
	return rc;
}
