/*
 * test_odbc.c
 *	  cmocka tests of what the SQL Server side of the daemon does without a
 *	  server (src/daemon/backend/sqlserver/odbc_*.c): sqlserver:// URLs
 *	  into connection strings (escaping of ; and } in passwords), the error
 *	  classes, the JSON parameters of the procedures, the parameter
 *	  bindings, the T-SQL text of each query, the schema's batches, and
 *	  that every procedure the store calls is made by the schema.  The same store against an
 *	  engine is TAP 031 (QUEUEBOX_TEST_MSSQL_URL).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include <jansson.h>
#include <sql.h>
#include <sqlext.h>

#include "odbc_store.h"
#include "qbd.h"

extern const char qbd_schema_mssql[];

static char *
conn_string_in(const char *url, const char *driver, QbOdbcBraces style, char *err, size_t errlen)
{
	QbOdbcUrl	u;
	char	   *cs;

	if (qb_odbc_url_parse(url, &u, err, errlen) != 0)
		fail_msg("parse of %s failed: %s", url, err);
	cs = qb_odbc_conn_string(&u, driver, "queuebox-mssqld outbox 0", style, err, errlen);
	qb_odbc_url_free(&u);
	return cs;
}

static char *
conn_string(const char *url, const char *driver)
{
	char		err[QB_ERRLEN] = "";
	char	   *cs = conn_string_in(url, driver, QB_ODBC_BRACES_ODBC, err, sizeof(err));

	if (cs == NULL)
		fail_msg("%s: %s", url, err);
	return cs;
}

static void
test_conn_string(void **state)
{
	char	   *cs = conn_string("sqlserver://queuebox:s3cret@db.internal:1444/app?encrypt=false",
								 "/usr/lib/x86_64-linux-gnu/odbc/libtdsodbc.so");

	assert_string_equal(cs,
						"DRIVER=/usr/lib/x86_64-linux-gnu/odbc/libtdsodbc.so;SERVER=db.internal;PORT=1444;"
						"DATABASE=app;UID=queuebox;PWD={s3cret};TDS_Version=7.4;ClientCharset=UTF-8;"
						"Encryption=off;APP=queuebox-mssqld outbox 0");
	free(cs);

	/* the defaults: port 1433, TLS required; a registered driver name as it is */
	cs = conn_string("sqlserver://queuebox:pw@db/app", "{FreeTDS}");
	assert_non_null(strstr(cs, "DRIVER={FreeTDS};SERVER=db;PORT=1433;"));
	assert_non_null(strstr(cs, ";Encryption=require;"));
	free(cs);

	cs = conn_string("sqlserver://queuebox:pw@db/app?encrypt=request&odbcDriver=/opt/x/libtdsodbc.so", "{FreeTDS}");
	assert_non_null(strstr(cs, "DRIVER=/opt/x/libtdsodbc.so;"));
	assert_non_null(strstr(cs, ";Encryption=request;"));
	free(cs);

	/*
	 * a driver that only starts like a braced name is quoted, not written as
	 * it is: "{FreeT" would brace SERVER, PORT ... into the driver's name, and
	 * "{x};Encryption=off;{y}" would add a keyword (fuzz_url's reproducer)
	 */
	cs = conn_string("sqlserver://queuebox:S3CR3T;x@db.internal:1433/app?encrypt=request&odbcDriver=%7BFreeT:143D",
					 "{FreeTDS}");
	assert_non_null(strstr(cs, "DRIVER={{FreeT:143D};SERVER=db.internal;"));
	free(cs);
	cs = conn_string("sqlserver://queuebox:pw@db/app?odbcDriver=%7Bx%7D;Encryption=off;%7By%7D", "{FreeTDS}");
	assert_non_null(strstr(cs, "DRIVER={{x}};Encryption=off;{y}}};SERVER=db;"));
	assert_non_null(strstr(cs, ";Encryption=require;"));
	free(cs);
	cs = conn_string("sqlserver://queuebox:pw@db/app?odbcDriver=%7BODBC%20Driver%2018%7D", "{FreeTDS}");
	assert_non_null(strstr(cs, "DRIVER={ODBC Driver 18};SERVER=db;"));
	free(cs);
}

