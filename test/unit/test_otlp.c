/*
 * test_otlp.c: the OTLP span exporter (qb_otlp.h) against the project's
 * loopback HTTP sink: what a post holds (OTLP JSON: resource, scope, hex
 * ids, the parent, the tracestate as traceState), parent-based sampling, a
 * bounded queue that drops and counts, a receiver that is down, the egress
 * rules, and a reconfigure.
 * (TAP 056 checks the same posts with the OpenTelemetry JS decoder.)
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cmocka.h>
#include <curl/curl.h>
#include <jansson.h>

#include "qb_crypto.h"
#include "qb_otlp.h"
#include "test_sink.h"

static TestSink sink;
/* the process's exporter, as a host keeps it (QbRuntime.otlp): for the life of the process */
static QbOtlpExporter ex;

/* a port nothing listens on now (bound, read, closed) */
static int
free_port(void)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t	len = sizeof(a);
	int			fd = socket(AF_INET, SOCK_STREAM, 0);

	assert_true(bind(fd, (struct sockaddr *) &a, sizeof(a)) == 0);
	assert_true(getsockname(fd, (struct sockaddr *) &a, &len) == 0);
	close(fd);
	return ntohs(a.sin_port);
}

/* every span the sink was posted at path, in order, as one JSON array (new) */
static json_t *
posted_spans(const char *path, json_t **resource)
{
	FILE	   *f = fopen(sink.log, "r");
	json_t	   *all = json_array();
	char	   *line = NULL;
	size_t		cap = 0;

	if (resource)
		*resource = NULL;
	while (f != NULL && getline(&line, &cap, f) > 0)
	{
		json_t	   *r = json_loads(line, 0, NULL);
		json_t	   *body;
		json_t	   *rs;

		if (r == NULL || strcmp(json_string_value(json_object_get(r, "path")), path) != 0)
		{
			json_decref(r);
			continue;
		}
		body = json_loads(json_string_value(json_object_get(r, "body")), 0, NULL);
		assert_non_null(body);
		rs = json_array_get(json_object_get(body, "resourceSpans"), 0);
		if (resource && *resource == NULL)
			*resource = json_incref(json_object_get(rs, "resource"));
		assert_string_equal(json_string_value(json_object_get(json_object_get(json_array_get(
			json_object_get(rs, "scopeSpans"), 0), "scope"), "name")), "queuebox");
		json_array_extend(all, json_object_get(json_array_get(json_object_get(rs, "scopeSpans"), 0), "spans"));
		json_decref(body);
		json_decref(r);
	}
	free(line);
	if (f)
		fclose(f);
	return all;
}

static const char *
attr(json_t *span, const char *key, char *buf)
{
	json_t	   *a;
	size_t		i;

	json_array_foreach(json_object_get(span, "attributes"), i, a)
		if (strcmp(json_string_value(json_object_get(a, "key")), key) == 0)
	{
		json_t	   *v = json_object_get(a, "value");

		if (json_object_get(v, "stringValue"))
			return json_string_value(json_object_get(v, "stringValue"));
		strcpy(buf, json_string_value(json_object_get(v, "intValue")));
		return buf;
	}
	return NULL;
}

static QbOtlpOptions
options(const char *url)
{
	return (QbOtlpOptions) {.url = (char *) url, .service_name = "billing", .timeout_ms = 2000,
		.queue_size = 16, .batch_size = 4, .flush_interval_ms = 50};
}

