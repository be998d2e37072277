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
#include "qb_egress_policy.h"

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

/* judge an address as connect time would, reached through via (NULL: unknown) */
static bool
conn_ok(const QbEgress *e, const char *via, const char *ip, char *why, size_t whylen)
{
	struct sockaddr_in v4 = {.sin_family = AF_INET};
	struct sockaddr_in6 v6 = {.sin6_family = AF_INET6};

	if (inet_pton(AF_INET, ip, &v4.sin_addr) == 1)
		return qb_egress_addr_ok(e, via, (struct sockaddr *) &v4, why, whylen);
	assert_int_equal(inet_pton(AF_INET6, ip, &v6.sin6_addr), 1);
	return qb_egress_addr_ok(e, via, (struct sockaddr *) &v6, why, whylen);
}

/* an address reached through a URL naming it */
static bool
addr_ok(const QbEgress *e, const char *ip, char *why, size_t whylen)
{
	return conn_ok(e, NULL, ip, why, whylen);
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
	assert_true(qb_egress_hosts_ok(e, "hooks.example.com", why, sizeof(why)));
	assert_true(qb_egress_hosts_ok(e, "HOOKS.example.com.", why, sizeof(why)));
	assert_true(qb_egress_hosts_ok(e, "a.example.net", why, sizeof(why)));
	assert_true(qb_egress_hosts_ok(e, "a.b.example.net", why, sizeof(why)));
	assert_false(qb_egress_hosts_ok(e, "example.net", why, sizeof(why)));
	assert_false(qb_egress_hosts_ok(e, "evil-example.net", why, sizeof(why)));
	assert_false(qb_egress_hosts_ok(e, "other.example.com", why, sizeof(why)));
	assert_non_null(strstr(why, "the host other.example.com is not among the names"));
	/* an address literal is judged by the networks */
	assert_true(qb_egress_hosts_ok(e, "10.0.0.5", why, sizeof(why)));
	assert_false(qb_egress_hosts_ok(e, "[::1]", why, sizeof(why)));
	qb_egress_free(e);

	/* tabs and newlines separate entries too (the list was once sized by commas and blanks only) */
	e = policy("10.0.0.0/8\thooks.example.com\nb.example.com\t\t\tc.example.com");
	assert_int_equal(e->nrules, 4);
	qb_egress_free(e);

	/* no name listed: any name may be configured, its addresses judged later */
	e = policy("10.0.0.0/8");
	assert_true(qb_egress_hosts_ok(e, "anything.example.org", why, sizeof(why)));
	qb_egress_free(e);
}

/*
 * A names-only list: every host written as an address is refused, in each
 * spelling a resolver or libcurl accepts, at configure time and at connect
 * time; a listed name passes both.
 */
static void
test_names_only(void **state)
{
	QbEgress   *e = policy("hooks.partner.example");
	char		why[300];
	static const char *const hosts[] = {"127.0.0.1", "10.1.2.3", "[::1]", "::1",
		"[::ffff:127.0.0.1]", "::ffff:7f00:1", "[64:ff9b::7f00:1]", "2130706433", "0x7f000001",
		"0177.0.0.1", "127.1", "0x7f.1", "127.0.0.1.", "017700000001", NULL};
	static const char *const urls[] = {"http://127.0.0.1:57998", "http://[::1]:80/x",
		"http://[::ffff:127.0.0.1]/", "http://10.1.2.3:8080", "http://2130706433/",
		"http://0x7f.0.0.1/", "http://127.1:9/", "http://%31%32%37.0.0.1/",
		"https://[::ffff:7f00:1]:443", "http://[fe80::1%25eth0]/", "amqp://u:p@10.0.0.1:5672/vh",
		"nats://127.0.0.1:4222", "127.0.0.1:9092", "hooks.partner.example:9092,10.0.0.1:9092", NULL};

	for (int i = 0; hosts[i]; i++)
	{
		why[0] = '\0';
		if (qb_egress_hosts_ok(e, hosts[i], why, sizeof(why)))
			fail_msg("host %s passed a names-only list", hosts[i]);
		assert_non_null(strstr(why, "lists names only"));
	}
	for (int i = 0; urls[i]; i++)
		if (qb_egress_hosts_ok(e, urls[i], why, sizeof(why)))
			fail_msg("%s passed a names-only list", urls[i]);
	/* an old spelling is read as libcurl reads it: the address it stands for */
	assert_false(qb_egress_hosts_ok(e, "2130706433", why, sizeof(why)));
	assert_non_null(strstr(why, "egress refused: 127.0.0.1 is an address, and queuebox.allowed_destinations lists names only"));
	/* a name that is no listed name, though it resolves to an address */
	assert_false(qb_egress_hosts_ok(e, "localhost", why, sizeof(why)));
	assert_false(qb_egress_hosts_ok(e, "http://127.0.0.1.nip.io/", why, sizeof(why)));
	assert_true(qb_egress_hosts_ok(e, "http://hooks.partner.example/in", why, sizeof(why)));
	assert_true(qb_egress_hosts_ok(e, "https://HOOKS.partner.example.:8443", why, sizeof(why)));
	/* the URL reader's (libcurl's) reading: the user info ends at the '@' */
	assert_true(qb_egress_hosts_ok(e, "http://127.0.0.1:80@hooks.partner.example/", why, sizeof(why)));
	assert_false(qb_egress_hosts_ok(e, "http://hooks.partner.example@127.0.0.1/", why, sizeof(why)));

	/* connect time: the address is judged with the host it was reached through */
	assert_true(conn_ok(e, "http://hooks.partner.example/in", "10.1.2.3", why, sizeof(why)));
	assert_true(conn_ok(e, "hooks.partner.example:9092/1", "10.1.2.3", why, sizeof(why)));
	assert_true(conn_ok(e, "sasl_ssl://hooks.partner.example:9093/2", "::1", why, sizeof(why)));
	assert_false(conn_ok(e, "http://10.1.2.3:8080", "10.1.2.3", why, sizeof(why)));
	assert_non_null(strstr(why, "egress refused: 10.1.2.3 is an address, and queuebox.allowed_destinations lists names only"));
	assert_false(conn_ok(e, "http://2130706433/", "127.0.0.1", why, sizeof(why)));
	assert_false(conn_ok(e, "127.0.0.1:9092/bootstrap", "127.0.0.1", why, sizeof(why)));
	assert_false(conn_ok(e, "[::1]:9092/bootstrap", "::1", why, sizeof(why)));
	assert_false(conn_ok(e, "::1", "::1", why, sizeof(why)));
	assert_false(conn_ok(e, "http://localhost:9/", "127.0.0.1", why, sizeof(why)));
	assert_non_null(strstr(why, "the host localhost is not among the names of queuebox.allowed_destinations"));
	assert_false(conn_ok(e, NULL, "127.0.0.1", why, sizeof(why)));
	/* a listed name never reaches a metadata address */
	assert_false(conn_ok(e, "http://hooks.partner.example/", "169.254.169.254", why, sizeof(why)));
	assert_non_null(strstr(why, "link-local or cloud metadata"));
	qb_egress_free(e);
}

