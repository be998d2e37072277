/*
 * test_enqueue.c
 *	  qbi_enqueue (src/qbi_outbox.c, docs/enqueue.md) on a real PostgreSQL
 *	  with the queuebox extension whose outbox delivers topics enq.** to the
 *	  real HTTP sink (TAP 064 starts both): QBI_TEST_DSN, and
 *	  QBI_TEST_SINK_LOG the sink's JSONL log.  Each test counts rows before
 *	  and after.
 */
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

static const char *sink_log;
static PGconn *admin;			/* autocommit: counts and checks */
static PGconn *app;				/* the application's: its transactions */

/* the first value of q with params, as text (static buffer, "" for none) */
static const char *
val(const char *q, int n, const char *const *params)
{
	static char buf[4096];
	PGresult   *r = PQexecParams(admin, q, n, NULL, params, NULL, NULL, 0);

	if (PQresultStatus(r) != PGRES_TUPLES_OK && PQresultStatus(r) != PGRES_COMMAND_OK)
		fail_msg("admin: %s\n%s", PQresultErrorMessage(r), q);
	snprintf(buf, sizeof(buf), "%s", PQntuples(r) > 0 ? PQgetvalue(r, 0, 0) : "");
	PQclear(r);
	return buf;
}

static void
exec_app(const char *q)
{
	PGresult   *r = PQexec(app, q);

	if (PQresultStatus(r) != PGRES_COMMAND_OK)
		fail_msg("app: %s\n%s", PQresultErrorMessage(r), q);
	PQclear(r);
}

static long
count(const char *table)
{
	char		q[200];

	snprintf(q, sizeof(q), "SELECT count(*) FROM %s", table);
	return atol(val(q, 0, NULL));
}

/* the row's column, as text */
static const char *
col(int64_t id, const char *expr)
{
	char		q[300],
				sid[32];
	const char *p[1] = {sid};

	snprintf(sid, sizeof(sid), "%lld", (long long) id);
	snprintf(q, sizeof(q), "SELECT %s FROM queuebox.outbox WHERE id = $1", expr);
	return val(q, 1, p);
}

/* waits for the row to be sent: a deadline (120 s), not a timed assertion */
static void
wait_sent(int64_t id)
{
	for (int i = 0; i < 1200; i++)
	{
		const char *s = col(id, "state");

		if (strcmp(s, "sent") == 0)
			return;
		if (strcmp(s, "dead") == 0)
			fail_msg("row %lld went dead", (long long) id);
		usleep(100000);
	}
	fail_msg("row %lld was not delivered", (long long) id);
}

/*
 * The sink's requests for the row, in log order: how many, and the
 * traceparent header of the first (jsonb's ->> reads the log's JSON lines).
 */
static int
sink_requests(int64_t id, char *traceparent, size_t len)
{
	char		mid[64];
	FILE	   *f = fopen(sink_log, "r");
	char	   *line = NULL;
	size_t		cap = 0;
	int			n = 0;

	snprintf(mid, sizeof(mid), "%s", col(id, "message_id::text"));
	if (traceparent)
		traceparent[0] = '\0';
	while (f != NULL && getline(&line, &cap, f) > 0)
	{
		const char *p[2] = {line, mid};

		if (strcmp(val("SELECT ($1::jsonb)->'headers'->>'x-message-id' = $2", 2, p), "t") != 0)
			continue;
		if (n++ == 0 && traceparent)
			snprintf(traceparent, len, "%s", val("SELECT coalesce(($1::jsonb)->'headers'->>'traceparent', '')", 1, p));
	}
	free(line);
	if (f)
		fclose(f);
	return n;
}

/* the test's tracer: the current span, one per thread in an application */
static char span_parent[QBI_TRACEPARENT_LEN + 1];
static const char *span_state = "";

static bool
current_span(void *arg, char traceparent[QBI_TRACEPARENT_LEN + 1], char *tracestate, size_t len)
{
	if (span_parent[0] == '\0')
		return false;
	memcpy(traceparent, span_parent, sizeof(span_parent));
	snprintf(tracestate, len, "%s", span_state);
	return true;
}

