/*-------------------------------------------------------------------------
 * test_egress.c
 *	  Unit tests of qb_egress.c: the list's parser, the address and host
 *	  judgements, the refused set, and the configuration's checks of
 *	  destinations (egress.allow, the host's policy).
 *-------------------------------------------------------------------------
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "qb_config.h"
#include "qb_egress.h"

/* parse or fail the test */
static QbEgress *
policy(const char *list)
{
	QbEgress   *e = NULL;
	char		err[300];

	if (!qb_egress_parse(list, "queuebox.allowed_destinations", &e, err, sizeof(err)))
		fail_msg("%s: %s", list, err);
	return e;
}

/* judge an address literal as connect time would */
static bool
addr_ok(const QbEgress *e, const char *ip, char *why, size_t whylen)
{
	struct sockaddr_in v4 = {.sin_family = AF_INET};
	struct sockaddr_in6 v6 = {.sin6_family = AF_INET6};

	if (inet_pton(AF_INET, ip, &v4.sin_addr) == 1)
		return qb_egress_addr_ok(e, (struct sockaddr *) &v4, why, whylen);
	assert_int_equal(inet_pton(AF_INET6, ip, &v6.sin6_addr), 1);
	return qb_egress_addr_ok(e, (struct sockaddr *) &v6, why, whylen);
}

static void
test_default_refuses_metadata(void **state)
{
	QbEgress   *e = policy("");
	char		why[300];
	static const char *const refused[] = {"169.254.169.254", "169.254.0.1", "fe80::1",
	"fd00:ec2::254", "100.100.100.200", "::ffff:169.254.169.254", NULL};
	static const char *const open[] = {"127.0.0.1", "10.1.2.3", "::1", "93.184.216.34",
	"100.100.100.201", "fd00:ec2::253", "169.255.0.1", NULL};

	for (int i = 0; refused[i]; i++)
	{
		why[0] = '\0';
		assert_false(addr_ok(e, refused[i], why, sizeof(why)));
		assert_non_null(strstr(why, "link-local or cloud metadata"));
		assert_non_null(strstr(why, "queuebox.allowed_destinations"));
	}
	for (int i = 0; open[i]; i++)
		assert_true(addr_ok(e, open[i], why, sizeof(why)));
	/* so does a NULL policy, the host's (none set here) */
	assert_false(addr_ok(NULL, "169.254.169.254", why, sizeof(why)));
	assert_true(addr_ok(NULL, "127.0.0.1", why, sizeof(why)));
	qb_egress_free(e);
}

static void
test_cidrs(void **state)
{
	QbEgress   *e = policy("10.0.0.0/8, 192.0.2.7 fd00::/8,169.254.169.254/32");
	char		why[300];

	assert_int_equal(e->ncidrs, 4);
	assert_int_equal(e->nnames, 0);
	assert_true(addr_ok(e, "10.255.0.1", why, sizeof(why)));
	assert_true(addr_ok(e, "::ffff:10.0.0.1", why, sizeof(why)));
	assert_true(addr_ok(e, "192.0.2.7", why, sizeof(why)));
	assert_true(addr_ok(e, "fd12::1", why, sizeof(why)));
	/* listed, so the metadata address is allowed; its neighbours are not */
	assert_true(addr_ok(e, "169.254.169.254", why, sizeof(why)));
	assert_false(addr_ok(e, "169.254.169.253", why, sizeof(why)));
	assert_false(addr_ok(e, "11.0.0.1", why, sizeof(why)));
	assert_non_null(strstr(why, "11.0.0.1 is in no network of queuebox.allowed_destinations"));
	assert_false(addr_ok(e, "192.0.2.8", why, sizeof(why)));
	assert_false(addr_ok(e, "127.0.0.1", why, sizeof(why)));
	assert_false(addr_ok(e, "::1", why, sizeof(why)));
	qb_egress_free(e);

	/* host bits are ignored: 10.1.2.3/8 is 10.0.0.0/8 */
	e = policy("10.1.2.3/8");
	assert_true(addr_ok(e, "10.9.9.9", why, sizeof(why)));
	qb_egress_free(e);
	e = policy("0.0.0.0/0, ::/0");
	assert_true(addr_ok(e, "169.254.169.254", why, sizeof(why)));
	qb_egress_free(e);
}

static void
test_names(void **state)
{
	QbEgress   *e = policy("Hooks.Example.com, *.example.net, 10.0.0.0/8");
	char		why[300];

	assert_int_equal(e->nnames, 2);
	assert_true(qb_egress_host_ok(e, "hooks.example.com", why, sizeof(why)));
	assert_true(qb_egress_host_ok(e, "HOOKS.example.com.", why, sizeof(why)));
	assert_true(qb_egress_host_ok(e, "a.example.net", why, sizeof(why)));
	assert_true(qb_egress_host_ok(e, "a.b.example.net", why, sizeof(why)));
	assert_false(qb_egress_host_ok(e, "example.net", why, sizeof(why)));
	assert_false(qb_egress_host_ok(e, "evil-example.net", why, sizeof(why)));
	assert_false(qb_egress_host_ok(e, "other.example.com", why, sizeof(why)));
	assert_non_null(strstr(why, "the host other.example.com is not among the names"));
	/* an address literal is judged by the networks */
	assert_true(qb_egress_host_ok(e, "10.0.0.5", why, sizeof(why)));
	assert_false(qb_egress_host_ok(e, "[::1]", why, sizeof(why)));
	qb_egress_free(e);

	/* no name listed: any name may be configured, its addresses judged later */
	e = policy("10.0.0.0/8");
	assert_true(qb_egress_host_ok(e, "anything.example.org", why, sizeof(why)));
	qb_egress_free(e);
}