/* the metadata addresses in every spelling, with no list */
static void
test_metadata_spellings(void **state)
{
	QbEgress   *e = policy("");
	char		why[300];
	static const char *const hosts[] = {"169.254.169.254", "2852039166", "0xa9fea9fe",
		"0251.0376.0251.0376", "169.254.43518", "0xa9.0xfe.0xa9.0xfe", "[::ffff:169.254.169.254]",
		"[::ffff:a9fe:a9fe]", "[64:ff9b::a9fe:a9fe]", "169.254.169.254.", "[fe80::1]",
		"100.100.100.200", "1684301000", NULL};

	for (int i = 0; hosts[i]; i++)
	{
		why[0] = '\0';
		if (qb_egress_hosts_ok(e, hosts[i], why, sizeof(why)))
			fail_msg("host %s passed", hosts[i]);
		assert_non_null(strstr(why, "link-local or cloud metadata"));
	}
	assert_false(qb_egress_hosts_ok(e, "http://2852039166/latest/meta-data", why, sizeof(why)));
	assert_false(conn_ok(e, "http://example.com/", "64:ff9b::a9fe:a9fe", why, sizeof(why)));
	assert_true(qb_egress_hosts_ok(e, "2130706433", why, sizeof(why)));
	assert_true(conn_ok(e, "http://10.1.2.3/", "10.1.2.3", why, sizeof(why)));
	qb_egress_free(e);
}