static void
enqueue_ok(const QbiOutboxMessage *m, int n, int64_t *ids)
{
	char		err[QBI_ERRLEN];

	if (qbi_enqueue(app, m, n, ids, err, sizeof(err)) != 0)
		fail_msg("%s", err);
}

static void
together(void **state)
{
	long		biz0 = count("enq_c_biz"),
				out0 = count("queuebox.outbox");
	QbiOutboxMessage m = {.topic = "enq.c.together", .key = "k-together", .payload_json = "{\"n\": 1}"};
	int64_t		id;
	char		tp[64];

	exec_app("BEGIN");
	exec_app("INSERT INTO enq_c_biz VALUES (1)");
	enqueue_ok(&m, 1, &id);
	exec_app("ROLLBACK");
	assert_int_equal(count("enq_c_biz"), biz0);
	assert_int_equal(count("queuebox.outbox"), out0);

	m.payload_json = "{\"n\": 2}";
	exec_app("BEGIN");
	exec_app("INSERT INTO enq_c_biz VALUES (2)");
	enqueue_ok(&m, 1, &id);
	exec_app("COMMIT");
	assert_int_equal(count("enq_c_biz"), biz0 + 1);
	assert_int_equal(count("queuebox.outbox"), out0 + 1);
	wait_sent(id);
	assert_int_equal(sink_requests(id, tp, sizeof(tp)), 1);
	assert_string_equal(col(id, "payload->>'n'"), "2");
}

static void
traced(void **state)
{
	const char *own = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
	const char *names[] = {"TraceParent", "x-tenant"},
			   *values[] = {own, "acme"},
			   *bad[] = {"00-xyz-01"};
	QbiOutboxMessage m = {.topic = "enq.c.traced", .payload_json = "\"traced\""};
	int64_t		id;
	char		tp[64],
				want[512],
				err[QBI_ERRLEN];

	/* a span of this test's own: a random trace and span id */
	snprintf(span_parent, sizeof(span_parent), "00-%s-01",
			 val("SELECT md5(random()::text) || '-' || left(md5(random()::text), 16)", 0, NULL));
	span_state = "congo=t61";
	exec_app("BEGIN");
	enqueue_ok(&m, 1, &id);
	exec_app("COMMIT");
	wait_sent(id);
	assert_string_equal(col(id, "headers->>'traceparent'"), span_parent);
	assert_string_equal(col(id, "headers->>'tracestate'"), "congo=t61");
	assert_int_equal(sink_requests(id, tp, sizeof(tp)), 1);
	/* a child at the sink: the span's trace-id and flags, a span-id of its own */
	assert_int_equal(strlen(tp), QBI_TRACEPARENT_LEN);
	assert_memory_equal(tp, span_parent, 36);
	assert_string_equal(tp + 52, "-01");
	assert_memory_not_equal(tp + 36, span_parent + 36, 16);

	/* the caller's traceparent wins; a malformed one is refused, naming the format */
	m.header_names = names;
	m.header_values = values;
	m.nheaders = 2;
	exec_app("BEGIN");
	enqueue_ok(&m, 1, &id);
	m.header_values = bad;
	m.nheaders = 1;
	assert_int_equal(qbi_enqueue(app, &m, 1, NULL, err, sizeof(err)), -1);
	assert_non_null(strstr(err, "the traceparent header \"00-xyz-01\" is malformed: a traceparent is "
						   "00-<trace-id: 32 hex>-<parent-id: 16 hex>-<flags: 2 hex>"));
	exec_app("COMMIT");
	snprintf(want, sizeof(want), "%s", col(id, "headers::text"));
	assert_non_null(strstr(want, own));
	assert_null(strstr(want, span_parent + 36));
	assert_string_equal(col(id, "headers->>'x-tenant'"), "acme");

	/* no traceparent of the caller's: its tracestate (any letter case) gives way to the span's */
	snprintf(span_parent, sizeof(span_parent), "00-%s-01",
			 val("SELECT md5(random()::text) || '-' || left(md5(random()::text), 16)", 0, NULL));
	{
		const char *snames[] = {"TraceState", "x-tenant"},
				   *svalues[] = {"caller=1", "acme"};
		char		longstate[513];

		m.header_names = snames;
		m.header_values = svalues;
		m.nheaders = 2;
		exec_app("BEGIN");
		enqueue_ok(&m, 1, &id);
		exec_app("COMMIT");
		/* (jsonb's text: the shorter keys first) */
		snprintf(want, sizeof(want), "{\"x-tenant\": \"acme\", \"tracestate\": \"congo=t61\", \"traceparent\": \"%s\"}",
				 span_parent);
		assert_string_equal(col(id, "headers::text"), want);

		/* a tracestate of 512 characters, the most the hook can give, is kept whole */
		memset(longstate, 'a', 512);
		memcpy(longstate, "k=", 2);
		longstate[512] = '\0';
		span_state = longstate;
		m.nheaders = 0;
		exec_app("BEGIN");
		enqueue_ok(&m, 1, &id);
		exec_app("COMMIT");
		assert_string_equal(col(id, "length(headers->>'tracestate')"), "512");
		span_state = "congo=t61";
	}

	/* no span: no header */
	span_parent[0] = '\0';
	m.nheaders = 0;
	exec_app("BEGIN");
	enqueue_ok(&m, 1, &id);
	exec_app("COMMIT");
	assert_string_equal(col(id, "headers::text"), "{}");
}