/* a password with ; } { = and spaces: braced, each } doubled, percent-decoded first */
static void
test_conn_string_escaping(void **state)
{
	char	   *cs = conn_string("sqlserver://queue%3Bbox:a%3Bb%7Dc%7B%3D%20d%40e@db/app%7Dx", "{FreeTDS}");

	assert_non_null(strstr(cs, ";PWD={a;b}}c{= d@e};"));
	assert_non_null(strstr(cs, ";UID={queue;box};"));
	assert_non_null(strstr(cs, ";DATABASE={app}}x};"));
	free(cs);

	/* a password of only a brace */
	cs = conn_string("sqlserver://u:%7D@db/app", "{FreeTDS}");
	assert_non_null(strstr(cs, ";PWD={}}};"));
	free(cs);
}

/* FreeTDS before 1.4 reads "}}" as two braces and ends a value at "};" */
static void
test_conn_string_freetds13(void **state)
{
	char		err[QB_ERRLEN] = "";
	char	   *cs = conn_string_in("sqlserver://u:a%3Bb%7Dc@db/app", "/x/libtdsodbc.so",
									QB_ODBC_BRACES_FREETDS13, err, sizeof(err));

	assert_non_null(cs);
	assert_non_null(strstr(cs, ";PWD={a;b}c};"));
	free(cs);
	/* "};" and a final "}" cannot be written: refused, the password not named */
	assert_null(conn_string_in("sqlserver://u:a%7D%3Bb@db/app", "/x/libtdsodbc.so",
							   QB_ODBC_BRACES_FREETDS13, err, sizeof(err)));
	assert_non_null(strstr(err, "the password holds \"};\" or ends with \"}\""));
	assert_non_null(strstr(err, "FreeTDS 1.4"));
	assert_null(strstr(err, "a}"));
	assert_null(conn_string_in("sqlserver://u:ab%7D@db/app", "/x/libtdsodbc.so",
							   QB_ODBC_BRACES_FREETDS13, err, sizeof(err)));
	/*
	 * a driver path with a '}': the driver manager reads it as ODBC says,
	 * FreeTDS 1.3 its own way, so it is refused (fuzz_url's reproducer)
	 */
	assert_null(conn_string_in("sqlserver://u:p%8D%3B@h/db?odbcDriver=/usr/lib://u:p%7D%3B@he",
							   "/x/libtdsodbc.so", QB_ODBC_BRACES_FREETDS13, err, sizeof(err)));
	assert_non_null(strstr(err, "the odbcDriver holds \"}\""));
	cs = conn_string_in("sqlserver://u:p@h/db?odbcDriver=/opt/a;b/libtdsodbc.so", "/x/libtdsodbc.so",
						QB_ODBC_BRACES_FREETDS13, err, sizeof(err));
	assert_non_null(cs);
	assert_non_null(strstr(cs, "DRIVER={/opt/a;b/libtdsodbc.so};SERVER=h;"));
	free(cs);
}

static void
write_fake(const char *path, const char *version)
{
	FILE	   *f = fopen(path, "wb");
	static char junk[70000];

	assert_non_null(f);
	memset(junk, 'x', sizeof(junk));
	/* the text past the first read's 64 KiB, cut across two pieces */
	fwrite(junk, 1, 65536 - 5, f);
	fputs(version, f);
	fwrite(junk, 1, 100, f);
	fclose(f);
}

static void
test_freetds_version(void **state)
{
	char		path[] = "/tmp/qb_test_odbc_XXXXXX";
	int			fd = mkstemp(path);
	int			major,
				minor;

	assert_true(fd >= 0);
	close(fd);
	write_fake(path, "freetds v1.3.17");
	assert_int_equal(qb_odbc_freetds_version(path, &major, &minor), 1);
	assert_int_equal(major, 1);
	assert_int_equal(minor, 3);
	assert_int_equal(qb_odbc_braces_for(path), QB_ODBC_BRACES_FREETDS13);
	write_fake(path, "freetds v1.4.2");
	assert_int_equal(qb_odbc_braces_for(path), QB_ODBC_BRACES_ODBC);
	write_fake(path, "no version here");
	assert_int_equal(qb_odbc_freetds_version(path, &major, &minor), 0);
	assert_int_equal(qb_odbc_braces_for(path), QB_ODBC_BRACES_ODBC);
	unlink(path);
	assert_int_equal(qb_odbc_braces_for("/nonexistent/libtdsodbc.so"), QB_ODBC_BRACES_ODBC);
	assert_int_equal(qb_odbc_braces_for("{FreeTDS}"), QB_ODBC_BRACES_ODBC);
}

