/*
 * test_worker.c
 *	  The scenarios of clients/SCENARIOS.md against libqueuebox-inbox, on a
 *	  real PostgreSQL with the queuebox extension (QBI_TEST_DSN; TAP 032
 *	  starts the cluster).  Each scenario counts rows before and after.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "queuebox_inbox.h"

static const char *dsn;
static PGconn *admin;

static void
sql(const char *q)
{
	PGresult   *r = PQexec(admin, q);

	if (PQresultStatus(r) != PGRES_COMMAND_OK && PQresultStatus(r) != PGRES_TUPLES_OK)
		fail_msg("admin: %s\n%s", PQresultErrorMessage(r), q);
	PQclear(r);
}

/* the first value of q, as text (static buffer, "" for none) */
static const char *
val(const char *q)
{
	static char buf[1024];
	PGresult   *r = PQexec(admin, q);

	if (PQresultStatus(r) != PGRES_TUPLES_OK)
		fail_msg("admin: %s\n%s", PQresultErrorMessage(r), q);
	snprintf(buf, sizeof(buf), "%s", PQntuples(r) > 0 ? PQgetvalue(r, 0, 0) : "");
	PQclear(r);
	return buf;
}

static int
clean(void **state)
{
	sql("DELETE FROM queuebox.inbox; DROP TABLE IF EXISTS biz; CREATE TABLE biz (msg bigint, n int)");
	return 0;
}

/* n pull rows of source "jobs", payload {"n": i}, i = 1..n */
static void
add_rows(int n)
{
	char		q[512];

	snprintf(q, sizeof(q),
			 "INSERT INTO queuebox.inbox (source, idempotency_key, payload, consumption)"
			 " SELECT 'jobs', 'j' || i, jsonb_build_object('n', i), 'pull' FROM generate_series(1, %d) i", n);
	sql(q);
}

static int
payload_n(const QbiMessage *m)
{
	const char *p = strstr(m->payload, "\"n\":");

	return p ? atoi(p + 4) : -1;
}

/* the business write of a handler: one row of biz, through the handler's transaction */
static int
write_biz(PGconn *tx, const QbiMessage *m, char *err, size_t errlen)
{
	char		id[24];
	char		n[16];
	const char *v[2] = {id, n};
	PGresult   *r;

	snprintf(id, sizeof(id), "%lld", (long long) m->id);
	snprintf(n, sizeof(n), "%d", payload_n(m));
	r = PQexecParams(tx, "INSERT INTO biz VALUES ($1, $2)", 2, NULL, v, NULL, NULL, 0);
	if (PQresultStatus(r) != PGRES_COMMAND_OK)
	{
		snprintf(err, errlen, "business write: %s", PQresultErrorMessage(r));
		PQclear(r);
		return -1;
	}
	PQclear(r);
	return 0;
}

/* ---- running a worker in a thread ------------------------------------------- */

typedef struct Run
{
	QbiWorker  *w;
	QbiHandler	handler;
	void	   *arg;
	pthread_t	t;
	int			rc;
	char		err[QBI_ERRLEN];
} Run;

static void *
run_thread(void *a)
{
	Run		   *r = a;

	r->rc = qbi_worker_run(r->w, r->handler, r->arg, r->err, sizeof(r->err));
	return NULL;
}

static Run *
start(QbiOptions o, QbiHandler h, void *arg)
{
	Run		   *r = calloc(1, sizeof(Run));
	char		err[QBI_ERRLEN];

	o.conninfo = dsn;
	o.source = "jobs";
	if (o.idle_ms == 0)
		o.idle_ms = 50;
	r->w = qbi_worker_new(&o, err, sizeof(err));
	if (r->w == NULL)
		fail_msg("qbi_worker_new: %s", err);
	r->handler = h;
	r->arg = arg;
	pthread_create(&r->t, NULL, run_thread, r);
	return r;
}

static QbiCounters
finish(Run *r)
{
	QbiCounters c;

	qbi_worker_stop(r->w);
	pthread_join(r->t, NULL);
	assert_int_equal(r->rc, 0);
	qbi_worker_counters(r->w, &c);
	qbi_worker_free(r->w);
	free(r);
	return c;
}

