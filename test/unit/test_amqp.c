/*-------------------------------------------------------------------------
 * test_amqp.c
 *	  Unit tests of qb_pub_amqp.c that need no broker: the url (vhost,
 *	  credentials, options), the configure-time checks of a rabbitmq
 *	  destination, and a publish to a port nobody listens on.  The headers
 *	  table is test_headers.c's; publishing to a real broker is TAP 010's.
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

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "qb_config.h"
#include "qb_pub_amqp.h"

static void
test_url_defaults(void **state)
{
	QbAmqpUrl	u;
	char		err[256] = "";

	assert_true(qb_amqp_url_parse("amqp://h", &u, err, sizeof(err)));
	assert_false(u.tls);
	assert_string_equal(u.host, "h");
	assert_int_equal(u.port, 5672);
	assert_string_equal(u.user, "guest");
	assert_string_equal(u.password, "guest");
	assert_string_equal(u.vhost, "/");
	assert_int_equal(u.heartbeat, 0);
	assert_int_equal(u.connect_timeout_ms, 5000);
	qb_amqp_url_free(&u);

	/* a trailing '/' is the default vhost too, as the docs' example writes it */
	assert_true(qb_amqp_url_parse("AMQPS://u:p%40ss@broker.example:5999/", &u, err, sizeof(err)));
	assert_true(u.tls);
	assert_true(u.verify);
	assert_string_equal(u.user, "u");
	assert_string_equal(u.password, "p@ss");
	assert_string_equal(u.host, "broker.example");
	assert_int_equal(u.port, 5999);
	assert_string_equal(u.vhost, "/");
	qb_amqp_url_free(&u);

	assert_true(qb_amqp_url_parse("amqps://h", &u, err, sizeof(err)));
	assert_int_equal(u.port, 5671);
	qb_amqp_url_free(&u);

	assert_true(qb_amqp_url_parse("amqp://user@[::1]:5673/%2f", &u, err, sizeof(err)));
	assert_string_equal(u.host, "::1");
	assert_int_equal(u.port, 5673);
	assert_string_equal(u.user, "user");
	assert_string_equal(u.password, "");
	assert_string_equal(u.vhost, "/");
	qb_amqp_url_free(&u);

	assert_true(qb_amqp_url_parse("amqp://h/prod%2Fa?heartbeat=10&connection_timeout=250",
								  &u, err, sizeof(err)));
	assert_string_equal(u.vhost, "prod/a");
	assert_int_equal(u.heartbeat, 10);
	assert_int_equal(u.connect_timeout_ms, 250);
	qb_amqp_url_free(&u);

	assert_true(qb_amqp_url_parse("amqps://h/v?cacertfile=/etc/ca.pem&certfile=/c.pem&keyfile=/k.pem&verify=verify_none",
								  &u, err, sizeof(err)));
	assert_string_equal(u.cacert, "/etc/ca.pem");
	assert_string_equal(u.cert, "/c.pem");
	assert_string_equal(u.key, "/k.pem");
	assert_false(u.verify);
	assert_string_equal(u.vhost, "v");
	qb_amqp_url_free(&u);
}

static void
refuse_url(const char *url, const char *want)
{
	QbAmqpUrl	u;
	char		err[256] = "";

	if (qb_amqp_url_parse(url, &u, err, sizeof(err)))
		fail_msg("accepted %s", url);
	qb_amqp_url_free(&u);
	if (strstr(err, want) == NULL)
		fail_msg("%s: got \"%s\", want \"%s\"", url, err, want);
	/* a password never shows in a message */
	assert_null(strstr(err, "s3cr3t"));
}

static void
test_url_refused(void **state)
{
	refuse_url("http://h", "unsupported scheme");
	refuse_url("amqp:/h", "not a URL");
	refuse_url("amqp://u:s3cr3t@:5672/", "no host");
	refuse_url("amqp://u:s3cr3t@h:0/", "port");
	refuse_url("amqp://u:s3cr3t@h:65536/", "port");
	refuse_url("amqp://u:s3cr3t@h:5x/", "port");
	refuse_url("amqp://u:s3cr3t@h/a/b", "one path segment");
	refuse_url("amqp://u:s3cr3t@h/%zz", "percent-encoding");
	refuse_url("amqp://u:s3cr3t@h/a%00", "%00");
	refuse_url("amqp://u:s3cr3t@h/?heartbeat=-1", "heartbeat");
	refuse_url("amqp://u:s3cr3t@h/?heartbeat", "no value");
	refuse_url("amqp://u:s3cr3t@h/?connection_timeout=0", "connection_timeout");
	refuse_url("amqp://u:s3cr3t@h/?frame_max=1", "unsupported option \"frame_max\"");
	refuse_url("amqp://u:s3cr3t@h/?cacertfile=/ca.pem", "amqps:// URLs only");
	refuse_url("amqps://u:s3cr3t@h/?verify=maybe", "verify_peer or verify_none");
	refuse_url("amqps://u:s3cr3t@h/?certfile=/c.pem", "go together");
	refuse_url("amqp://u:s3cr3t@[::1/", "closing ']'");
	refuse_url("amqp://u:s3cr3t@h/#frag", "fragment");
}