static void
batch(void **state)
{
	long		out0 = count("queuebox.outbox");
	QbiOutboxMessage m[5];
	int64_t		ids[5];
	char		payloads[5][32],
				err[QBI_ERRLEN],
				q[400];

	for (int i = 0; i < 5; i++)
	{
		snprintf(payloads[i], sizeof(payloads[i]), "{\"n\": %d}", i + 1);
		m[i] = (QbiOutboxMessage) {.topic = "enq.c.batch", .key = "k-batch", .payload_json = payloads[i]};
	}
	exec_app("BEGIN");
	enqueue_ok(m, 5, ids);
	exec_app("COMMIT");
	assert_int_equal(count("queuebox.outbox"), out0 + 5);
	for (int i = 0; i < 5; i++)
	{
		if (i > 0)
			assert_true(ids[i] > ids[i - 1]);
		assert_int_equal(atoi(col(ids[i], "payload->>'n'")), i + 1);
		wait_sent(ids[i]);
	}
	/* the sink got them in the batch's order: each request's time after the one before */
	snprintf(q, sizeof(q), "SELECT count(*) FROM queuebox.outbox WHERE id BETWEEN %lld AND %lld AND state = 'sent'",
			 (long long) ids[0], (long long) ids[4]);
	assert_string_equal(val(q, 0, NULL), "5");
	{
		FILE	   *f = fopen(sink_log, "r");
		char	   *line = NULL;
		size_t		cap = 0;
		char		order[64] = "";

		while (f != NULL && getline(&line, &cap, f) > 0)
		{
			const char *p[1] = {line};

			if (strcmp(val("SELECT ($1::jsonb)->>'path' = '/enq' AND (($1::jsonb)->>'body')::jsonb ? 'n'"
						   " AND ($1::jsonb)->'headers'->>'x-message-id' IN (SELECT message_id::text FROM queuebox.outbox"
						   " WHERE topic = 'enq.c.batch')", 1, p), "t") == 0)
				strncat(order, val("SELECT (($1::jsonb)->>'body')::jsonb->>'n'", 1, p), sizeof(order) - strlen(order) - 1);
		}
		free(line);
		if (f)
			fclose(f);
		assert_string_equal(order, "12345");
	}
	/* a bad message refuses the whole batch: nothing written */
	m[1].topic = "";
	exec_app("BEGIN");
	assert_int_equal(qbi_enqueue(app, m, 2, NULL, err, sizeof(err)), -1);
	assert_non_null(strstr(err, "message 1: topic is empty"));
	exec_app("COMMIT");
	assert_int_equal(count("queuebox.outbox"), out0 + 5);

	/* no transaction: refused, nothing committed on its own */
	m[1].topic = "enq.c.batch";
	assert_int_equal(qbi_enqueue(app, m, 1, NULL, err, sizeof(err)), -1);
	assert_non_null(strstr(err, "the connection is in no transaction: send BEGIN first"));
	assert_int_equal(count("queuebox.outbox"), out0 + 5);

	/*
	 * Two statements (13200 messages of 5 bound values: over 65535), the
	 * second refused by the server: none of the first's rows stay, and the
	 * transaction is still usable.
	 */
	{
		int			big = 13200;
		QbiOutboxMessage *many = calloc((size_t) big, sizeof(*many));
		PGresult   *r;

		assert_non_null(many);
		for (int i = 0; i < big; i++)
			many[i] = (QbiOutboxMessage) {.topic = "enq.c.batch.never", .payload_json = i == big - 1 ? "not json" : "1"};
		exec_app("BEGIN");
		assert_int_equal(qbi_enqueue(app, many, big, NULL, err, sizeof(err)), -1);
		assert_non_null(strstr(err, "invalid input syntax for type json"));
		r = PQexec(app, "SELECT count(*) FROM queuebox.outbox WHERE topic = 'enq.c.batch.never'");
		assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
		assert_string_equal(PQgetvalue(r, 0, 0), "0");
		PQclear(r);
		exec_app("COMMIT");
		free(many);
	}
	assert_int_equal(count("queuebox.outbox"), out0 + 5);
}