/* a child span and a root one, posted as OTLP JSON */
static void
test_post(void **state)
{
	QbMetrics  *m = calloc(1, sizeof(QbMetrics));
	char		url[256];
	char		err[256];
	char		buf[32];
	QbTraceContext parent;
	QbSpan		a,
				b;
	QbOtlpHeader h = {"x-api-key", "k1"};
	QbOtlpOptions o;
	json_t	   *spans;
	json_t	   *res;
	json_t	   *sa;
	char		hex[33];

	snprintf(url, sizeof(url), "%s/v1/traces", sink.base);
	o = options(url);
	o.headers = &h;
	o.nheaders = 1;
	assert_false(qb_otlp_on(&ex));
	assert_true(qb_otlp_configure(&ex, &o, m, "test:1", err, sizeof(err)));
	assert_true(qb_otlp_on(&ex));
	/* the same options again: the same exporter */
	assert_true(qb_otlp_configure(&ex, &o, m, "test:1", err, sizeof(err)));

	assert_true(qb_trace_parse("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", &parent));
	assert_true(qb_span_start(&a, "deliver web", QB_SPAN_CLIENT, &parent));
	qb_span_str(&a, "queuebox.destination", "web");
	qb_span_int(&a, "queuebox.attempt", 3);
	a.error = true;
	a.message = "attempt 3 of 10 failed: HTTP 500";
	qb_otlp_emit(&ex, &a);
	assert_true(qb_span_start(&b, "forward shop", QB_SPAN_INTERNAL, NULL));
	qb_otlp_emit(&ex, &b);
	/* a parent that is not sampled: no span */
	assert_true(qb_trace_parse("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00", &parent));
	assert_false(qb_span_start(&b, "x", QB_SPAN_CLIENT, &parent));
	qb_otlp_shutdown(&ex, 2000);
	assert_false(qb_otlp_on(&ex));
	assert_int_equal(m->otlp_exported, 2);
	assert_int_equal(m->otlp_dropped, 0);

	spans = posted_spans("/v1/traces", &res);
	assert_int_equal(json_array_size(spans), 2);
	assert_string_equal(attr(res, "service.name", buf), "billing");
	assert_string_equal(attr(res, "service.instance.id", buf), "test:1");
	sa = json_array_get(spans, 0);
	assert_string_equal(json_string_value(json_object_get(sa, "traceId")), "0af7651916cd43dd8448eb211c80319c");
	assert_string_equal(json_string_value(json_object_get(sa, "parentSpanId")), "b7ad6b7169203331");
	qb_hex_encode(a.ctx.span_id, 8, hex);
	assert_string_equal(json_string_value(json_object_get(sa, "spanId")), hex);
	assert_string_not_equal(hex, "b7ad6b7169203331");
	assert_string_equal(json_string_value(json_object_get(sa, "name")), "deliver web");
	assert_int_equal(json_integer_value(json_object_get(sa, "kind")), 3);
	assert_int_equal(json_integer_value(json_object_get(json_object_get(sa, "status"), "code")), 2);
	assert_string_equal(json_string_value(json_object_get(json_object_get(sa, "status"), "message")),
						"attempt 3 of 10 failed: HTTP 500");
	assert_string_equal(attr(sa, "queuebox.destination", buf), "web");
	assert_string_equal(attr(sa, "queuebox.attempt", buf), "3");
	assert_true(strtoll(json_string_value(json_object_get(sa, "endTimeUnixNano")), NULL, 10) >=
				strtoll(json_string_value(json_object_get(sa, "startTimeUnixNano")), NULL, 10));
	/* the root: a trace of its own, no parent */
	sa = json_array_get(spans, 1);
	assert_null(json_object_get(sa, "parentSpanId"));
	assert_string_not_equal(json_string_value(json_object_get(sa, "traceId")), "0af7651916cd43dd8448eb211c80319c");
	assert_int_equal(json_integer_value(json_object_get(json_object_get(sa, "status"), "code")), 1);
	json_decref(spans);
	json_decref(res);
	free(m);
}

/*
 * the tracestate of a span's context is its traceState: a row's (the
 * headers a delivery publishes, any letter case), a request's; none for a
 * row without one, a root, or one that cannot be carried on
 */