/* mapped and NAT64 networks in a list; old spellings refused in a list */
static void
test_mapped_entries(void **state)
{
	QbEgress   *e = policy("::ffff:10.0.0.0/104, 64:ff9b::c000:207/128");
	QbEgress   *bad = NULL;
	char		why[300];

	assert_int_equal(e->rules[0].family, AF_INET);
	assert_int_equal(e->rules[0].bits, 8);
	assert_true(addr_ok(e, "10.200.0.1", why, sizeof(why)));
	assert_true(addr_ok(e, "::ffff:10.200.0.1", why, sizeof(why)));
	assert_true(addr_ok(e, "192.0.2.7", why, sizeof(why)));
	assert_false(addr_ok(e, "11.0.0.1", why, sizeof(why)));
	assert_true(qb_egress_hosts_ok(e, "[::ffff:10.1.1.1]", why, sizeof(why)));
	qb_egress_free(e);

	assert_false(qb_egress_parse("2130706433", "egress.allow", &bad, why, sizeof(why)));
	assert_non_null(strstr(why, "egress.allow: \"2130706433\" is an address in an old spelling; write it as 127.0.0.1"));
	assert_false(qb_egress_parse("10.1", "egress.allow", &bad, why, sizeof(why)));
	assert_null(bad);
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

/* the validator: egress.allow in a daemon's document, the host's policy, and their checks */
static void
test_config(void **state)
{
	QbConfig   *cfg = NULL;
	char		err[600];
	QbEgressPolicy host = {NULL};	/* the extension's, as its runtime holds it */
	const QbConfigEnv env = {.egress = &host};
	struct sockaddr_in v4 = {0};
	QbEgress   *wide;
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
	static const char doc_host[] =
		"destinations:\n  web: {type: http, baseUrl: \"http://10.1.2.3:8080\"}\n"
		"routes:\n  - {topicPattern: \"#\", destination: web}\n";
	static const char doc_names_only[] =
		"egress:\n  allow: [hooks.partner.example]\n"
		"destinations:\n  web: {type: http, baseUrl: \"http://10.1.2.3:8080\"}\n"
		"routes:\n  - {topicPattern: \"#\", destination: web}\n";

	assert_int_equal(qb_config_parse(doc_ok, sizeof(doc_ok) - 1, NULL, &cfg, err, sizeof(err)), 0);
	assert_non_null(cfg->egress);
	assert_ptr_equal(cfg->destinations[0].egress, cfg->egress);
	qb_config_free(cfg);

	assert_int_equal(qb_config_parse(doc_name, sizeof(doc_name) - 1, NULL, &cfg, err, sizeof(err)), -1);
	assert_non_null(strstr(err, "destinations.web.baseUrl: egress refused: the host other.example.com"));
	assert_non_null(strstr(err, "egress.allow"));

	assert_int_equal(qb_config_parse(doc_meta, sizeof(doc_meta) - 1, NULL, &cfg, err, sizeof(err)), -1);
	assert_non_null(strstr(err, "destinations.web.baseUrl: egress refused: 169.254.169.254 is a link-local"));
	assert_non_null(strstr(err, "list it in egress.allow"));

	assert_int_equal(qb_config_parse(doc_bad, sizeof(doc_bad) - 1, NULL, &cfg, err, sizeof(err)), -1);
	assert_non_null(strstr(err, "egress.allow: egress.allow: \"10.0.0.0/99\" is neither"));

	assert_int_equal(qb_config_parse(doc_names_only, sizeof(doc_names_only) - 1, NULL, &cfg, err, sizeof(err)), -1);
	assert_non_null(strstr(err, "destinations.web.baseUrl: egress refused: 10.1.2.3 is an address, and egress.allow lists names only"));

	/* once the host has a policy (the extension), a document may not set one */
	assert_true(qb_egress_policy_set(&host, "10.0.0.0/8", "queuebox.allowed_destinations", err, sizeof(err)));
	assert_non_null(qb_egress_policy_rules(&host));
	assert_int_equal(qb_config_parse(doc_ok, sizeof(doc_ok) - 1, &env, &cfg, err, sizeof(err)), -1);
	assert_non_null(strstr(err, "egress: this host takes its egress rules from queuebox.allowed_destinations"));
	assert_int_equal(qb_config_parse(doc_meta, sizeof(doc_meta) - 1, &env, &cfg, err, sizeof(err)), -1);
	assert_non_null(strstr(err, "list it in queuebox.allowed_destinations"));
	/* the same document without that env: the process holds no policy of its own */
	assert_int_equal(qb_config_parse(doc_ok, sizeof(doc_ok) - 1, NULL, &cfg, err, sizeof(err)), 0);
	qb_config_free(cfg);
	/* and a bad list leaves the policy in force */
	assert_false(qb_egress_policy_set(&host, "nope/1", "queuebox.allowed_destinations", err, sizeof(err)));
	assert_int_equal(qb_egress_policy_rules(&host)->ncidrs, 1);

	/*
	 * a destination keeps the host's policy, not a copy: a list narrowed
	 * after the document was stored judges its next connect
	 */
	assert_int_equal(qb_config_parse(doc_host, sizeof(doc_host) - 1, &env, &cfg, err, sizeof(err)), 0);
	assert_null(cfg->destinations[0].egress);
	assert_ptr_equal(cfg->destinations[0].host_egress, &host);
	wide = host.rules;			/* a host never frees the rules it replaced; a test may */
	assert_true(qb_egress_policy_set(&host, "192.168.0.0/16", "queuebox.allowed_destinations", err, sizeof(err)));
	v4.sin_family = AF_INET;
	inet_pton(AF_INET, "10.1.2.3", &v4.sin_addr);
	assert_false(qb_egress_addr_ok(qb_egress_in_force(cfg->destinations[0].egress,
													  cfg->destinations[0].host_egress),
								   "http://10.1.2.3:8080", (struct sockaddr *) &v4, err, sizeof(err)));
	assert_non_null(strstr(err, "10.1.2.3 is in no network of queuebox.allowed_destinations"));
	qb_config_free(cfg);
	qb_egress_free(wide);
	qb_egress_free(host.rules);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_default_refuses_metadata),
		cmocka_unit_test(test_cidrs),
		cmocka_unit_test(test_names),
		cmocka_unit_test(test_names_only),
		cmocka_unit_test(test_metadata_spellings),
		cmocka_unit_test(test_mapped_entries),
		cmocka_unit_test(test_hosts_of_urls),
		cmocka_unit_test(test_bad_entries),
		cmocka_unit_test(test_config),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