static void
test_quote(void **state)
{
	char		out[64];

	assert_int_equal(qb_odbc_quote("plain", QB_ODBC_BRACES_ODBC, false, out, sizeof(out)), 5);
	assert_string_equal(out, "plain");
	assert_int_equal(qb_odbc_quote("plain", QB_ODBC_BRACES_ODBC, true, out, sizeof(out)), 7);
	assert_string_equal(out, "{plain}");
	assert_int_equal(qb_odbc_quote("a}b", QB_ODBC_BRACES_ODBC, false, out, sizeof(out)), 6);
	assert_string_equal(out, "{a}}b}");
	assert_int_equal(qb_odbc_quote("a}b", QB_ODBC_BRACES_FREETDS13, false, out, sizeof(out)), 5);
	assert_string_equal(out, "{a}b}");
	assert_int_equal(qb_odbc_quote("a};b", QB_ODBC_BRACES_FREETDS13, false, out, sizeof(out)), (size_t) -1);
	qb_odbc_quote(" lead", QB_ODBC_BRACES_ODBC, false, out, sizeof(out));
	assert_string_equal(out, "{ lead}");
	qb_odbc_quote("k=v", QB_ODBC_BRACES_ODBC, false, out, sizeof(out));
	assert_string_equal(out, "{k=v}");
	/* a short buffer is cut, never overrun; the length says what it needs */
	assert_int_equal(qb_odbc_quote("a;b", QB_ODBC_BRACES_ODBC, false, out, 3), 5);
	assert_string_equal(out, "{a");
}

static void
expect_url_error(const char *url, const char *needle)
{
	QbOdbcUrl	u;
	char		err[QB_ERRLEN] = "";

	assert_int_equal(qb_odbc_url_parse(url, &u, err, sizeof(err)), -1);
	if (strstr(err, needle) == NULL)
		fail_msg("%s: \"%s\" does not say \"%s\"", url, err, needle);
	/* no secret in a message */
	assert_null(strstr(err, "hunter2"));
}

static void
test_url_errors(void **state)
{
	expect_url_error("postgres://u:hunter2@db/app", "not a sqlserver:// URL");
	expect_url_error("sqlserver://u:hunter2@db", "no database");
	expect_url_error("sqlserver://u:hunter2@db/", "no database");
	expect_url_error("sqlserver://u:hunter2@db/a/b", "no database");
	expect_url_error("sqlserver://db/app", "no user");
	expect_url_error("sqlserver://u:hunter2@db:99999/app", "port");
	expect_url_error("sqlserver://u:hunter2@db/app?encrypt=maybe", "encrypt=maybe is not a choice");
	expect_url_error("sqlserver://u:hunter2@db/app?trustServerCertificate=true",
					 "unknown option \"trustServerCertificate\"");
	expect_url_error("sqlserver://u:hunter2@db/app?encrypt=true&sslmode=require", "unknown option \"sslmode\"");
}

/* a failed connect's advice: by the native number, else the SQLSTATE's class */
static void
test_connect_advice(void **state)
{
	assert_non_null(strstr(qb_odbc_connect_advice("28000", 18456), "check the user and the password in database.url"));
	assert_non_null(strstr(qb_odbc_connect_advice("42000", 18456), "check the user and the password"));
	assert_non_null(strstr(qb_odbc_connect_advice("42000", 4060), "check the database in database.url's path"));
	/* Babelfish: a database that does not exist is 911, with SQLSTATE 08004 */
	assert_non_null(strstr(qb_odbc_connect_advice("08004", 911), "check the database in database.url's path"));
	assert_non_null(strstr(qb_odbc_connect_advice("08001", 0), "check database.url's host and port"));
	assert_non_null(strstr(qb_odbc_connect_advice("08S01", 20009), "check database.url's host and port"));
	assert_null(qb_odbc_connect_advice("HY000", 0));
	assert_null(qb_odbc_connect_advice(NULL, 0));
}

