/*-------------------------------------------------------------------------
 * test_admin.c
 *	  Unit tests of qb_admin.c against a store that records what it is
 *	  asked: each route's query and parameters (the query string's in the
 *	  store's order, times normalised, the actor last on writes), the 400s
 *	  of bad parameters with nothing asked of the store, a page's rows and
 *	  its X-QueueBox-Next-After, a missing row's 404, the log line of a
 *	  write.  The routes against real databases are TAP 008, 021, 030, 031.
 *-------------------------------------------------------------------------
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include <jansson.h>

#include "qb_admin.h"

typedef struct Rec
{
	int			calls;
	QbQuery		query;
	char		params[10][128];	/* "-" for NULL */
	const char *answer;			/* what the store returns; NULL: no row */
	int			rc;
	char		log[512];
} Rec;

static Rec rec;

static int
rec_query(void *ctx, QbQuery query, const char *const *params, long timeout_ms,
		  char **out, char *err, size_t errlen)
{
	rec.calls++;
	rec.query = query;
	for (int i = 0; i < 10; i++)
		snprintf(rec.params[i], sizeof(rec.params[i]), "%s", params && params[i] ? params[i] : "-");
	*out = rec.answer ? strdup(rec.answer) : NULL;
	snprintf(err, errlen, "no data found");
	return rec.rc;
}

static void
rec_log(void *ctx, QbLogLevel level, const char *msg)
{
	snprintf(rec.log, sizeof(rec.log), "%s", msg);
}

static const QbStore store = {.query_text = rec_query};
static const QbHost host = {.log = rec_log};

/* run: one request; args "a=1&b=" as name/value pairs; returns the answer */
static QbAdminAnswer
run(const char *method, const char *path, const char *args, const char *body)
{
	QbAdminArg a[QB_ADMIN_MAX_ARGS + 1];
	char		buf[512];
	int			n = 0;
	QbAdminRequest req = {.method = method, .path = path, .body = body,
	.body_len = body ? strlen(body) : 0, .actor = "admin route from 127.0.0.1"};
	QbAdminAnswer ans;

	snprintf(buf, sizeof(buf), "%s", args ? args : "");
	for (char *p = strtok(buf, "&"); p != NULL && n <= QB_ADMIN_MAX_ARGS; p = strtok(NULL, "&"))
	{
		char	   *eq = strchr(p, '=');

		if (eq)
			*eq = '\0';
		a[n].name = strdup(p);
		a[n].value = eq ? strdup(eq + 1) : NULL;
		n++;
	}
	req.args = a;
	req.nargs = n;
	rec.calls = 0;
	rec.log[0] = '\0';
	qb_admin_handle(&host, &store, 1000, &req, &ans);
	for (int i = 0; i < n; i++)
	{
		free((char *) a[i].name);
		free((char *) a[i].value);
	}
	return ans;
}

static void
test_dead_list_params(void **state)
{
	QbAdminAnswer a;

	rec.answer = "{\"rows\": [{\"id\": 5}, {\"id\": 9}], \"next_after\": 9}";
	rec.rc = 0;
	a = run("GET", "/outbox/dead",
			"limit=2&error=Teapot&since=2026-12-01&until=2026-12-02T10:00:00+01:00&topic=&key=k1&after=4", NULL);
	assert_int_equal(a.status, 200);
	assert_string_equal(a.body, "[{\"id\":5},{\"id\":9}]");
	assert_string_equal(a.next_after, "9");
	assert_int_equal(rec.query, QB_Q_DEAD_OUTBOX);
	/* destination, topic (empty: no filter), key, error, since, until, after, limit */
	assert_string_equal(rec.params[0], "-");
	assert_string_equal(rec.params[1], "-");
	assert_string_equal(rec.params[2], "k1");
	assert_string_equal(rec.params[3], "Teapot");
	assert_string_equal(rec.params[4], "2026-12-01T00:00:00Z");
	assert_string_equal(rec.params[5], "2026-12-02T10:00:00+01:00");
	assert_string_equal(rec.params[6], "4");
	assert_string_equal(rec.params[7], "2");
	assert_string_equal(rec.log, "");	/* a read is not logged */
	free(a.body);

	/* the last page: no header; a time without a zone is UTC */
	rec.answer = "{\"rows\": [], \"next_after\": null}";
	a = run("GET", "/inbox/dead", "source=stripe&since=2026-12-01T09:30", NULL);
	assert_int_equal(a.status, 200);
	assert_string_equal(a.body, "[]");
	assert_string_equal(a.next_after, "");
	assert_int_equal(rec.query, QB_Q_DEAD_INBOX);
	assert_string_equal(rec.params[0], "stripe");
	assert_string_equal(rec.params[5], "2026-12-01T09:30Z");
	free(a.body);
}

