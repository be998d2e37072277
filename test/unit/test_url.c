/*-------------------------------------------------------------------------
 * test_url.c
 *	  Unit tests of qb_url.c, the one URL reader: the parts of each
 *	  scheme's URL, default ports, decoding, what is refused and how it is
 *	  said, the host an entry names (egress), query items and lists.
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

#include "qb_url.h"

static const char *const any[] = {"amqp", "amqps", "nats", "tls", "http", "https", "sqlserver", NULL};

static void
test_parts(void **state)
{
	QbUrl		u;
	char		err[256] = "";

	assert_true(qb_url_read("AMQPS://u:p%40ss@Broker.example:5999/v%2Fh?heartbeat=10", any,
							QB_URL_USERINFO | QB_URL_QUERY, &u, err, sizeof(err)));
	assert_string_equal(u.scheme, "amqps");
	assert_string_equal(u.user, "u");
	assert_string_equal(u.password, "p@ss");
	assert_string_equal(u.host, "Broker.example");
	assert_int_equal(u.port, 5999);
	assert_true(u.port_written);
	assert_string_equal(u.path, "/v/h");
	assert_true(u.path_one_segment);
	assert_string_equal(u.query, "heartbeat=10");
	qb_url_free(&u);

	/* defaults: no user info, the scheme's port, "/" */
	assert_true(qb_url_read("nats://[::1]", any, 0, &u, err, sizeof(err)));
	assert_null(u.user);
	assert_null(u.password);
	assert_string_equal(u.host, "::1");
	assert_int_equal(u.port, 4222);
	assert_false(u.port_written);
	assert_string_equal(u.path, "/");
	assert_null(u.query);
	qb_url_free(&u);

	/* a user without password; an address in an old spelling reads as a.b.c.d */
	assert_true(qb_url_read("sqlserver://sa@2130706433/db/x", any, QB_URL_USERINFO, &u, err, sizeof(err)));
	assert_string_equal(u.user, "sa");
	assert_null(u.password);
	assert_string_equal(u.host, "127.0.0.1");
	assert_int_equal(u.port, 1433);
	assert_false(u.path_one_segment);
	qb_url_free(&u);

	/* the user info ends at the '@' (one only: a second makes the host invalid) */
	assert_true(qb_url_read("http://127.0.0.1:80@hooks.example/", any, QB_URL_USERINFO, &u, err, sizeof(err)));
	assert_string_equal(u.host, "hooks.example");
	assert_string_equal(u.password, "80");
	qb_url_free(&u);

	assert_int_equal(qb_url_default_port("https"), 443);
	assert_int_equal(qb_url_default_port("postgresql"), 5432);
	assert_int_equal(qb_url_default_port("gopher"), 0);
}

static void
refuse(const char *url, int flags, const char *want)
{
	QbUrl		u;
	char		err[256] = "";

	if (qb_url_read(url, any, flags, &u, err, sizeof(err)))
		fail_msg("accepted %s", url);
	assert_null(u.host);
	if (strstr(err, want) == NULL)
		fail_msg("%s: got \"%s\", want \"%s\"", url, err, want);
	if (strstr(err, "s3cr3t") != NULL)
		fail_msg("%s: the message repeats the password: %s", url, err);
}

static void
test_refused(void **state)
{
	int			all = QB_URL_USERINFO | QB_URL_QUERY;

	refuse("ftp://u:s3cr3t@h", all, "unsupported scheme \"ftp\" (use amqp, amqps, nats, tls, http, https or sqlserver)");
	refuse("amqp:/h", all, "not a URL: expected amqp://");
	refuse("amqp://u:s3cr3t@h h", all, "space");
	refuse("amqp://u:s3cr3t@h#f", all, "fragment");
	refuse("amqp://u:s3cr3t@", all, "no host after \"amqp://\"");
	refuse("amqp:///vhost", all, "no host");
	refuse("amqp://u:s3cr3t@h:0", all, "the port must be a number from 1 to 65535");
	refuse("amqp://u:s3cr3t@h:65536", all, "the port must be");
	refuse("amqp://u:s3cr3t@[::1", all, "closing ']'");
	refuse("amqp://u:s3cr3t@[::1]x", all, "after the IPv6 host");
	refuse("amqp://u:s3cr3t@[fe80::1%25eth0]", all, "zone id");
	refuse("amqp://u:s3cr3t@ho$t", all, "invalid character in the host name");
	refuse("amqp://u:s3cr3t@a@b", all, "percent-encode @");
	refuse("amqp://u:s3cr3t@h%5F%21/", all, "invalid character in the host name");
	refuse("amqp://u:s3cr3t%zz@h", all, "bad percent-encoding in the password");
	refuse("amqp://u%00:s3cr3t@h", all, "the user name contains %00");
	refuse("amqp://u:s3cr3t@h/%zz", all, "bad percent-encoding in the path");
	refuse("amqp://u:s3cr3t@h", QB_URL_QUERY, "user info (user@ or user:password@) is not allowed");
	refuse("amqp://h?x=1", QB_URL_USERINFO, "a query string (?...) is not allowed");
}