static void
test_classify(void **state)
{
	assert_int_equal(qb_odbc_classify("40001", 1205), QB_ODBC_RETRY);
	assert_int_equal(qb_odbc_classify("HY000", 1222), QB_ODBC_RETRY);
	assert_int_equal(qb_odbc_classify("HY000", 33557097), QB_ODBC_RETRY);
	assert_int_equal(qb_odbc_classify("23000", 2627), QB_ODBC_DUPLICATE);
	assert_int_equal(qb_odbc_classify("23000", 2601), QB_ODBC_DUPLICATE);
	assert_int_equal(qb_odbc_classify("42000", 51000), QB_ODBC_PULL_BUSY);
	assert_int_equal(qb_odbc_classify("42000", 50022), QB_ODBC_BAD_INPUT);
	assert_int_equal(qb_odbc_classify("42000", 50002), QB_ODBC_NOT_FOUND);
	assert_int_equal(qb_odbc_classify("22018", 245), QB_ODBC_BAD_INPUT);
	assert_int_equal(qb_odbc_classify("22007", 241), QB_ODBC_BAD_INPUT);
	assert_int_equal(qb_odbc_classify("23000", 547), QB_ODBC_BAD_INPUT);
	assert_int_equal(qb_odbc_classify("22001", 2628), QB_ODBC_BAD_INPUT);
	assert_int_equal(qb_odbc_classify("08S01", 0), QB_ODBC_LOST);
	assert_int_equal(qb_odbc_classify("08001", 0), QB_ODBC_LOST);
	assert_int_equal(qb_odbc_classify("HYT01", 0), QB_ODBC_LOST);
	assert_int_equal(qb_odbc_classify("HYT00", 0), QB_ODBC_TIMEOUT);
	assert_int_equal(qb_odbc_classify("42S02", 208), QB_ODBC_FAILED);
	assert_int_equal(qb_odbc_classify("40001", 0), QB_ODBC_RETRY);
	assert_int_equal(qb_odbc_classify(NULL, 0), QB_ODBC_FAILED);
}

static json_t *
load(const char *text)
{
	json_error_t e;
	json_t	   *j = json_loads(text, 0, &e);

	if (j == NULL)
		fail_msg("not JSON (%s): %s", e.text, text);
	return j;
}

static void
test_json_settles(void **state)
{
	QbSettle	s[3] = {
		{.id = 7, .token = "3f2504e0-4f89-11d3-9a0c-0305e82c3301", .kind = QB_SETTLE_RETRY,
		.attempt = 2, .delay_ms = 1500, .error = "HTTP 503 \"busy\"\n", .destination = "billing"},
		{.id = 9007199254740993LL, .token = "3f2504e0-4f89-11d3-9a0c-0305e82c3301",
		.kind = QB_SETTLE_SENT, .attempt = 1},
		/* a fan-out row's first settle: routed back, its copies a JSON value */
		{.id = 8, .token = "3f2504e0-4f89-11d3-9a0c-0305e82c3301", .kind = QB_SETTLE_ROUTE,
		.destination = "billing", .unrouted = true, .copies = "[\"search\",\"partner\"]"},
	};
	bool		oom = false;
	char	   *text = qb_odbc_json_settles(s, 3, &oom);
	json_t	   *j = load(text);
	json_t	   *c;

	assert_false(oom);
	assert_int_equal(json_array_size(j), 3);
	assert_int_equal(json_integer_value(json_object_get(json_array_get(j, 0), "id")), 7);
	assert_string_equal(json_string_value(json_object_get(json_array_get(j, 0), "o")), "retry");
	assert_int_equal(json_integer_value(json_object_get(json_array_get(j, 0), "ms")), 1500);
	assert_string_equal(json_string_value(json_object_get(json_array_get(j, 0), "err")), "HTTP 503 \"busy\"\n");
	assert_string_equal(json_string_value(json_object_get(json_array_get(j, 0), "d")), "billing");
	/* ids past 2^53 stay exact; NULL strings are JSON null */
	assert_int_equal(json_integer_value(json_object_get(json_array_get(j, 1), "id")), 9007199254740993LL);
	assert_true(json_is_null(json_object_get(json_array_get(j, 1), "err")));
	assert_true(json_is_null(json_object_get(json_array_get(j, 1), "d")));
	assert_string_equal(json_string_value(json_object_get(json_array_get(j, 1), "o")), "sent");
	/* "u": unrouted at the claim; "c" only on a fan-out row's first settle */
	assert_true(json_is_false(json_object_get(json_array_get(j, 0), "u")));
	assert_null(json_object_get(json_array_get(j, 0), "c"));
	assert_true(json_is_true(json_object_get(json_array_get(j, 2), "u")));
	c = json_object_get(json_array_get(j, 2), "c");
	assert_true(json_is_array(c));
	assert_int_equal(json_array_size(c), 2);
	assert_string_equal(json_string_value(json_array_get(c, 1)), "partner");
	json_decref(j);
	free(text);
	assert_null(qb_odbc_json_settles(s, 0, &oom));
	assert_false(oom);
}

