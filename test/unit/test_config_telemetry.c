/*-------------------------------------------------------------------------
 * test_config_telemetry.c
 *	  Unit tests of qb_config_telemetry.c: telemetry.otlp's endpoint into
 *	  the traces URL, its defaults, and what is refused (a scheme, a batch
 *	  larger than the queue, an endpoint the egress rules refuse).
 *-------------------------------------------------------------------------
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "qb_config.h"
#include "test_config.h"

/* telemetry.otlp: the traces URL, the defaults, and what is refused */
static void
test_telemetry(void **state)
{
	QbConfig   *c = accept("");

	assert_null(c->otlp.url);
	assert_string_equal(c->otlp.service_name, "queuebox");
	assert_int_equal(c->otlp.queue_size, 2048);
	qb_config_free(c);
	c = accept("telemetry:\n  otlp:\n    endpoint: http://127.0.0.1:4318\n"
			   "    headers: { x-api-key: k1 }\n    serviceName: billing-outbox\n"
			   "    batchSize: 10\n    queueSize: 100\n    flushIntervalMs: 50\n");
	assert_string_equal(c->otlp.url, "http://127.0.0.1:4318/v1/traces");
	assert_int_equal(c->otlp.nheaders, 1);
	assert_string_equal(c->otlp.headers[0].name, "x-api-key");
	assert_string_equal(c->otlp.headers[0].value, "k1");
	assert_string_equal(c->otlp.service_name, "billing-outbox");
	assert_int_equal(c->otlp.batch_size, 10);
	assert_int_equal(c->otlp.queue_size, 100);
	assert_int_equal(c->otlp.flush_interval_ms, 50);
	qb_config_free(c);
	/* a path is kept as written; a bare slash is no path */
	c = accept("telemetry: { otlp: { endpoint: \"https://otlp.example.com/custom/traces\" } }\n");
	assert_string_equal(c->otlp.url, "https://otlp.example.com/custom/traces");
	qb_config_free(c);
	c = accept("telemetry: { otlp: { endpoint: \"http://collector:4318/\" } }\n");
	assert_string_equal(c->otlp.url, "http://collector:4318/v1/traces");
	qb_config_free(c);

	refuse("telemetry: { otlp: { endpoint: \"grpc://collector:4317\" } }\n",
		   "telemetry.otlp.endpoint: ", "e.g. http://otel-collector:4318", NULL);
	refuse("telemetry: { otlp: { serviceName: x } }\n",
		   "telemetry.otlp.endpoint: required when telemetry.otlp is set", NULL);
	refuse("telemetry: { otlp: { endpoint: \"http://c:4318\", protocol: grpc } }\n",
		   "telemetry.otlp.protocol: unknown key", NULL);
	refuse("telemetry: { otlp: { endpoint: \"http://c:4318\", batchSize: 100, queueSize: 10 } }\n",
		   "telemetry.otlp.batchSize: a batch of 100 spans cannot be more than queueSize (10)", NULL);
	refuse("telemetry: { zipkin: {} }\n", "telemetry.zipkin: unknown key (allowed: otlp)", NULL);
	/* the egress rules judge the receiver as they judge destinations */
	refuse("telemetry: { otlp: { endpoint: \"http://169.254.169.254:4318\" } }\n",
		   "telemetry.otlp.endpoint: egress refused: 169.254.169.254 is a link-local or cloud metadata address", NULL);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_telemetry),
	};

	return cmocka_run_group_tests_name("qb_config_telemetry", tests, NULL, NULL);
}