static void
test_bad_params(void **state)
{
	static const struct
	{
		const char *path;
		const char *args;
		const char *reason;
	}			cases[] = {
		{"/outbox/dead", "limit=0", "limit must be a whole number from 1 to 1000"},
		{"/outbox/dead", "limit=1001", "limit must be a whole number from 1 to 1000"},
		{"/outbox/dead", "limit=1x", "limit must be a whole number from 1 to 1000"},
		{"/outbox/held", "limit=10001", "limit must be a whole number from 1 to 10000"},
		{"/outbox/dead", "after=-1", "after must be an id"},
		{"/outbox/dead", "since=2026-02-30x", "since must be an ISO 8601 time"},
		{"/outbox/dead", "since=2026-13-01", "since must be an ISO 8601 time"},
		{"/outbox/dead", "until=2026-12-01T25:00:00Z", "until must be an ISO 8601 time"},
		{"/outbox/dead", "until=2026-12-01T10:00:00.Z", "until must be an ISO 8601 time"},
		{"/outbox/dead", "since=yesterday", "since must be an ISO 8601 time"},
		{"/outbox/dead", "source=x", "unknown query parameter \"source\"; this route takes: destination, topic, key, error, since, until, after, limit"},
		{"/inbox/dead", "topic=x", "unknown query parameter \"topic\"; this route takes: source, event_type, idempotency_key, aggregate_id, error, since, until, after, limit"},
		{"/outbox/dead", "key=a&key=b", "query parameter \"key\" is given twice"},
		{"/outbox/7", "x=1", "unknown query parameter \"x\"; this route takes: none"},
		{"/inbox/lookup", "source=s", "idempotency_key is required"},
		{"/inbox/lookup", "idempotency_key=k", "source is required"},
		{"/outbox/dead", "a=1&b=2&c=3&d=4&e=5&f=6&g=7&h=8&i=9&j=10&k=11&l=12&m=13&n=14&o=15&p=16&q=17",
		"too many query parameters (at most 16)"},
	};

	rec.answer = "{}";
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
	{
		QbAdminAnswer a = run("GET", cases[i].path, cases[i].args, NULL);
		json_t	   *j = json_loads(a.body, 0, NULL);
		const char *reason = json_string_value(json_object_get(j, "reason"));

		if (a.status != 400 || reason == NULL || strstr(reason, cases[i].reason) == NULL)
			fail_msg("%s?%s: %d %s", cases[i].path, cases[i].args, a.status, a.body);
		json_decref(j);
		assert_int_equal(rec.calls, 0);
		free(a.body);
	}
}

/* a body on a by-id route that takes none is refused before any query */
static void
test_body_refused(void **state)
{
	static const char *const paths[] = {"/outbox/7/replay", "/outbox/7/skip", "/inbox/7/replay",
	"/inbox/7/skip", "/destinations/web/resume", "/destinations/web/reset"};

	rec.answer = "{}";
	for (size_t i = 0; i < sizeof(paths) / sizeof(paths[0]); i++)
	{
		QbAdminAnswer a = run("POST", paths[i], NULL, "{\"payload\": 1}");

		if (a.status != 400 || strstr(a.body, "takes no body") == NULL)
			fail_msg("%s: %d %s", paths[i], a.status, a.body);
		assert_int_equal(rec.calls, 0);
		free(a.body);
	}
	/* requeue and pause take theirs */
	for (size_t i = 0; i < 2; i++)
	{
		QbAdminAnswer a = run("POST", i == 0 ? "/inbox/7/requeue" : "/destinations/web/pause", NULL,
							  i == 0 ? "{\"payload\": 1}" : "{\"seconds\": 60}");

		assert_int_equal(a.status, 200);
		assert_int_equal(rec.calls, 1);
		assert_int_equal(rec.query, i == 0 ? QB_Q_REQUEUE_INBOX_EDITED : QB_Q_PAUSE_DESTINATION);
		free(a.body);
	}
}