static void
test_json_claim_and_tallies(void **state)
{
	const char *dests[2] = {"billing", "search"};
	int			limits[2] = {10, 0};
	QbClaimReq	c = {.batch_size = 50, .lease_ms = 30000, .default_max_attempts = 5,
	.token = "3f2504e0-4f89-11d3-9a0c-0305e82c3301", .floor = 41, .dests = dests, .limits = limits,
	.ndests = 2, .probe_ms = 5000};
	QbDestTally t = {.destination = "billing", .ok = 1, .failed = 2, .gone = true,
	.retry_after_ms = 60000, .error = NULL, .threshold = 5, .cooldown_ms = 30000};
	bool		oom = false;
	char	   *text = qb_odbc_json_claim(&c, &oom);
	json_t	   *j = load(text);

	assert_int_equal(json_integer_value(json_object_get(j, "batch")), 50);
	assert_int_equal(json_integer_value(json_object_get(j, "lease")), 30000);
	assert_int_equal(json_integer_value(json_object_get(j, "maxa")), 5);
	assert_int_equal(json_integer_value(json_object_get(j, "floor")), 41);
	assert_int_equal(json_integer_value(json_object_get(j, "probe")), 5000);
	assert_string_equal(json_string_value(json_object_get(j, "token")), c.token);
	assert_int_equal(json_array_size(json_object_get(j, "dests")), 2);
	assert_string_equal(json_string_value(json_object_get(json_array_get(json_object_get(j, "dests"), 1), "n")),
						"search");
	assert_int_equal(json_integer_value(json_object_get(json_array_get(json_object_get(j, "dests"), 1), "l")), 0);
	json_decref(j);
	free(text);
	assert_null(qb_odbc_json_claim(NULL, &oom));

	text = qb_odbc_json_tallies(&t, 1, &oom);
	j = load(text);
	assert_true(json_is_true(json_object_get(json_array_get(j, 0), "gone")));
	assert_int_equal(json_integer_value(json_object_get(json_array_get(j, 0), "ra")), 60000);
	assert_int_equal(json_integer_value(json_object_get(json_array_get(j, 0), "fail")), 2);
	assert_true(json_is_null(json_object_get(json_array_get(j, 0), "err")));
	json_decref(j);
	free(text);
	assert_false(oom);
}

