/*-------------------------------------------------------------------------
 * test_config_override.c
 *	  Unit tests of qb_config_override.c: QUEUEBOX_* variables onto the
 *	  tree (outbox, destinations, routes, inbox, http, admin, sources, the
 *	  daemon's database: and daemon:), those ignored, and the errors that
 *	  name the variable and the key path.
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

/* ---- QUEUEBOX_* overrides ----------------------------------------- */

static const char override_doc[] =
"outbox:\n"
"  batchSize: 100\n"
"destinations:\n"
"  payments:\n"
"    type: http\n"
"    baseUrl: \"http://127.0.0.1:9000\"\n"
"    headers: { X-Api-Key: doc-key }\n"
"  bus: { type: rabbitmq, url: \"amqp://h\", exchange: e }\n"
"  my-api: { type: http, baseUrl: \"http://h\" }\n"
"routes:\n"
"  - topicPattern: \"orders.**\"\n"
"    destination: payments\n";
static void
test_overrides_valid(void **state)
{
	QbConfig   *c;

	/* ignored: not a key, and the test settings */
	setenv("QUEUEBOX_TEST_SOMETHING", "x", 1);
	setenv("QUEUEBOX_NOPE", "x", 1);
	setenv("QUEUEBOX_OUTBOX_NOPE", "x", 1);
	setenv("QUEUEBOX_DESTINATIONS_GHOST_BASEURL", "x", 1);
	setenv("QUEUEBOX_ROUTES_7_DESTINATION", "x", 1);
	setenv("QUEUEBOX_OUTBOX", "x", 1);	/* a mapping, not a scalar */

	setenv("QUEUEBOX_OUTBOX_BATCHSIZE", "7", 1);
	setenv("QUEUEBOX_outbox_maxAttempts", "3", 1);	/* case is ignored */
	setenv("QUEUEBOX_OUTBOX_BACKOFF_INITIALMS", "250", 1);	/* backoff: created */
	setenv("QUEUEBOX_OUTBOX_RETENTION", "2h", 1);
	setenv("QUEUEBOX_DESTINATIONS_PAYMENTS_BASEURL", "https://example.com/base", 1);
	setenv("QUEUEBOX_DESTINATIONS_PAYMENTS_PATH", "/in", 1);
	setenv("QUEUEBOX_DESTINATIONS_PAYMENTS_HEADERS_X_API_KEY", "${NOT_EXPANDED}", 1);
	setenv("QUEUEBOX_DESTINATIONS_MY_API_TIMEOUTMS", "1234", 1);
	setenv("QUEUEBOX_DESTINATIONS_BUS_PERSISTENT", "false", 1);
	setenv("QUEUEBOX_ROUTES_0_DESTINATION", "bus", 1);
	setenv("QUEUEBOX_ROUTES_0_TOPICPATTERN", "**", 1);

	c = accept(override_doc);
	assert_int_equal(c->outbox.batch_size, 7);
	assert_int_equal(c->outbox.max_attempts, 3);
	assert_int_equal(c->outbox.backoff.initial_ms, 250);
	assert_int_equal(c->outbox.backoff.max_ms, 3600000);
	assert_int_equal(c->outbox.retention_sec, 7200);
	assert_string_equal(c->destinations[0].url, "https://example.com/base/in");
	assert_string_equal(c->destinations[0].headers[0].value, "${NOT_EXPANDED}");
	assert_int_equal(c->destinations[2].timeout_ms, 1234);
	assert_false(c->destinations[1].persistent);
	assert_string_equal(c->routes[0].destination, "bus");
	assert_int_equal(c->routes[0].dest_index, 1);
	assert_string_equal(c->routes[0].topic_pattern, "**");
	qb_config_free(c);

	/* an empty document takes outbox overrides too */
	c = accept("");
	assert_int_equal(c->outbox.batch_size, 7);
	assert_int_equal(c->outbox.backoff.initial_ms, 250);
	assert_int_equal(c->ndestinations, 0);
	qb_config_free(c);
	/* and so does a null outbox: */
	c = accept("outbox:\n");
	assert_int_equal(c->outbox.batch_size, 7);
	qb_config_free(c);

	unsetenv("QUEUEBOX_TEST_SOMETHING");
	unsetenv("QUEUEBOX_NOPE");
	unsetenv("QUEUEBOX_OUTBOX_NOPE");
	unsetenv("QUEUEBOX_DESTINATIONS_GHOST_BASEURL");
	unsetenv("QUEUEBOX_ROUTES_7_DESTINATION");
	unsetenv("QUEUEBOX_OUTBOX");
	unsetenv("QUEUEBOX_OUTBOX_BATCHSIZE");
	unsetenv("QUEUEBOX_outbox_maxAttempts");
	unsetenv("QUEUEBOX_OUTBOX_BACKOFF_INITIALMS");
	unsetenv("QUEUEBOX_OUTBOX_RETENTION");
	unsetenv("QUEUEBOX_DESTINATIONS_PAYMENTS_BASEURL");
	unsetenv("QUEUEBOX_DESTINATIONS_PAYMENTS_PATH");
	unsetenv("QUEUEBOX_DESTINATIONS_PAYMENTS_HEADERS_X_API_KEY");
	unsetenv("QUEUEBOX_DESTINATIONS_MY_API_TIMEOUTMS");
	unsetenv("QUEUEBOX_DESTINATIONS_BUS_PERSISTENT");
	unsetenv("QUEUEBOX_ROUTES_0_DESTINATION");
	unsetenv("QUEUEBOX_ROUTES_0_TOPICPATTERN");

	/* with the variables gone, the document's values are back */
	c = accept(override_doc);
	assert_int_equal(c->outbox.batch_size, 100);
	assert_string_equal(c->destinations[0].url, "http://127.0.0.1:9000");
	qb_config_free(c);
}
static void
test_overrides_invalid(void **state)
{
	char		err[QB_ERRLEN];

	setenv("QUEUEBOX_OUTBOX_BATCHSIZE", "many", 1);
	refuse(override_doc,
		   "QUEUEBOX_OUTBOX_BATCHSIZE (outbox.batchSize): expected an integer from 1 to 10000, got \"many\"", NULL);
	refuse("", "QUEUEBOX_OUTBOX_BATCHSIZE (outbox.batchSize): expected an integer", NULL);
	/* two variables for one key */
	setenv("QUEUEBOX_Outbox_BatchSize", "5", 1);
	refuse(override_doc, "both set outbox.batchSize: unset one of them", NULL);
	unsetenv("QUEUEBOX_Outbox_BatchSize");
	unsetenv("QUEUEBOX_OUTBOX_BATCHSIZE");

	setenv("QUEUEBOX_OUTBOX_BACKOFF_MAXMS", "10", 1);
	refuse(override_doc, "QUEUEBOX_OUTBOX_BACKOFF_MAXMS (outbox.backoff.maxMs): must be at least initialMs (1000), got 10", NULL);
	unsetenv("QUEUEBOX_OUTBOX_BACKOFF_MAXMS");

	setenv("QUEUEBOX_DESTINATIONS_PAYMENTS_BASEURL", "ftp://user:s3cr3t@x", 1);
	refused_message(override_doc, err, sizeof(err));
	assert_non_null(strstr(err, "QUEUEBOX_DESTINATIONS_PAYMENTS_BASEURL (destinations.payments.baseUrl): unsupported scheme \"ftp\""));
	assert_null(strstr(err, "s3cr3t"));
	unsetenv("QUEUEBOX_DESTINATIONS_PAYMENTS_BASEURL");

	/* a key of another destination type: a stale override is noticed */
	setenv("QUEUEBOX_DESTINATIONS_PAYMENTS_EXCHANGE", "e", 1);
	refuse(override_doc,
		   "QUEUEBOX_DESTINATIONS_PAYMENTS_EXCHANGE (destinations.payments.exchange): unknown key for an http destination",
		   NULL);
	unsetenv("QUEUEBOX_DESTINATIONS_PAYMENTS_EXCHANGE");

	setenv("QUEUEBOX_ROUTES_0_DESTINATION", "nope", 1);
	refuse(override_doc,
		   "QUEUEBOX_ROUTES_0_DESTINATION (routes[0].destination): unknown destination \"nope\" (defined: payments, bus, my-api)",
		   NULL);
	unsetenv("QUEUEBOX_ROUTES_0_DESTINATION");

	setenv("QUEUEBOX_DESTINATIONS_BUS_MANDATORY", "TRUE", 1);
	refuse(override_doc, "QUEUEBOX_DESTINATIONS_BUS_MANDATORY (destinations.bus.mandatory): expected true or false, got \"TRUE\"", NULL);
	unsetenv("QUEUEBOX_DESTINATIONS_BUS_MANDATORY");

	/* one name for two paths */
	setenv("QUEUEBOX_DESTINATIONS_A_B_TYPE", "nats", 1);
	refuse("destinations:\n  a-b: { type: nats, url: \"nats://h\" }\n  a_b: { type: nats, url: \"nats://h\" }\n",
		   "QUEUEBOX_DESTINATIONS_A_B_TYPE matches both destinations.a-b.type and destinations.a_b.type", NULL);
	unsetenv("QUEUEBOX_DESTINATIONS_A_B_TYPE");

	/* an override does not hide a document that is not a mapping */
	setenv("QUEUEBOX_OUTBOX_BATCHSIZE", "5", 1);
	refuse("- 1\n", "the document must be a mapping", NULL);
	refuse("outbox: 5\n", "outbox: expected a mapping", NULL);
	unsetenv("QUEUEBOX_OUTBOX_BATCHSIZE");
}
static void
test_overrides_inbox(void **state)
{
	QbConfig   *cfg;

	setenv("QUEUEBOX_HTTP_LISTEN", "127.0.0.1:18099", 1);
	setenv("QUEUEBOX_ADMIN_TOKEN", "from-the-environment-1234", 1);
	setenv("QUEUEBOX_INBOX_RELAY_BATCHSIZE", "7", 1);
	setenv("QUEUEBOX_SOURCES_GH_AUTH_SECRET", "rotated", 1);
	setenv("QUEUEBOX_SOURCES_GH_MAXBODYBYTES", "2048", 1);
	cfg = accept("sources:\n  gh:\n    type: http\n    path: /gh\n    idempotencyKeyHeader: X-GitHub-Delivery\n"
				 "    topic: gh\n    auth: {type: github, secret: old}\n");
	assert_string_equal(cfg->http.host, "127.0.0.1");
	assert_int_equal(cfg->http.port, 18099);
	assert_string_equal(cfg->admin_token, "from-the-environment-1234");
	assert_int_equal(cfg->inbox.relay.batch_size, 7);
	assert_string_equal(cfg->sources[0].auth.secrets[0], "rotated");
	assert_int_equal(cfg->sources[0].max_body_bytes, 2048);
	qb_config_free(cfg);
	setenv("QUEUEBOX_INBOX_RELAY_BATCHSIZE", "lots", 1);
	refuse("", "QUEUEBOX_INBOX_RELAY_BATCHSIZE (inbox.relay.batchSize): expected an integer", NULL);
	unsetenv("QUEUEBOX_HTTP_LISTEN");
	unsetenv("QUEUEBOX_ADMIN_TOKEN");
	unsetenv("QUEUEBOX_INBOX_RELAY_BATCHSIZE");
	unsetenv("QUEUEBOX_SOURCES_GH_AUTH_SECRET");
	unsetenv("QUEUEBOX_SOURCES_GH_MAXBODYBYTES");
}
static void
test_daemon_overrides(void **state)
{
	QbConfig   *c;

	setenv("QUEUEBOX_DATABASE_URL", "sqlserver://qb:" PASSWORD "@mssql:1433?database=app", 1);
	setenv("QUEUEBOX_DATABASE_LISTEN", "true", 1);
	setenv("QUEUEBOX_DAEMON_OUTBOXWORKERS", "8", 1);
	setenv("QUEUEBOX_DAEMON_LOGFORMAT", "json", 1);
	/* replaces the document's value, and adds the sections it lacks */
	c = accept("database: { url: \"postgres://h/app\" }\n");
	assert_string_equal(c->database.url, "sqlserver://qb:" PASSWORD "@mssql:1433?database=app");
	assert_true(c->database.listen);
	assert_int_equal(c->daemon.outbox_workers, 8);
	assert_true(c->daemon.log_json);
	qb_config_free(c);
	c = accept("");
	assert_string_equal(c->database.url, "sqlserver://qb:" PASSWORD "@mssql:1433?database=app");
	qb_config_free(c);
	unsetenv("QUEUEBOX_DATABASE_LISTEN");
	unsetenv("QUEUEBOX_DAEMON_OUTBOXWORKERS");
	unsetenv("QUEUEBOX_DAEMON_LOGFORMAT");

	/* an override's error names the variable and the key path */
	setenv("QUEUEBOX_DATABASE_URL", "mysql://qb:" PASSWORD "@db/app", 1);
	refuse_hiding("", "QUEUEBOX_DATABASE_URL (database.url): unsupported scheme \"mysql\"");
	unsetenv("QUEUEBOX_DATABASE_URL");
	setenv("QUEUEBOX_DATABASE_IDLEPOLLMAXMS", "5", 1);
	refuse("", "QUEUEBOX_DATABASE_IDLEPOLLMAXMS (database.idlePollMaxMs): expected an integer from 10 to 3600000, got \"5\"", NULL);
	unsetenv("QUEUEBOX_DATABASE_IDLEPOLLMAXMS");
	setenv("QUEUEBOX_DAEMON_SHUTDOWNGRACEMS", "soon", 1);
	refuse("", "QUEUEBOX_DAEMON_SHUTDOWNGRACEMS (daemon.shutdownGraceMs): expected an integer", NULL);
	unsetenv("QUEUEBOX_DAEMON_SHUTDOWNGRACEMS");
	/* a name that spells no key is ignored, as everywhere */
	setenv("QUEUEBOX_DATABASE_PASSWORD", "x", 1);
	qb_config_free(accept(""));
	unsetenv("QUEUEBOX_DATABASE_PASSWORD");
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_overrides_valid),
		cmocka_unit_test(test_overrides_invalid),
		cmocka_unit_test(test_overrides_inbox),
		cmocka_unit_test(test_daemon_overrides),
	};

	return cmocka_run_group_tests_name("qb_config_override", tests, NULL, NULL);
}