static void
delayed(void **state)
{
	time_t		at = time(NULL) + 3600;
	QbiOutboxMessage m[2] = {
		{.topic = "enq.c.delayed", .payload_json = "\"later\"", .scheduled_at = at, .max_attempts = 2},
		{.topic = "enq.c.delayed", .payload_json = "\"now\""},
	};
	int64_t		ids[2];
	char		sid[32],
				sat[32];
	const char *p[2] = {sid, sat};

	exec_app("BEGIN");
	enqueue_ok(m, 2, ids);
	exec_app("COMMIT");
	wait_sent(ids[1]);			/* written after it, delivered: the outbox passed it */
	assert_string_equal(col(ids[0], "state || '/' || attempt || '/' || max_attempts"), "pending/0/2");
	snprintf(sid, sizeof(sid), "%lld", (long long) ids[0]);
	snprintf(sat, sizeof(sat), "%lld", (long long) at);
	assert_string_equal(val("SELECT scheduled_at = to_timestamp($2::float8) FROM queuebox.outbox WHERE id = $1", 2, p), "t");
	assert_int_equal(sink_requests(ids[0], NULL, 0), 0);
	val("UPDATE queuebox.outbox SET scheduled_at = now() WHERE id = $1", 1, p);
	wait_sent(ids[0]);
}

/* no span is current between tests */
static int
no_span(void **state)
{
	span_parent[0] = '\0';
	return 0;
}

int
main(void)
{
	const char *dsn = getenv("QBI_TEST_DSN");
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(together, no_span),
		cmocka_unit_test_teardown(traced, no_span),
		cmocka_unit_test_teardown(batch, no_span),
		cmocka_unit_test_teardown(delayed, no_span),
	};

	sink_log = getenv("QBI_TEST_SINK_LOG");
	if (dsn == NULL || sink_log == NULL)
	{
		fprintf(stderr, "QBI_TEST_DSN and QBI_TEST_SINK_LOG are not set (TAP 064 runs these tests)\n");
		return 2;
	}
	admin = PQconnectdb(dsn);
	app = PQconnectdb(dsn);
	if (PQstatus(admin) != CONNECTION_OK || PQstatus(app) != CONNECTION_OK)
	{
		fprintf(stderr, "%s: %s", dsn, PQerrorMessage(admin));
		return 2;
	}
	val("CREATE TABLE IF NOT EXISTS enq_c_biz (n int NOT NULL)", 0, NULL);
	qbi_set_trace_hook(current_span, NULL);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