/* postgres:// URLs: libpq reads the authority */
static void
test_any_authority(void **state)
{
	static const char *const pg[] = {"postgres", "postgresql", NULL};
	QbUrl		u;
	char		err[256];

	assert_true(qb_url_read("postgres://q:pw@db1:5432,db2/app?target_session_attrs=any", pg,
							QB_URL_USERINFO | QB_URL_QUERY | QB_URL_ANY_AUTHORITY, &u, err, sizeof(err)));
	assert_string_equal(u.scheme, "postgres");
	assert_null(u.host);
	qb_url_free(&u);
	assert_false(qb_url_read("postgres://q@h/app#x", pg, QB_URL_ANY_AUTHORITY, &u, err, sizeof(err)));
	assert_non_null(strstr(err, "fragment"));
}

/* the host of a destination's entry, as egress reads it */
static void
test_host(void **state)
{
	static const struct
	{
		const char *entry;
		const char *host;
	}			cases[] = {
		{"http://u:p@Hooks.example:8443/x?y", "Hooks.example"},
		{"amqp://user:p%40ss@localhost:5672/vh", "localhost"},
		{"sasl_ssl://b1.example:9093", "b1.example"},
		{"10.0.0.1:9092", "10.0.0.1"},
		{"[::1]:9092", "::1"},
		{"::1", "::1"},
		{"http://0x7f.1/", "127.0.0.1"},
	};
	char		host[256];
	char		err[256];

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
	{
		if (!qb_url_host(cases[i].entry, strlen(cases[i].entry), host, sizeof(host), err, sizeof(err)))
			fail_msg("%s: %s", cases[i].entry, err);
		assert_string_equal(host, cases[i].host);
	}
	assert_false(qb_url_host("http://", 7, host, sizeof(host), err, sizeof(err)));
	assert_false(qb_url_host("http://a@b@c/", 13, host, sizeof(host), err, sizeof(err)));

	assert_true(qb_url_hostport_check("SSL://a:9093", 12, err, sizeof(err)));
	assert_false(qb_url_hostport_check("a:9093/x", 8, err, sizeof(err)));
	assert_non_null(strstr(err, "nothing more"));
	assert_false(qb_url_hostport_check("SSL://", 6, err, sizeof(err)));
	assert_non_null(strstr(err, "empty entry"));
}

static void
test_query_and_list(void **state)
{
	const char *q = "a=1&&b&c%3D=%26x";
	char	   *name;
	char	   *value;
	char		err[256];
	const char *next = "nats://a,,nats://b";
	const char *one;
	size_t		len;
	int			n = 0;

	assert_int_equal(qb_url_query_next(&q, &name, &value, err, sizeof(err)), 1);
	assert_string_equal(name, "a");
	assert_string_equal(value, "1");
	free(name);
	free(value);
	assert_int_equal(qb_url_query_next(&q, &name, &value, err, sizeof(err)), 1);
	assert_string_equal(name, "b");
	assert_null(value);
	free(name);
	assert_int_equal(qb_url_query_next(&q, &name, &value, err, sizeof(err)), 1);
	assert_string_equal(name, "c=");
	assert_string_equal(value, "&x");
	free(name);
	free(value);
	assert_int_equal(qb_url_query_next(&q, &name, &value, err, sizeof(err)), 0);
	q = "x=%g1";
	assert_int_equal(qb_url_query_next(&q, &name, &value, err, sizeof(err)), -1);
	assert_non_null(strstr(err, "bad percent-encoding in the query"));

	while ((one = qb_url_list_next(&next, &len)) != NULL)
	{
		static const size_t lens[] = {8, 0, 8};

		assert_true(n < 3);
		assert_int_equal(len, lens[n]);
		n++;
	}
	assert_int_equal(n, 3);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_parts),
		cmocka_unit_test(test_refused),
		cmocka_unit_test(test_any_authority),
		cmocka_unit_test(test_host),
		cmocka_unit_test(test_query_and_list),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
