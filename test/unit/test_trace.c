/*-------------------------------------------------------------------------
 * test_trace.c
 *	  Unit tests of qb_trace.c: W3C traceparent parsing (the spec's valid
 *	  and invalid forms), children, sqlcommenter comments, and the headers
 *	  of a publish.
 *-------------------------------------------------------------------------
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include <jansson.h>

#include "qb_trace.h"

#define TP "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

static void
test_parse(void **state)
{
	QbTraceContext c;
	char		out[QB_TRACEPARENT_LEN + 1];
	static const char *const bad[] = {
		"", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",	/* short */
		"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",	/* upper case */
		"00-00000000000000000000000000000000-00f067aa0ba902b7-01",	/* zero trace-id */
		"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",	/* zero parent-id */
		"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",	/* version ff */
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",	/* 00 with more */
		"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",	/* later, no '-' after */
		"00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01", NULL};

	assert_true(qb_trace_parse(TP, &c));
	assert_int_equal(c.trace_id[0], 0x4b);
	assert_int_equal(c.span_id[7], 0xb7);
	assert_int_equal(c.flags, 1);
	qb_trace_format(&c, out);
	assert_string_equal(out, TP);
	/* a later version is read by its first four fields */
	assert_true(qb_trace_parse("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-the-future", &c));
	qb_trace_format(&c, out);
	assert_string_equal(out, TP);
	for (int i = 0; bad[i]; i++)
		assert_false(qb_trace_parse(bad[i], &c));
	assert_false(qb_trace_parse(NULL, &c));
}

static void
test_child(void **state)
{
	QbTraceContext p;
	QbTraceContext a;
	QbTraceContext b;

	assert_true(qb_trace_parse(TP, &p));
	assert_true(qb_trace_child(&p, &a));
	assert_true(qb_trace_child(&p, &b));
	assert_memory_equal(a.trace_id, p.trace_id, 16);
	assert_int_equal(a.flags, p.flags);
	assert_memory_not_equal(a.span_id, p.span_id, 8);
	assert_memory_not_equal(a.span_id, b.span_id, 8);
}

static void
test_from_sql(void **state)
{
	char		tp[QB_TRACEPARENT_LEN + 1];
	char		ts[QB_TRACESTATE_MAX + 1];

	/* what sqlcommenter (node, python) writes: keys sorted, values URL-encoded */
	assert_true(qb_trace_from_sql("INSERT INTO queuebox.outbox (topic, payload) VALUES ($1, $2) "
								  "/*db_driver='node-postgres',traceparent='" TP "',"
								  "tracestate='congo%3Dt61rcWkgMzE%2Crojo%3D00f067aa0ba902b7'*/", tp, ts));
	assert_string_equal(tp, TP);
	assert_string_equal(ts, "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7");
	/* a comment in front, and none of tracestate */
	assert_true(qb_trace_from_sql("/*traceparent='" TP "'*/ INSERT INTO t VALUES (1)", tp, ts));
	assert_string_equal(ts, "");
	/* an invalid traceparent, a key in a string not a comment, no comment */
	assert_false(qb_trace_from_sql("INSERT INTO t /*traceparent='00-xyz'*/ VALUES (1)", tp, ts));
	assert_false(qb_trace_from_sql("INSERT INTO t VALUES ('traceparent=''" TP "''')", tp, ts));
	assert_false(qb_trace_from_sql("INSERT INTO t VALUES (1)", tp, ts));
	assert_false(qb_trace_from_sql("INSERT /* unterminated", tp, ts));
	assert_false(qb_trace_from_sql(NULL, tp, ts));
	/* a key that only ends in traceparent is not it */
	assert_false(qb_trace_from_sql("/*xtraceparent='" TP "'*/", tp, ts));
	/* the second comment holds it */
	assert_true(qb_trace_from_sql("/* hint */ SELECT 1 /*traceparent='" TP "'*/", tp, ts));
}

static void
test_tracestate(void **state)
{
	char		big[QB_TRACESTATE_MAX + 2];

	assert_true(qb_tracestate_ok(""));
	assert_true(qb_tracestate_ok("congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"));
	assert_false(qb_tracestate_ok("a=\"b\""));
	assert_false(qb_tracestate_ok("a=b\\c"));
	assert_false(qb_tracestate_ok("a=b\nc=d"));
	memset(big, 'a', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	assert_false(qb_tracestate_ok(big));
	big[QB_TRACESTATE_MAX] = '\0';
	assert_true(qb_tracestate_ok(big));
}

static void
test_publish(void **state)
{
	json_t	   *h = json_pack("{s:s, s:s, s:s}", "Traceparent", TP, "tracestate", "a=b", "X-Other", "1");
	QbTraceContext parent;
	QbTraceContext child;
	QbTraceContext sent;
	const char *v;

	assert_true(qb_trace_publish(h, &parent, &child));
	/* one traceparent, lower case, a child of the stored one; the rest kept */
	assert_null(json_object_get(h, "Traceparent"));
	v = json_string_value(json_object_get(h, "traceparent"));
	assert_non_null(v);
	assert_true(qb_trace_parse(v, &sent));
	assert_memory_equal(sent.trace_id, parent.trace_id, 16);
	assert_memory_equal(sent.span_id, child.span_id, 8);
	assert_memory_not_equal(sent.span_id, parent.span_id, 8);
	assert_string_equal(json_string_value(json_object_get(h, "tracestate")), "a=b");
	assert_string_equal(json_string_value(json_object_get(h, "X-Other")), "1");
	assert_int_equal(json_object_size(h), 3);
	json_decref(h);

	/* an invalid one is dropped with its tracestate; others stay */
	h = json_pack("{s:s, s:s, s:s}", "traceparent", "00-nope", "TraceState", "a=b", "X-Other", "1");
	assert_false(qb_trace_publish(h, &parent, &child));
	assert_int_equal(json_object_size(h), 1);
	assert_non_null(json_object_get(h, "X-Other"));
	json_decref(h);

	/* none: nothing changes */
	h = json_pack("{s:s}", "X-Other", "1");
	assert_false(qb_trace_publish(h, &parent, &child));
	assert_int_equal(json_object_size(h), 1);
	json_decref(h);
	assert_false(qb_trace_publish(NULL, &parent, &child));
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_parse),
		cmocka_unit_test(test_child),
		cmocka_unit_test(test_from_sql),
		cmocka_unit_test(test_tracestate),
		cmocka_unit_test(test_publish),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