/* wait (up to 20 s) until q answers want */
static void
wait_for(const char *q, const char *want)
{
	for (int i = 0; i < 400; i++)
	{
		if (strcmp(val(q), want) == 0)
			return;
		usleep(50 * 1000);
	}
	fail_msg("waited 20 s for \"%s\" to be %s; it is %s", q, want, val(q));
}

/* ---- the scenarios ------------------------------------------------------------ */

/* the handler's business write commits with the completion; a failing handler leaves neither */
static int
h_fail_two(void *arg, const QbiMessage *m, PGconn *tx, const volatile bool *cancelled,
		   char *err, size_t errlen)
{
	if (write_biz(tx, m, err, errlen) != 0)
		return -1;
	if (payload_n(m) == 2)
	{
		snprintf(err, errlen, "message two always fails");
		return -1;
	}
	return 0;
}

static QbiDecision
p_later(void *arg, const QbiMessage *m, const char *error)
{
	return qbi_retry_after(600000);
}

static void
test_commit_together(void **state)
{
	Run		   *r;
	QbiCounters c;

	add_rows(3);
	r = start((QbiOptions) {.policy = p_later}, h_fail_two, NULL);
	wait_for("SELECT count(*) FROM queuebox.inbox WHERE state <> 'processing' AND (state <> 'pending' OR attempt > 0)", "3");
	c = finish(r);
	assert_string_equal(val("SELECT string_agg(n::text, ',' ORDER BY n) FROM biz"), "1,3");
	assert_string_equal(val("SELECT string_agg(state || ':' || attempt, ',' ORDER BY id) FROM queuebox.inbox"),
						"processed:0,pending:1,processed:0");
	assert_string_equal(val("SELECT last_error FROM queuebox.inbox WHERE payload->>'n' = '2'"),
						"message two always fails");
	assert_int_equal(c.completed, 2);
	assert_int_equal(c.retried, 1);
	assert_int_equal(c.claimed, 3);
}

/* a handler slower than three leases keeps its message: renewal; no other claimer gets it */
typedef struct Slow
{
	volatile bool started;
} Slow;

static int
h_slow(void *arg, const QbiMessage *m, PGconn *tx, const volatile bool *cancelled,
	   char *err, size_t errlen)
{
	Slow	   *s = arg;

	s->started = true;
	for (int i = 0; i < 40 && !*cancelled; i++)		/* 2 s, the lease is 0.6 s */
		usleep(50 * 1000);
	if (*cancelled)
	{
		snprintf(err, errlen, "cancelled");
		return -1;
	}
	return write_biz(tx, m, err, errlen);
}

static void
test_slow_handler_keeps(void **state)
{
	Slow		s = {0};
	Run		   *r;
	QbiCounters c;

	add_rows(1);
	r = start((QbiOptions) {.lease_ms = 600, .batch_size = 1}, h_slow, &s);
	while (!s.started)
		usleep(10 * 1000);
	/* past two leases: another claimer finds nothing to take over */
	usleep(1300 * 1000);
	assert_string_equal(val("SELECT count(*) FROM queuebox.inbox_claim('jobs', 5, 60000)"), "0");
	wait_for("SELECT state FROM queuebox.inbox", "processed");
	c = finish(r);
	assert_int_equal(c.lease_lost, 0);
	assert_int_equal(c.completed, 1);
	assert_string_equal(val("SELECT count(*) FROM biz"), "1");
}

/* a lost lease cancels the handler and rolls its writes back */
static int
h_until_cancelled(void *arg, const QbiMessage *m, PGconn *tx, const volatile bool *cancelled,
				  char *err, size_t errlen)
{
	Slow	   *s = arg;

	if (write_biz(tx, m, err, errlen) != 0)
		return -1;
	s->started = true;
	for (int i = 0; i < 200 && !*cancelled; i++)
		usleep(50 * 1000);
	snprintf(err, errlen, "%s", *cancelled ? "cancelled" : "never cancelled");
	return -1;
}