static void
test_hosts_of_urls(void **state)
{
	QbEgress   *e = policy("localhost, 10.0.0.0/8");
	char		why[300];

	assert_true(qb_egress_hosts_ok(e, "http://localhost:8080/x", why, sizeof(why)));
	assert_true(qb_egress_hosts_ok(e, "amqp://user:p%40ss@localhost:5672/vh", why, sizeof(why)));
	assert_true(qb_egress_hosts_ok(e, "nats://10.0.0.1:4222,nats://localhost:4223", why, sizeof(why)));
	assert_true(qb_egress_hosts_ok(e, "10.0.0.1:9092,localhost:9093", why, sizeof(why)));
	assert_false(qb_egress_hosts_ok(e, "10.0.0.1:9092,broker.example.com:9092", why, sizeof(why)));
	assert_non_null(strstr(why, "broker.example.com"));
	assert_false(qb_egress_hosts_ok(e, "http://169.254.169.254/latest/meta-data", why, sizeof(why)));
	assert_false(qb_egress_hosts_ok(e, "http://[fe80::1]:80/", why, sizeof(why)));
	/* the user info is not the host */
	assert_false(qb_egress_hosts_ok(e, "amqp://localhost@evil.example.com/", why, sizeof(why)));
	qb_egress_free(e);
}

static void
test_bad_entries(void **state)
{
	static const char *const bad[] = {"10.0.0.0/33", "::/129", "10.0.0.0/", "10.0.0.0/x",
	"host name", "a_b.example.com", "*example.com", "ex*.com", "http://x", "host/8", NULL};

	for (int i = 0; bad[i]; i++)
	{
		QbEgress   *e = NULL;
		char		err[300] = "";

		if (strchr(bad[i], ' ') != NULL)
			continue;			/* a blank separates two entries: not an error */
		assert_false(qb_egress_parse(bad[i], "egress.allow", &e, err, sizeof(err)));
		assert_null(e);
		assert_non_null(strstr(err, "egress.allow: \""));
		assert_non_null(strstr(err, "is neither a CIDR"));
	}
}

/* the validator: egress.allow in a daemon's document, and its checks */
static void
test_config(void **state)
{
	QbConfig   *cfg = NULL;
	char		err[600];
	static const char doc_ok[] =
		"egress:\n  allow: [localhost, 10.0.0.0/8]\n"
		"destinations:\n  web: {type: http, baseUrl: \"http://localhost:9\"}\n"
		"  bus: {type: kafka, brokers: \"10.0.0.1:9092\", topic: t}\n"
		"routes:\n  - {topicPattern: \"#\", destination: web}\n";
	static const char doc_name[] =
		"egress:\n  allow: [10.0.0.0/8, hooks.example.com]\n"
		"destinations:\n  web: {type: http, baseUrl: \"http://other.example.com\"}\n"
		"routes:\n  - {topicPattern: \"#\", destination: web}\n";
	static const char doc_meta[] =
		"destinations:\n  web: {type: http, baseUrl: \"http://169.254.169.254\"}\n"
		"routes:\n  - {topicPattern: \"#\", destination: web}\n";
	static const char doc_bad[] = "egress:\n  allow: [\"10.0.0.0/99\"]\n";

	assert_int_equal(qb_config_parse(doc_ok, sizeof(doc_ok) - 1, &cfg, err, sizeof(err)), 0);
	assert_non_null(cfg->egress);
	assert_ptr_equal(cfg->destinations[0].egress, cfg->egress);
	qb_config_free(cfg);

	assert_int_equal(qb_config_parse(doc_name, sizeof(doc_name) - 1, &cfg, err, sizeof(err)), -1);
	assert_non_null(strstr(err, "destinations.web.baseUrl: egress refused: the host other.example.com"));
	assert_non_null(strstr(err, "egress.allow"));

	assert_int_equal(qb_config_parse(doc_meta, sizeof(doc_meta) - 1, &cfg, err, sizeof(err)), -1);
	assert_non_null(strstr(err, "destinations.web.baseUrl: egress refused: 169.254.169.254 is a link-local"));
	assert_non_null(strstr(err, "list it in egress.allow"));

	assert_int_equal(qb_config_parse(doc_bad, sizeof(doc_bad) - 1, &cfg, err, sizeof(err)), -1);
	assert_non_null(strstr(err, "egress.allow: egress.allow: \"10.0.0.0/99\" is neither"));

	/* once the host owns the policy (the extension), a document may not set one */
	assert_true(qb_egress_set("10.0.0.0/8", "queuebox.allowed_destinations", err, sizeof(err)));
	assert_true(qb_egress_host_owned());
	assert_int_equal(qb_config_parse(doc_ok, sizeof(doc_ok) - 1, &cfg, err, sizeof(err)), -1);
	assert_non_null(strstr(err, "egress: this host takes its egress rules from queuebox.allowed_destinations"));
	assert_int_equal(qb_config_parse(doc_meta, sizeof(doc_meta) - 1, &cfg, err, sizeof(err)), -1);
	assert_non_null(strstr(err, "list it in queuebox.allowed_destinations"));
	/* and a bad list leaves the policy in force */
	assert_false(qb_egress_set("nope/1", "queuebox.allowed_destinations", err, sizeof(err)));
	assert_int_equal(qb_egress_current()->ncidrs, 1);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_default_refuses_metadata),
		cmocka_unit_test(test_cidrs),
		cmocka_unit_test(test_names),
		cmocka_unit_test(test_hosts_of_urls),
		cmocka_unit_test(test_bad_entries),
		cmocka_unit_test(test_config),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