static void
test_json_inbox_and_names(void **state)
{
	QbInboxRow	rows[2] = {
		{.source = "stripe", .idempotency_key = "evt_1", .event_type = "charge.succeeded",
		.payload = "{\"a\":\"\\u00e9\"}", .headers = "{}", .pull = false},
		{.source = "stripe", .idempotency_key = "evt_2", .payload = "[1]", .headers = "{}",
		.pull = true, .dead_error = "not JSON"},
	};
	const char *names[2] = {"a\"b", "c"};
	bool		oom = false;
	char	   *text = qb_odbc_json_inbox_rows(rows, 2, &oom);
	json_t	   *j = load(text);

	/* the payload and headers are JSON values in the document, as sent */
	assert_non_null(strstr(text, "\"p\":{\"a\":\"\\u00e9\"},\"h\":{}"));
	assert_string_equal(json_string_value(json_object_get(json_object_get(json_array_get(j, 0), "p"), "a")), "\xc3\xa9");
	assert_false(json_is_true(json_object_get(json_array_get(j, 0), "ps")));
	assert_string_equal(json_string_value(json_object_get(json_array_get(j, 0), "c")), "push");
	assert_true(json_is_null(json_object_get(json_array_get(j, 0), "a")));
	assert_string_equal(json_string_value(json_object_get(json_array_get(j, 1), "c")), "pull");
	assert_string_equal(json_string_value(json_object_get(json_array_get(j, 1), "err")), "not JSON");
	json_decref(j);
	free(text);

	/* a JSON scalar payload goes inside brackets, flagged; big integers are kept as written */
	{
		QbInboxRow	sc[1] = {{.source = "s", .idempotency_key = "k", .payload = " 12345678901234567890123",
		.headers = "{\"x\": 1}"}};
		QbInboxRow	bad[1] = {{.source = "s", .idempotency_key = "k", .payload = "{oops", .headers = "{}"}};
		QbInboxRow	badh[1] = {{.source = "s", .idempotency_key = "k", .payload = "{}", .headers = "[1]"}};

		text = qb_odbc_json_inbox_rows(sc, 1, &oom);
		assert_non_null(strstr(text, "\"p\":[ 12345678901234567890123]"));
		assert_non_null(strstr(text, "\"ps\":true"));
		free(text);
		assert_null(qb_odbc_json_inbox_rows(bad, 1, &oom));
		assert_false(oom);
		assert_null(qb_odbc_json_inbox_rows(badh, 1, &oom));
		assert_false(oom);
	}

	text = qb_odbc_json_names(names, 2, &oom);
	assert_string_equal(text, "[\"a\\\"b\",\"c\"]");
	free(text);
	/* no destination at all is an empty array, not NULL */
	text = qb_odbc_json_names(NULL, 0, &oom);
	assert_string_equal(text, "[]");
	free(text);

	{
		int64_t		ids[2] = {3, 4};
		const char *topics[2] = {"stripe.charge", ""};

		const bool	holds[2] = {true, true};

		text = qb_odbc_json_topics(ids, topics, NULL, 2, &oom);
		assert_string_equal(text, "[{\"id\":3,\"t\":\"stripe.charge\"},{\"id\":4,\"t\":\"\"}]");
		free(text);
		/* a row that holds its aggregate if it goes dead says so (onDead: holdKey) */
		text = qb_odbc_json_topics(ids, topics, holds, 2, &oom);
		assert_string_equal(text, "[{\"id\":3,\"t\":\"stripe.charge\",\"h\":1},{\"id\":4,\"t\":\"\",\"h\":1}]");
		free(text);
	}
	assert_false(oom);
}

/* the inbox columns' lengths, in UTF-16 units: said before anything is sent */
static void
test_check_lengths(void **state)
{
	char		key[402];
	char		wide[4 * 201 + 1];
	char		err[QB_ERRLEN] = "";
	QbInboxRow	r = {.source = "web", .idempotency_key = key, .payload = "{}", .headers = "{}"};

	memset(key, 'k', 400);
	key[400] = '\0';
	assert_int_equal(qb_odbc_check_lengths(&r, 1, err, sizeof(err)), 0);
	key[400] = 'k';
	key[401] = '\0';
	assert_int_equal(qb_odbc_check_lengths(&r, 1, err, sizeof(err)), -1);
	assert_non_null(strstr(err, "the idempotency key of a message of source \"web\" is 401 characters long; SQL Server stores at most 400"));
	/* 100 four-byte characters are 200 UTF-16 units: a source of 200 fits */
	wide[0] = '\0';
	for (int i = 0; i < 100; i++)
		strcat(wide, "\xf0\x9f\x98\x80");
	r.idempotency_key = "k";
	r.source = wide;
	assert_int_equal(qb_odbc_check_lengths(&r, 1, err, sizeof(err)), 0);
	strcat(wide, "e");
	assert_int_equal(qb_odbc_check_lengths(&r, 1, err, sizeof(err)), -1);
	assert_non_null(strstr(err, "the source of a message"));
	assert_non_null(strstr(err, "is 201 characters long; SQL Server stores at most 200"));
}