static void
test_lost_lease(void **state)
{
	Slow		s = {0};
	Run		   *r;
	QbiCounters c;

	add_rows(1);
	r = start((QbiOptions) {.lease_ms = 600, .batch_size = 1}, h_until_cancelled, &s);
	while (!s.started)
		usleep(10 * 1000);
	/* the lease expired behind the worker's back, and another claimer took the message */
	sql("UPDATE queuebox.inbox SET lease_until = now() - interval '1 second'");
	assert_string_equal(val("SELECT count(*) FROM queuebox.inbox_claim('jobs', 1, 60000)"), "1");
	for (int i = 0; i < 100; i++)
	{
		QbiCounters now;

		qbi_worker_counters(r->w, &now);
		if (now.lease_lost > 0)
			break;
		usleep(50 * 1000);
	}
	c = finish(r);
	assert_int_equal(c.lease_lost, 1);
	assert_int_equal(c.completed, 0);
	assert_int_equal(c.retried + c.dead, 0);
	assert_string_equal(val("SELECT count(*) FROM biz"), "0");
	/* the other claimer still holds it: nothing of the cancelled run changed the row */
	assert_string_equal(val("SELECT state || ':' || attempt FROM queuebox.inbox"), "processing:0");
}

/* retry then success; a custom policy sends a parse error straight to dead */
static int
h_flaky(void *arg, const QbiMessage *m, PGconn *tx, const volatile bool *cancelled,
		char *err, size_t errlen)
{
	if (payload_n(m) == 2)
	{
		snprintf(err, errlen, "parse error: field x");
		return -1;
	}
	if (m->attempt == 0)
	{
		snprintf(err, errlen, "temporary");
		return -1;
	}
	return write_biz(tx, m, err, errlen);
}

static QbiDecision
p_parse_dead(void *arg, const QbiMessage *m, const char *error)
{
	if (strncmp(error, "parse error", 11) == 0)
		return qbi_dead_letter();
	return qbi_retry_after(0);
}

static void
test_retry_and_policy(void **state)
{
	Run		   *r;
	QbiCounters c;

	add_rows(2);
	r = start((QbiOptions) {.policy = p_parse_dead}, h_flaky, NULL);
	wait_for("SELECT string_agg(state, ',' ORDER BY id) FROM queuebox.inbox", "processed,dead");
	c = finish(r);
	assert_string_equal(val("SELECT attempt FROM queuebox.inbox WHERE payload->>'n' = '1'"), "1");
	assert_string_equal(val("SELECT last_error FROM queuebox.inbox WHERE state = 'dead'"), "parse error: field x");
	assert_int_equal(c.retried, 1);
	assert_int_equal(c.dead, 1);
	assert_int_equal(c.completed, 1);
}

/* the default policy: backoff with jitter, dead on the fifth attempt */
static int
h_always_fails(void *arg, const QbiMessage *m, PGconn *tx, const volatile bool *cancelled,
			   char *err, size_t errlen)
{
	snprintf(err, errlen, "down");
	return -1;
}

static void
test_default_policy(void **state)
{
	QbiMessage	m = {0};
	Run		   *r;
	QbiCounters c;

	for (int a = 0; a < 4; a++)
	{
		long		base = 1000L << a;

		m.attempt = a;
		for (int k = 0; k < 50; k++)
		{
			QbiDecision d = qbi_default_policy(NULL, &m, "x");

			assert_false(d.dead);
			assert_in_range(d.delay_ms, base * 8 / 10, base * 12 / 10);
		}
	}
	m.attempt = 4;
	assert_true(qbi_default_policy(NULL, &m, "x").dead);
	/* in the database: the fifth attempt of a failing message makes it dead */
	add_rows(1);
	sql("UPDATE queuebox.inbox SET attempt = 4");
	r = start((QbiOptions) {0}, h_always_fails, NULL);
	wait_for("SELECT state FROM queuebox.inbox", "dead");
	c = finish(r);
	assert_int_equal(c.dead, 1);
	assert_string_equal(val("SELECT last_error FROM queuebox.inbox"), "down");
}

/* stop: a running handler keeps the grace; past it, nothing is completed and no attempt spent */
static int
h_short(void *arg, const QbiMessage *m, PGconn *tx, const volatile bool *cancelled,
		char *err, size_t errlen)
{
	Slow	   *s = arg;

	s->started = true;
	usleep(500 * 1000);
	return write_biz(tx, m, err, errlen);
}