static void
test_tracestate(void **state)
{
	QbMetrics  *m = calloc(1, sizeof(QbMetrics));
	char		url[256];
	char		err[256];
	QbTraceContext parent,
				child;
	QbSpan		s;
	QbOtlpOptions o;
	json_t	   *spans;
	json_t	   *h;
	size_t		i;
	json_t	   *sp;
	static const char *const want[][2] = {
		{"deliver with", "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"},
		{"deliver without", NULL},
		{"receive with", "vendor=1"},
		{"receive without", NULL},
		{"root", NULL},
		{"bad state", NULL},
	};

	snprintf(url, sizeof(url), "%s/v1/state", sink.base);
	o = options(url);
	assert_true(qb_otlp_configure(&ex, &o, m, "test:2", err, sizeof(err)));

	/* a delivery, as qb_outbox.c makes its span from the row's headers */
	h = json_pack("{s:s, s:s}", "TraceParent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
				  "TraceState", "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7");
	assert_true(qb_trace_publish(h, &parent, &child));
	assert_true(qb_span_start(&s, "deliver with", QB_SPAN_CLIENT, &parent));
	s.ctx = child;
	qb_span_tracestate(&s, qb_trace_state(h));
	qb_otlp_emit(&ex, &s);
	json_decref(h);
	h = json_pack("{s:s}", "traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01");
	assert_true(qb_trace_publish(h, &parent, &child));
	assert_null(qb_trace_state(h));
	assert_true(qb_span_start(&s, "deliver without", QB_SPAN_CLIENT, &parent));
	qb_span_tracestate(&s, qb_trace_state(h));
	qb_otlp_emit(&ex, &s);
	json_decref(h);
	/* a receipt: the request's traceparent and tracestate */
	assert_true(qb_span_start_tp(&s, "receive with", QB_SPAN_SERVER,
								 "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "vendor=1"));
	qb_otlp_emit(&ex, &s);
	assert_true(qb_span_start_tp(&s, "receive without", QB_SPAN_SERVER,
								 "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", NULL));
	qb_otlp_emit(&ex, &s);
	/* a root has no parent's tracestate to carry */
	assert_true(qb_span_start_tp(&s, "root", QB_SPAN_SERVER, NULL, "vendor=1"));
	qb_otlp_emit(&ex, &s);
	/* one that is not printable ASCII is not carried on */
	assert_true(qb_span_start_tp(&s, "bad state", QB_SPAN_SERVER,
								 "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "a=\"b\""));
	qb_otlp_emit(&ex, &s);
	qb_otlp_shutdown(&ex, 2000);
	assert_int_equal(m->otlp_exported, 6);

	spans = posted_spans("/v1/state", NULL);
	assert_int_equal(json_array_size(spans), 6);
	json_array_foreach(spans, i, sp)
	{
		json_t	   *ts = json_object_get(sp, "traceState");

		assert_string_equal(json_string_value(json_object_get(sp, "name")), want[i][0]);
		if (want[i][1] != NULL)
			assert_string_equal(json_string_value(ts), want[i][1]);
		else
			assert_null(ts);
	}
	json_decref(spans);
	free(m);
}

/* a receiver that is down: every span dropped and counted, the reason kept */
static void
test_receiver_down(void **state)
{
	QbMetrics  *m = calloc(1, sizeof(QbMetrics));
	char		url[256];
	char		err[256];
	QbOtlpOptions o;
	QbSpan		s;

	snprintf(url, sizeof(url), "http://127.0.0.1:%d/v1/traces", free_port());
	o = options(url);
	o.queue_size = 2;
	o.batch_size = 2;
	assert_true(qb_otlp_configure(&ex, &o, m, NULL, err, sizeof(err)));
	/* a queue of 2: the spans past it are dropped at once, never waited for */
	for (int i = 0; i < 5; i++)
	{
		assert_true(qb_span_start(&s, "deliver web", QB_SPAN_CLIENT, NULL));
		qb_otlp_emit(&ex, &s);
	}
	qb_otlp_shutdown(&ex, 1000);
	assert_int_equal(m->otlp_exported, 0);
	assert_int_equal(m->otlp_dropped, 5);
	free(m);
}

/* the failure is there to log, once */
static void
test_error_taken(void **state)
{
	QbMetrics  *m = calloc(1, sizeof(QbMetrics));
	char		url[256];
	char		err[300];
	QbOtlpOptions o;
	QbSpan		s;

	/* a metadata address: refused by the default egress rules, never connected */
	snprintf(url, sizeof(url), "http://169.254.169.254:4318/v1/traces");
	o = options(url);
	o.flush_interval_ms = 10;
	assert_true(qb_otlp_configure(&ex, &o, m, NULL, err, sizeof(err)));
	assert_true(qb_span_start(&s, "deliver web", QB_SPAN_CLIENT, NULL));
	qb_otlp_emit(&ex, &s);
	for (int i = 0; i < 500 && __atomic_load_n(&m->otlp_dropped, __ATOMIC_RELAXED) == 0; i++)
		usleep(10000);
	assert_int_equal(m->otlp_dropped, 1);
	assert_true(qb_otlp_take_error(&ex, err, sizeof(err)));
	assert_non_null(strstr(err, "POST http://169.254.169.254:4318/v1/traces failed: egress refused: 169.254.169.254 is a link-local or cloud metadata address"));
	assert_non_null(strstr(err, "1 spans dropped"));
	assert_false(qb_otlp_take_error(&ex, err, sizeof(err)));
	/* no options: export stops */
	assert_true(qb_otlp_configure(&ex, NULL, m, NULL, err, sizeof(err)));
	assert_false(qb_otlp_on(&ex));
	free(m);
}

static int
setup(void **state)
{
	curl_global_init(CURL_GLOBAL_DEFAULT);
	return test_sink_start(&sink, "test-otlp", true);
}

static int
teardown(void **state)
{
	test_sink_stop(&sink);
	curl_global_cleanup();
	return 0;
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_post),
		cmocka_unit_test(test_tracestate),
		cmocka_unit_test(test_receiver_down),
		cmocka_unit_test(test_error_taken),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