static void
test_rows_and_lookup(void **state)
{
	QbAdminAnswer a;

	rec.answer = NULL;			/* no such row */
	a = run("GET", "/outbox/42", NULL, NULL);
	assert_int_equal(a.status, 404);
	assert_non_null(strstr(a.body, "no outbox row with id 42"));
	assert_int_equal(rec.query, QB_Q_OUTBOX_ROW);
	assert_string_equal(rec.params[0], "42");
	free(a.body);
	a = run("GET", "/inbox/lookup", "source=stripe&idempotency_key=evt_9", NULL);
	assert_int_equal(a.status, 404);
	assert_non_null(strstr(a.body, "no row from source stripe with idempotency key evt_9: it did not arrive, or retention has deleted it"));
	assert_int_equal(rec.query, QB_Q_INBOX_LOOKUP);
	free(a.body);
	rec.answer = "{\"id\": 3, \"payload\": {\"a\": 1}}";
	a = run("GET", "/inbox/3", NULL, NULL);
	assert_int_equal(a.status, 200);
	assert_string_equal(a.body, rec.answer);
	assert_int_equal(rec.query, QB_Q_INBOX_ROW);
	free(a.body);
	a = run("POST", "/outbox/3", NULL, NULL);
	assert_int_equal(a.status, 405);
	free(a.body);
	a = run("GET", "/outbox/3/x/y", NULL, NULL);
	assert_int_equal(a.status, 404);
	free(a.body);
}

static void
test_writes_take_the_actor(void **state)
{
	QbAdminAnswer a;

	rec.answer = "{\"requeued\" : true}";
	a = run("POST", "/outbox/12/requeue", NULL, "{\"payload\": {\"secret\": 1}}");
	assert_int_equal(a.status, 200);
	assert_int_equal(rec.query, QB_Q_REQUEUE_OUTBOX_EDITED);
	assert_string_equal(rec.params[0], "12");
	assert_string_equal(rec.params[1], "{\"secret\":1}");
	assert_string_equal(rec.params[2], "admin route from 127.0.0.1");
	assert_string_equal(rec.log, "admin: requeue outbox 12: 200 {\"requeued\" : true} (admin route from 127.0.0.1)");
	free(a.body);

	rec.answer = "{\"requeued\" : 3}";
	a = run("POST", "/inbox/requeue", NULL, "{\"source\": \"stripe\"}");
	assert_int_equal(rec.query, QB_Q_REQUEUE_INBOX_BULK);
	assert_string_equal(rec.params[0], "stripe");
	assert_string_equal(rec.params[3], "admin route from 127.0.0.1");
	free(a.body);

	rec.answer = "{\"paused_until\" : \"2026-12-02T12:00:00+00:00\", \"known\" : true}";
	a = run("POST", "/destinations/web/pause", NULL, "{\"seconds\": 600}");
	assert_int_equal(a.status, 200);
	assert_int_equal(rec.query, QB_Q_PAUSE_DESTINATION);
	assert_string_equal(rec.params[0], "web");
	assert_string_equal(rec.params[1], "600");
	assert_string_equal(rec.params[2], "admin route from 127.0.0.1");
	assert_non_null(strstr(rec.log, "admin: pause destination web for 600 s: 200"));
	free(a.body);

	/* refused before the store: a bad body, a query parameter; still logged */
	a = run("POST", "/destinations/web/pause", NULL, "{\"seconds\": 0}");
	assert_int_equal(a.status, 400);
	assert_int_equal(rec.calls, 0);
	assert_string_equal(rec.log, "admin: pause destination web: 400 (admin route from 127.0.0.1)");
	free(a.body);
	a = run("POST", "/destinations/web/pause", NULL, "{}");
	assert_int_equal(a.status, 400);
	assert_non_null(strstr(a.body, "seconds"));
	free(a.body);
	a = run("POST", "/outbox/12/replay", "x=1", NULL);
	assert_int_equal(a.status, 400);
	assert_int_equal(rec.calls, 0);
	free(a.body);

	/* an unknown destination: the store's not found, or known false */
	rec.rc = QB_QUERY_NOT_FOUND;
	rec.answer = NULL;
	a = run("POST", "/destinations/nosuch/pause", NULL, "{\"seconds\": 60}");
	assert_int_equal(a.status, 404);
	assert_non_null(strstr(a.body, "no destination of this name in the configuration"));
	free(a.body);
	rec.rc = 0;
	rec.answer = "{\"known\" : false, \"reset\" : false}";
	a = run("POST", "/destinations/nosuch/reset", NULL, NULL);
	assert_int_equal(a.status, 404);
	assert_int_equal(rec.query, QB_Q_RESET_DESTINATION);
	assert_string_equal(rec.params[1], "admin route from 127.0.0.1");
	free(a.body);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_dead_list_params),
		cmocka_unit_test(test_bad_params),
		cmocka_unit_test(test_body_refused),
		cmocka_unit_test(test_rows_and_lookup),
		cmocka_unit_test(test_writes_take_the_actor),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