static void
refuse_config(const char *doc, const char *want)
{
	QbConfig   *cfg = NULL;
	char		err[QB_ERRLEN] = "";

	if (qb_config_parse(doc, strlen(doc), NULL, &cfg, err, sizeof(err)) == 0)
	{
		qb_config_free(cfg);
		fail_msg("accepted: %s", doc);
	}
	if (strstr(err, want) == NULL)
		fail_msg("got \"%s\", want \"%s\"", err, want);
}

static void
test_config(void **state)
{
	static const char ok[] =
		"destinations:\n"
		"  bus: { type: rabbitmq, url: \"amqp://u:p@h:5672/?heartbeat=30\", exchange: e, routingKey: \"x.{{ key }}.{{topic}}\" }\n"
		"routes:\n  - { topicPattern: \"**\", destination: bus }\n";
	QbConfig   *cfg = NULL;
	char		err[QB_ERRLEN] = "";

	assert_int_equal(qb_config_parse(ok, strlen(ok), NULL, &cfg, err, sizeof(err)), 0);
	assert_string_equal(cfg->destinations[0].routing_key, "x.{{ key }}.{{topic}}");
	qb_config_free(cfg);

	refuse_config("destinations:\n  bus: { type: rabbitmq, url: \"amqp://h\", exchange: e, routingKey: \"{{ eventType }}\" }\n",
				  "destinations.bus.routingKey: unknown placeholder \"{{ eventType }}\" (known: {{ topic }}, {{ key }})");
	refuse_config("destinations:\n  bus: { type: rabbitmq, url: \"amqp://h\", exchange: e, routingKey: \"{{ topic\" }\n",
				  "destinations.bus.routingKey: unterminated");
	refuse_config("destinations:\n  bus: { type: rabbitmq, url: \"amqp://h/a/b\", exchange: e }\n",
				  "destinations.bus.url: the vhost is one path segment");
	refuse_config("destinations:\n  bus: { type: rabbitmq, url: \"amqp://h/?channel_max=5\", exchange: e }\n",
				  "destinations.bus.url: unsupported option \"channel_max\"");
}

static int	ndone;
static QbPubOutcome last;

static void
done_cb(void *arg, int tag, const QbPubOutcome *o)
{
	ndone++;
	last = *o;
}

/* A refused connection is a retry at once, and a backoff before the next try. */
static void
test_refused(void **state)
{
	const QbPublisherOps *ops = &qb_amqp_publisher;
	struct sockaddr_in sa = {.sin_family = AF_INET};
	socklen_t	len = sizeof(sa);
	int			s = socket(AF_INET, SOCK_STREAM, 0);
	char		url[128];
	char		err[512] = "";
	void	   *p;
	QbDestination d = {0};
	QbMessage	m = {"00000000-0000-0000-0000-000000000001", "t", NULL, NULL, "{}", 2};

	/* a port that was free a moment ago */
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	assert_int_equal(bind(s, (struct sockaddr *) &sa, sizeof(sa)), 0);
	assert_int_equal(getsockname(s, (struct sockaddr *) &sa, &len), 0);
	close(s);
	snprintf(url, sizeof(url), "amqp://u:s3cr3t@127.0.0.1:%d/", ntohs(sa.sin_port));

	p = ops->create(err, sizeof(err));
	assert_non_null(p);
	assert_true(ops->fd(p) >= 0);
	d.name = "mq";
	d.type = QB_DEST_RABBITMQ;
	d.broker_url = url;
	d.target = "e";
	d.routing_key = "{{ topic }}";
	assert_int_equal(ops->start(p, &d, &m, 0, err, sizeof(err)), QB_PUB_NOT_STARTED);
	assert_non_null(strstr(err, "cannot connect: Connection refused"));
	assert_null(strstr(err, "s3cr3t"));
	assert_int_equal(ops->start(p, &d, &m, 1, err, sizeof(err)), QB_PUB_NOT_STARTED);
	assert_non_null(strstr(err, "the next connection attempt is in"));
	assert_int_equal(ops->in_flight(p), 0);
	ops->perform(p, done_cb, NULL);
	assert_int_equal(ndone, 0);

	/* a row that can never be sent is refused before any connection */
	{
		char		name[300];
		json_t	   *bad = json_object();

		memset(name, 'h', sizeof(name) - 1);
		name[sizeof(name) - 1] = '\0';
		json_object_set_new(bad, name, json_string("v"));
		m.headers = bad;
		assert_int_equal(ops->start(p, &d, &m, 2, err, sizeof(err)), QB_PUB_ROW_INVALID);
		assert_non_null(strstr(err, "1 to 255 bytes"));
		json_decref(bad);
	}
	ops->destroy(p);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_url_defaults),
		cmocka_unit_test(test_url_refused),
		cmocka_unit_test(test_config),
		cmocka_unit_test(test_refused),
	};

	return cmocka_run_group_tests_name("qb_pub_amqp", tests, NULL, NULL);
}