static void
test_shutdown_grace(void **state)
{
	Slow		s = {0};
	Run		   *r;
	QbiCounters c;

	add_rows(2);
	r = start((QbiOptions) {.batch_size = 1, .shutdown_grace_ms = 3000}, h_short, &s);
	while (!s.started)
		usleep(10 * 1000);
	c = finish(r);
	/* the running one finished within the grace; no second claim after the stop */
	assert_int_equal(c.completed, 1);
	assert_int_equal(c.claimed, 1);
	assert_string_equal(val("SELECT string_agg(state, ',' ORDER BY id) FROM queuebox.inbox"), "processed,pending");
	assert_string_equal(val("SELECT count(*) FROM biz"), "1");

	clean(NULL);
	memset(&s, 0, sizeof(s));
	add_rows(1);
	r = start((QbiOptions) {.batch_size = 1, .shutdown_grace_ms = 300}, h_until_cancelled, &s);
	while (!s.started)
		usleep(10 * 1000);
	c = finish(r);
	assert_int_equal(c.completed + c.retried + c.dead, 0);
	assert_string_equal(val("SELECT count(*) FROM biz"), "0");
	/* left to its lease: still processing, no attempt spent */
	assert_string_equal(val("SELECT state || ':' || attempt FROM queuebox.inbox"), "processing:0");
}

/* max_concurrency 4 over 8 aggregates: parallel across aggregates, never within one, order kept */
typedef struct Conc
{
	pthread_mutex_t mu;
	int			running;
	int			max_running;
	int			per_agg[8];		/* running now, per aggregate */
	bool		overlap;		/* two of one aggregate at once */
	int			last_seq[8];	/* the last seq handled, per aggregate */
	bool		out_of_order;
	int			done;
} Conc;

static int
h_concurrent(void *arg, const QbiMessage *m, PGconn *tx, const volatile bool *cancelled,
			 char *err, size_t errlen)
{
	Conc	   *c = arg;
	int			agg = atoi(m->aggregate_id + 1);
	int			seq = payload_n(m);

	pthread_mutex_lock(&c->mu);
	c->running++;
	if (c->running > c->max_running)
		c->max_running = c->running;
	if (c->per_agg[agg]++ > 0)
		c->overlap = true;
	if (seq < c->last_seq[agg])
		c->out_of_order = true;
	c->last_seq[agg] = seq;
	pthread_mutex_unlock(&c->mu);
	usleep(60 * 1000);
	pthread_mutex_lock(&c->mu);
	c->running--;
	c->per_agg[agg]--;
	c->done++;
	pthread_mutex_unlock(&c->mu);
	return write_biz(tx, m, err, errlen);
}

static void
test_max_concurrency(void **state)
{
	Conc		c = {.mu = PTHREAD_MUTEX_INITIALIZER};
	Run		   *r;
	QbiCounters k;

	/* 8 aggregates a0..a7, 5 messages each, seq 1..40 in insertion order */
	sql("INSERT INTO queuebox.inbox (source, idempotency_key, aggregate_id, payload, consumption)"
		" SELECT 'jobs', 'c' || i, 'a' || (i % 8), jsonb_build_object('n', i), 'pull'"
		" FROM generate_series(1, 40) i");
	r = start((QbiOptions) {.max_concurrency = 4, .batch_size = 10}, h_concurrent, &c);
	wait_for("SELECT count(*) FROM queuebox.inbox WHERE state = 'processed'", "40");
	k = finish(r);
	assert_int_equal(k.completed, 40);
	assert_int_equal(c.done, 40);
	assert_false(c.overlap);
	assert_false(c.out_of_order);
	assert_true(c.max_running > 1);
	assert_true(c.max_running <= 4);
	assert_string_equal(val("SELECT count(*) FROM biz"), "40");
	print_message("max_concurrency 4: up to %d handlers ran at once\n", c.max_running);
}

static void
test_options(void **state)
{
	char		err[QBI_ERRLEN];

	assert_null(qbi_worker_new(&(QbiOptions) {.conninfo = dsn}, err, sizeof(err)));
	assert_non_null(strstr(err, "source"));
	assert_null(qbi_worker_new(&(QbiOptions) {.conninfo = dsn, .source = "s", .lease_ms = 50}, err, sizeof(err)));
	assert_non_null(strstr(err, "lease_ms at least 100"));
	assert_null(qbi_worker_new(&(QbiOptions) {.conninfo = dsn, .source = "s", .max_concurrency = 1000}, err, sizeof(err)));
	assert_non_null(strstr(err, "max_concurrency 1 to 256"));
}