static void
test_binding(void **state)
{
	char	   *big = malloc(5001);
	QbOdbcBinding b;

	b = qb_odbc_binding(&(QbOdbcParam) {.type = QB_ODBC_T_INT, .num = 5});
	assert_int_equal(b.c_type, SQL_C_SBIGINT);
	assert_int_equal(b.sql_type, SQL_BIGINT);
	b = qb_odbc_binding(&(QbOdbcParam) {.type = QB_ODBC_T_UUID, .text = "x"});
	assert_int_equal(b.c_type, SQL_C_CHAR);
	assert_int_equal(b.sql_type, SQL_GUID);
	b = qb_odbc_binding(&(QbOdbcParam) {.type = QB_ODBC_T_TEXT, .text = "héllo"});
	assert_int_equal(b.sql_type, SQL_WVARCHAR);
	assert_int_equal(b.column_size, 6);
	b = qb_odbc_binding(&(QbOdbcParam) {.type = QB_ODBC_T_TEXT, .text = NULL});
	assert_int_equal(b.sql_type, SQL_WVARCHAR);
	assert_int_equal(b.column_size, 1);
	memset(big, 'x', 5000);
	big[5000] = '\0';
	b = qb_odbc_binding(&(QbOdbcParam) {.type = QB_ODBC_T_TEXT, .text = big});
	assert_int_equal(b.sql_type, SQL_WLONGVARCHAR);
	assert_int_equal(b.column_size, 5000);
	free(big);
}

static int
count_markers(const char *sql)
{
	int			n = 0;
	bool		quoted = false;

	for (const char *p = sql; *p; p++)
	{
		if (*p == '\'')
			quoted = !quoted;
		else if (*p == '?' && !quoted)
			n++;
	}
	return n;
}

/* every query has a text (or is rendered in C) with one marker per parameter */
static void
test_query_texts(void **state)
{
	for (int q = 0; q < QB_NQUERIES; q++)
	{
		int			np = -1;
		const char *sql = qb_odbc_query_text((QbQuery) q, &np);

		assert_true(np >= 0 && np <= 10);
		if (q == QB_Q_REPLAY_INBOX || q == QB_Q_REPLAY_INBOX_BULK)
		{
			assert_null(sql);
			continue;
		}
		if (sql == NULL)
			fail_msg("query %d has no T-SQL text", q);
		if (count_markers(sql) != np)
			fail_msg("query %d takes %d parameters but has %d markers: %s", q, np, count_markers(sql), sql);
		/* a procedure a query calls is made by the schema */
		{
			const char *e = strstr(sql, "EXEC queuebox.");

			if (e != NULL)
			{
				char		name[80];
				char		def[120];

				sscanf(e + 5, "%79[a-z_.]", name);
				char		def_nl[120];

				/* a procedure without parameters ends its line at the name */
				snprintf(def, sizeof(def), "CREATE PROCEDURE %s ", name);
				snprintf(def_nl, sizeof(def_nl), "CREATE PROCEDURE %s\n", name);
				if (strstr(qbd_schema_mssql, def) == NULL && strstr(qbd_schema_mssql, def_nl) == NULL)
					fail_msg("query %d calls %s, which the schema does not create", q, name);
			}
		}
	}
	assert_null(qb_odbc_query_text(QB_NQUERIES, &(int) {0}));
	/* the replay's select: id, state, source, since, until */
	assert_int_equal(count_markers(qb_odbc_replay_select), 5);
}

typedef struct Batches
{
	int			n;
	char		first[64];
	bool		go_left;
} Batches;

static int
on_batch(void *arg, const char *batch)
{
	Batches    *b = arg;

	if (b->n++ == 0)
		snprintf(b->first, sizeof(b->first), "%s", batch);
	/* a GO line never reaches the server */
	for (const char *p = batch; (p = strstr(p, "GO")) != NULL; p += 2)
		if ((p == batch || p[-1] == '\n') && (p[2] == '\n' || p[2] == '\0' || p[2] == '\r'))
			b->go_left = true;
	return 0;
}

static void
test_batches(void **state)
{
	Batches		b = {0};

	assert_int_equal(qb_mssql_batches("SELECT 1\nGO\n\n  go \r\nSELECT 2\nGOTO x\nGO", on_batch, &b), 0);
	assert_int_equal(b.n, 2);
	assert_string_equal(b.first, "SELECT 1\n");
	assert_false(b.go_left);

	memset(&b, 0, sizeof(b));
	assert_int_equal(qb_mssql_batches("SELECT 3", on_batch, &b), 0);
	assert_int_equal(b.n, 1);
	assert_string_equal(b.first, "SELECT 3");

	/* the schema: CREATE SCHEMA alone first, no GO left, and the version substituted */
	memset(&b, 0, sizeof(b));
	assert_int_equal(qb_mssql_batches(qbd_schema_mssql, on_batch, &b), 0);
	assert_true(b.n > 30);
	assert_false(b.go_left);
	assert_null(strstr(qbd_schema_mssql, "@SCHEMA_VERSION@"));
	assert_non_null(strstr(qbd_schema_mssql, qbd_schema_version));
}

/* every procedure the store and the pull examples call is made by the schema, once */
static void
test_schema_procedures(void **state)
{
	static const char *const called[] = {
		"queuebox._outbox_cycle", "queuebox._outbox_unpark", "queuebox._outbox_unroute",
		"queuebox._outbox_reclaim", "queuebox._outbox_retention", "queuebox._outbox_sweep",
		"queuebox._inbox_insert",
		"queuebox._relay_claim", "queuebox._relay_forward", "queuebox._inbox_replay",
		"queuebox.inbox_claim", "queuebox.inbox_renew", "queuebox.inbox_complete",
		"queuebox.inbox_dead", "queuebox.inbox_retry", "queuebox.destination_status",
		"queuebox.requeue_inbox_edited", "queuebox.skip_inbox", "queuebox.held_aggregates",
	};

	for (size_t i = 0; i < sizeof(called) / sizeof(called[0]); i++)
	{
		char		def[120];
		const char *at;

		snprintf(def, sizeof(def), "CREATE PROCEDURE %s ", called[i]);
		if ((at = strstr(qbd_schema_mssql, def)) == NULL)
		{
			snprintf(def, sizeof(def), "CREATE PROCEDURE %s\n", called[i]);
			at = strstr(qbd_schema_mssql, def);
		}
		if (at == NULL)
			fail_msg("the schema does not create %s", called[i]);
		assert_null(strstr(at + 1, def));
	}
	/* the claim's lock timeout is the spec's Msg 51000, after 10 s */
	assert_non_null(strstr(qbd_schema_mssql, "THROW 51000"));
	assert_non_null(strstr(qbd_schema_mssql, "@LockTimeout = 10000"));
	assert_non_null(strstr(qbd_schema_mssql, "@LockOwner = N'Transaction'"));
	/* no MERGE anywhere (known bugs; insert-where-not-exists instead) */
	assert_null(strstr(qbd_schema_mssql, "MERGE "));
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_conn_string),
		cmocka_unit_test(test_conn_string_escaping),
		cmocka_unit_test(test_conn_string_freetds13),
		cmocka_unit_test(test_freetds_version),
		cmocka_unit_test(test_quote),
		cmocka_unit_test(test_url_errors),
		cmocka_unit_test(test_connect_advice),
		cmocka_unit_test(test_classify),
		cmocka_unit_test(test_json_settles),
		cmocka_unit_test(test_json_claim_and_tallies),
		cmocka_unit_test(test_json_inbox_and_names),
		cmocka_unit_test(test_check_lengths),
		cmocka_unit_test(test_binding),
		cmocka_unit_test(test_query_texts),
		cmocka_unit_test(test_batches),
		cmocka_unit_test(test_schema_procedures),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