/* the span hooks: the message's trace context, the span handed back at the end */
typedef struct Spans
{
	pthread_mutex_t mu;
	char		started[2][160];	/* "traceparent|tracestate" of each started span */
	int			nstarted;
	int			ended_rc[2];
	int			nended;
	bool		same_span;		/* span_end got what span_start returned */
} Spans;

static void *
s_start(void *arg, const QbiMessage *m)
{
	Spans	   *s = arg;
	int			i;

	pthread_mutex_lock(&s->mu);
	i = s->nstarted++;
	if (i < 2)
		snprintf(s->started[i], sizeof(s->started[i]), "%s|%s", m->traceparent ? m->traceparent : "-",
				 m->tracestate ? m->tracestate : "-");
	pthread_mutex_unlock(&s->mu);
	return (void *) (intptr_t) (i + 1000);
}

static void
s_end(void *arg, void *span, int rc, const char *error)
{
	Spans	   *s = arg;

	pthread_mutex_lock(&s->mu);
	if (s->nended < 2)
		s->ended_rc[s->nended] = rc;
	s->same_span = s->same_span && (intptr_t) span == s->nended + 1000 && error != NULL;
	s->nended++;
	pthread_mutex_unlock(&s->mu);
}

static int
h_ok(void *arg, const QbiMessage *m, PGconn *tx, const volatile bool *cancelled, char *err, size_t errlen)
{
	return 0;
}

static void
test_trace_context(void **state)
{
	Spans		s = {.mu = PTHREAD_MUTEX_INITIALIZER, .same_span = true};
	Run		   *r;
	char		err[QBI_ERRLEN];

	assert_null(qbi_worker_new(&(QbiOptions) {.conninfo = dsn, .source = "s", .span_start = s_start}, err, sizeof(err)));
	assert_non_null(strstr(err, "span_start and span_end both"));
	sql("INSERT INTO queuebox.inbox (source, idempotency_key, payload, headers, consumption) VALUES"
		" ('jobs', 't1', '{}', '{\"TraceParent\": \"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\","
		" \"tracestate\": \"congo=1\"}', 'pull'),"
		" ('jobs', 't2', '{}', '{\"traceparent\": \"00-00000000000000000000000000000000-00f067aa0ba902b7-01\"}', 'pull')");
	r = start((QbiOptions) {.span_start = s_start, .span_end = s_end, .span_arg = &s}, h_ok, NULL);
	wait_for("SELECT count(*) FROM queuebox.inbox WHERE state = 'processed'", "2");
	finish(r);
	assert_int_equal(s.nstarted, 2);
	assert_int_equal(s.nended, 2);
	assert_true(s.same_span);
	/* claimed in id order, handled one at a time (max_concurrency 1) */
	assert_string_equal(s.started[0], "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01|congo=1");
	assert_string_equal(s.started[1], "-|-");	/* an all-zero trace-id is ignored */
	assert_int_equal(s.ended_rc[0], 0);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_options),
		cmocka_unit_test_setup(test_commit_together, clean),
		cmocka_unit_test_setup(test_slow_handler_keeps, clean),
		cmocka_unit_test_setup(test_lost_lease, clean),
		cmocka_unit_test_setup(test_retry_and_policy, clean),
		cmocka_unit_test_setup(test_default_policy, clean),
		cmocka_unit_test_setup(test_shutdown_grace, clean),
		cmocka_unit_test_setup(test_max_concurrency, clean),
		cmocka_unit_test_setup(test_trace_context, clean),
	};

	if ((dsn = getenv("QBI_TEST_DSN")) == NULL)
	{
		fprintf(stderr, "usage: QBI_TEST_DSN=... test_worker (TAP 032 runs it)\n");
		return 2;
	}
	admin = PQconnectdb(dsn);
	if (PQstatus(admin) != CONNECTION_OK)
	{
		fprintf(stderr, "test_worker: %s", PQerrorMessage(admin));
		return 2;
	}
	return cmocka_run_group_tests(tests, NULL, NULL);
}
