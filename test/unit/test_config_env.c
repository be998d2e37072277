/*-------------------------------------------------------------------------
 * test_config_env.c
 *	  Unit tests of qb_config_env.c: ${NAME} expansion, alone and in a
 *	  document; ${file:PATH} secrets (the allowed directories, symlinks, a
 *	  file's size and bytes, no message repeating a content); the URL and
 *	  broker-list checks (qb_url_check, qb_url_check_scheme), alone and
 *	  through a document.
 *
 * The three ${file:} tests share a directory of secret files: the first
 * makes it, the last removes it, so they run in that order.
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

/* ---- ${NAME} ------------------------------------------------------ */

static void
test_expand_env_direct(void **state)
{
	static const struct
	{
		const char *in;
		const char *out;
	}			ok[] = {
		{"", ""}, {"plain", "plain"}, {"${QB_T_A}", "alpha"}, {"x${QB_T_A}y${QB_T_A}z", "xalphayalphaz"},
		{"$${QB_T_A}", "${QB_T_A}"}, {"$$", "$$"}, {"$", "$"}, {"a$b", "a$b"}, {"$$${QB_T_A}", "$${QB_T_A}"},
		{"${QB_T_EMPTY}", ""}, {"${QB_T_REF}", "${QB_T_A}"},	/* one pass only */
		{"${_x1}", "u"}, {"}{", "}{"},
	};
	static const struct
	{
		const char *in;
		const char *msg;
	}			bad[] = {
		{"${QB_T_UNSET}", "environment variable QB_T_UNSET is not set"},
		{"${QB_T_A", "unterminated ${ reference"},
		{"abc ${", "unterminated ${ reference"},
		{"${}", "bad variable name in \"${}\""},
		{"${1A}", "bad variable name in \"${1A}\""},
		{"${A-B}", "bad variable name"},
		{"${A:-x}", "bad variable name"},
	};
	char		err[QB_ERRLEN];
	size_t		i;

	setenv("QB_T_A", "alpha", 1);
	setenv("QB_T_EMPTY", "", 1);
	setenv("QB_T_REF", "${QB_T_A}", 1);
	setenv("_x1", "u", 1);
	unsetenv("QB_T_UNSET");
	for (i = 0; i < sizeof(ok) / sizeof(ok[0]); i++)
	{
		char	   *s = qb_expand_env(ok[i].in, &test_env, err, sizeof(err));

		if (s == NULL)
			fail_msg("%s: %s", ok[i].in, err);
		assert_string_equal(s, ok[i].out);
		free(s);
	}
	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
	{
		err[0] = '\0';
		assert_null(qb_expand_env(bad[i].in, &test_env, err, sizeof(err)));
		if (strstr(err, bad[i].msg) == NULL)
			fail_msg("%s: \"%s\" lacks \"%s\"", bad[i].in, err, bad[i].msg);
	}
	unsetenv("QB_T_A");
	unsetenv("QB_T_EMPTY");
	unsetenv("QB_T_REF");
	unsetenv("_x1");
}
static void
test_expand_env_in_document(void **state)
{
	QbConfig   *c;
	char		err[QB_ERRLEN];

	setenv("QB_T_BATCH", "42", 1);
	setenv("QB_T_HOST", "127.0.0.1:9000", 1);
	setenv("QB_T_KEY", "s3cr3t-value", 1);
	c = accept("outbox:\n  batchSize: ${QB_T_BATCH}\n"
			   "destinations:\n  payments:\n    type: http\n    baseUrl: \"http://${QB_T_HOST}\"\n"
			   "    path: /a/$${QB_T_BATCH}/b\n"
			   "    headers: { X-Api-Key: \"Bearer ${QB_T_KEY}\" }\n"
			   "  log: { type: kafka, brokers: h, config: { \"sasl.password\": \"${QB_T_KEY}\" } }\n");
	assert_int_equal(c->outbox.batch_size, 42);
	assert_string_equal(c->destinations[0].url, "http://127.0.0.1:9000/a/${QB_T_BATCH}/b");
	assert_string_equal(c->destinations[0].headers[0].value, "Bearer s3cr3t-value");
	assert_string_equal(c->destinations[1].props[0].value, "s3cr3t-value");
	qb_config_free(c);
	/* keys are not expanded: librdkafka is asked about the name as written */
	refuse("destinations:\n  log: { type: kafka, brokers: h, config: { \"${QB_T_KEY}\": x } }\n",
		   "destinations.log.config.${QB_T_KEY}: librdkafka refused it: No such configuration property", NULL);

	/* expansion happens before the type check */
	setenv("QB_T_BATCH", "lots", 1);
	refuse("outbox:\n  batchSize: ${QB_T_BATCH}\n",
		   "outbox.batchSize: expected an integer from 1 to 10000, got \"lots\" (line 2, column 14)", NULL);

	unsetenv("QB_T_UNSET");
	refuse("destinations:\n  payments:\n    type: http\n    baseUrl: \"http://h\"\n"
		   "    headers: { X-Api-Key: \"${QB_T_UNSET}\" }\n",
		   "destinations.payments.headers.X-Api-Key: environment variable QB_T_UNSET is not set",
		   "(line 5, column 27)", NULL);
	refuse("outbox:\n  retention: \"${QB_T_BATCH\"\n", "outbox.retention: unterminated ${ reference", NULL);

	/* a secret that makes the value invalid is not echoed */
	setenv("QB_T_KEY", "s3cr3t\r\nX-Evil: 1", 1);
	refused_message("destinations:\n  p: { type: http, baseUrl: \"http://h\", headers: { X-K: \"${QB_T_KEY}\" } }\n",
					err, sizeof(err));
	assert_non_null(strstr(err, "destinations.p.headers.X-K: the header value contains a line break"));
	assert_null(strstr(err, "s3cr3t"));
	setenv("QB_T_KEY", "http://user:s3cr3t@h", 1);
	refused_message("destinations:\n  p: { type: http, baseUrl: \"${QB_T_KEY}\" }\n", err, sizeof(err));
	assert_non_null(strstr(err, "destinations.p.baseUrl: user info"));
	assert_null(strstr(err, "s3cr3t"));

	unsetenv("QB_T_BATCH");
	unsetenv("QB_T_HOST");
	unsetenv("QB_T_KEY");
}
/* ---- ${file:PATH} ------------------------------------------------ */

/* a private directory of secret files: mkdtemp, removed at the end */
static char file_dir[64];
static char file_other[64];

static void
write_file(const char *dir, const char *name, const char *content, size_t len)
{
	char		path[256];
	FILE	   *f;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	f = fopen(path, "w");
	assert_non_null(f);
	assert_int_equal(fwrite(content, 1, len, f), len);
	fclose(f);
}

static void
expect_expand(const char *in, const char *out)
{
	char		err[QB_ERRLEN] = "";
	char	   *s = qb_expand_env(in, &test_env, err, sizeof(err));

	if (s == NULL)
		fail_msg("%s: %s", in, err);
	assert_string_equal(s, out);
	free(s);
}

/* expect_refused: refused with every string of the NULL-terminated list in the message */
static void
expect_refused(const char *in,...)
{
	char		err[QB_ERRLEN] = "";
	const char *want;
	va_list		ap;

	assert_null(qb_expand_env(in, &test_env, err, sizeof(err)));
	va_start(ap, in);
	while ((want = va_arg(ap, const char *)) != NULL)
		if (strstr(err, want) == NULL)
			fail_msg("%s: \"%s\" lacks \"%s\"", in, err, want);
	va_end(ap);
	/* no message repeats a file's content */
	assert_null(strstr(err, "s3cr3t"));
}

static void
test_expand_file(void **state)
{
	char		in[512];
	char		want[512];
	char		dirs[256];
	char		big[70000];

	strcpy(file_dir, "/tmp/qb-test-secrets-XXXXXX");
	strcpy(file_other, "/tmp/qb-test-other-XXXXXX");
	assert_non_null(mkdtemp(file_dir));
	assert_non_null(mkdtemp(file_other));
	write_file(file_dir, "github", "s3cr3t-gh\n", 10);
	write_file(file_dir, "crlf", "s3cr3t-w\r\n", 10);
	write_file(file_dir, "two", "s3cr3t-2\n\n", 10);
	write_file(file_dir, "bare", "s3cr3t-b", 8);
	write_file(file_dir, "empty", "", 0);
	write_file(file_dir, "nul", "s3cr3t\0x", 8);
	memset(big, 'a', sizeof(big));
	write_file(file_dir, "big", big, sizeof(big));
	write_file(file_other, "outside", "s3cr3t-out\n", 11);
	snprintf(in, sizeof(in), "%s/link", file_dir);
	snprintf(want, sizeof(want), "%s/outside", file_other);
	assert_int_equal(symlink(want, in), 0);
	snprintf(in, sizeof(in), "%s/inlink", file_dir);
	assert_int_equal(symlink("github", in), 0);

	/* the extension's setting: absolute directories only */
	assert_true(qb_config_file_dirs_valid(""));
	assert_true(qb_config_file_dirs_valid("/run/secrets, /etc/queuebox/,"));
	assert_false(qb_config_file_dirs_valid("/run/secrets,secrets"));

	/* the default allows no file, and says so without looking at it */
	test_set_file_dirs("", NULL);
	snprintf(in, sizeof(in), "${file:%s/github}", file_dir);
	expect_refused(in, "file reference ${file:", "/github}: file references are not allowed here", NULL);
	test_set_file_dirs("", "queuebox.secret_file_dirs");
	expect_refused(in, "no directory is allowed for secret files",
				   "a superuser sets queuebox.secret_file_dirs", NULL);

	/* allowed: one trailing newline goes, the rest stays */
	snprintf(dirs, sizeof(dirs), "/nonexistent/dir, %s/", file_dir);
	test_set_file_dirs(dirs, "queuebox.secret_file_dirs");
	expect_expand(in, "s3cr3t-gh");
	snprintf(in, sizeof(in), "Bearer ${file:%s/crlf}!", file_dir);
	expect_expand(in, "Bearer s3cr3t-w!");
	snprintf(in, sizeof(in), "${file:%s/two}", file_dir);
	expect_expand(in, "s3cr3t-2\n");
	snprintf(in, sizeof(in), "${file:%s/bare}${file:%s/empty}", file_dir, file_dir);
	expect_expand(in, "s3cr3t-b");
	snprintf(in, sizeof(in), "${file:%s/inlink}", file_dir);
	expect_expand(in, "s3cr3t-gh");
	/* $${file: stays literal; ${NAME} in the path is expanded first */
	expect_expand("$${file:/x}", "${file:/x}");
	setenv("QB_T_CREDS", file_dir, 1);
	expect_expand("${file:${QB_T_CREDS}/github}", "s3cr3t-gh");

	/* refused: outside (as written, through a symlink or ..), missing, not a file */
	snprintf(in, sizeof(in), "${file:%s/outside}", file_other);
	expect_refused(in, "/outside is outside the directories queuebox.secret_file_dirs allows", NULL);
	snprintf(in, sizeof(in), "${file:%s/link}", file_dir);
	snprintf(want, sizeof(want), "%s/outside is outside the directories", file_other);
	expect_refused(in, want, NULL);
	snprintf(in, sizeof(in), "${file:%s/../%s/outside}", file_dir, file_other + 5);
	expect_refused(in, "write an absolute path without \".\" or \"..\"", NULL);
	expect_refused("${file:relative/path}", "write an absolute path", NULL);
	expect_refused("${file:}", "write an absolute path", NULL);
	snprintf(in, sizeof(in), "${file:%s/missing}", file_dir);
	expect_refused(in, "/missing}: No such file or directory", NULL);
	snprintf(in, sizeof(in), "${file:%s}", file_dir);
	expect_refused(in, "is outside the directories", NULL);
	snprintf(in, sizeof(in), "${file:%s/nul}", file_dir);
	expect_refused(in, "the file contains a NUL byte", NULL);
	snprintf(in, sizeof(in), "${file:%s/big}", file_dir);
	expect_refused(in, "the file is larger than 65536 bytes", NULL);
	expect_refused("${file:/etc/passwd", "unterminated ${file: reference", NULL);
	expect_refused("${file:${file:/x}}", "a file reference cannot hold another one", NULL);
	unsetenv("QB_T_UNSET");
	expect_refused("${file:${QB_T_UNSET}/x}", "environment variable QB_T_UNSET is not set", NULL);
	/* a variable's value never shows: the reference is shown as written */
	setenv("QB_T_SECRETV", "s3cr3t-var", 1);
	expect_refused("${file:%s/../${QB_T_SECRETV}}", "${file:%s/../${QB_T_SECRETV}}: write an absolute path", NULL);
	expect_refused("${file:${QB_T_CREDS}/${QB_T_SECRETV}}",
				   "${file:${QB_T_CREDS}/${QB_T_SECRETV}}: No such file or directory", NULL);
	setenv("QB_T_SECRETV", file_other + 1, 1);	/* no leading '/': the path is /${...} */
	expect_refused("${file:/${QB_T_SECRETV}/outside}",
				   "${file:/${QB_T_SECRETV}/outside}: the file is outside the directories", NULL);
	{
		char		err[QB_ERRLEN] = "";

		assert_null(qb_expand_env("${file:/${QB_T_SECRETV}/outside}", &test_env, err, sizeof(err)));
		assert_null(strstr(err, file_other + 1));
	}
	unsetenv("QB_T_SECRETV");

	/* any path (the daemon) */
	test_set_file_dirs(NULL, NULL);
	snprintf(in, sizeof(in), "${file:%s/outside}", file_other);
	expect_expand(in, "s3cr3t-out");
	test_set_file_dirs("", NULL);
	unsetenv("QB_T_CREDS");
}

/*
 * refused_file_doc: the document fmt, its %s the directory of secret
 * files, is refused with want in the message and no file content.
 */
static void
refused_file_doc(const char *fmt, const char *want)
{
	char		doc[1024];
	char		err[QB_ERRLEN];

	snprintf(doc, sizeof(doc), fmt, file_dir);
	refused_message(doc, err, sizeof(err));
	if (strstr(err, want) == NULL)
		fail_msg("\"%s\" lacks \"%s\"", err, want);
	assert_null(strstr(err, "s3cr3t"));
}

static void
test_expand_file_in_document(void **state)
{
	char		doc[1024];
	QbConfig   *c;

	test_set_file_dirs(file_dir, "queuebox.secret_file_dirs");
	snprintf(doc, sizeof(doc),
			 "destinations:\n  p: { type: http, baseUrl: \"http://h\", headers: { X-K: \"${file:%s/github}\" } }\n",
			 file_dir);
	c = accept(doc);
	assert_string_equal(c->destinations[0].headers[0].value, "s3cr3t-gh");
	qb_config_free(c);
	/* the key path and the line, the file, never the content */
	snprintf(doc, sizeof(doc),
			 "destinations:\n  p: { type: http, baseUrl: \"http://h\", headers: { X-K: \"${file:%s/outside}\" } }\n",
			 file_other);
	refuse(doc, "destinations.p.headers.X-K: file reference ${file:", "/outside}: ", "(line 2", NULL);
	/* a value made invalid by the file: the message says what is wrong, no content */
	refused_file_doc("destinations:\n  p: { type: http, baseUrl: \"http://h\", headers: { X-K: \"${file:%s/crlf}x\\r\\n\" } }\n",
					 "destinations.p.headers.X-K: the header value contains a line break");
	/* a number or a name from a file is not echoed either (one from a variable is) */
	refused_file_doc("outbox:\n  batchSize: \"${file:%s/github}\"\n",
					 "outbox.batchSize: expected an integer from 1 to 10000, got the content of a file (not repeated");
	refused_file_doc("destinations:\n  p: { type: \"${file:%s/github}\" }\n", "destinations.p.type: expected");
	/* a check that would quote part of it (a URL's scheme) says so instead */
	refused_file_doc("destinations:\n  p: { type: http, baseUrl: \"${file:%s/github}://h\" }\n",
					 "destinations.p.baseUrl: the value, read from a file, is not valid here; the message is not shown");
	test_set_file_dirs("", NULL);
}

/* test_expand_file_cleanup: the files and directories of the two tests above */
static void
test_expand_file_cleanup(void **state)
{
	static const char *const names[] = {"github", "crlf", "two", "bare", "empty", "nul", "big", "link", "inlink"};
	char		path[256];

	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
	{
		snprintf(path, sizeof(path), "%s/%s", file_dir, names[i]);
		unlink(path);
	}
	snprintf(path, sizeof(path), "%s/outside", file_other);
	unlink(path);
	assert_int_equal(rmdir(file_dir), 0);
	assert_int_equal(rmdir(file_other), 0);
}
/* ---- URLs ------------------------------------------------------------ */

static void
test_url_check(void **state)
{
	static const char *const good[] = {
		"http://127.0.0.1:9000", "https://example.com/base", "HTTPS://Example.COM", "http://h:1",
		"http://h:65535/a/b/", "http://[::1]:8080/x", "http://[::1]", "http://my_host.local",
		"http://host:",			/* an empty port is none (RFC 3986), as libcurl reads it */
	};
	static const struct
	{
		const char *url;
		const char *msg;
	}			bad[] = {
		{"ftp://x", "unsupported scheme \"ftp\" (use http or https)"},
		{"http://", "no host after \"http://\""},
		{"http:///path", "no host"},
		{"http://host:0", "the port must be a number from 1 to 65535"},
		{"http://host:99999", "the port must be a number from 1 to 65535"},
		{"http://host:80x", "the port must be"},
		{"http://host:99999999999999999999", "the port must be"},
		{"http://user@host", "user info (user@ or user:password@) is not allowed"},
		{"http://user:pw@host", "user info"},
		{"http://h/p?q=1", "a query string (?...) is not allowed"},
		{"http://h?q", "a query string"},
		{"http://h/p#frag", "a fragment"},
		{"not a url", "not a URL"},
		{"not-a-url", "not a URL"},
		{"", "not a URL"},
		{"://h", "not a URL"},
		{"http://h h", "space"},
		{"http://h\n", "control character"},
		{"http://ho$t", "invalid character in the host name"},
		{"http://[::1", "closing ']'"},
		{"http://[zz]", "IPv6"},
		{"http://[::1]x", "after the IPv6 host"},
	};
	char		err[QB_ERRLEN];
	size_t		i;

	for (i = 0; i < sizeof(good) / sizeof(good[0]); i++)
		if (!qb_url_check(good[i], err, sizeof(err)))
			fail_msg("%s refused: %s", good[i], err);
	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
	{
		err[0] = '\0';
		if (qb_url_check(bad[i].url, err, sizeof(err)))
			fail_msg("%s accepted", bad[i].url);
		if (strstr(err, bad[i].msg) == NULL)
			fail_msg("%s: \"%s\" lacks \"%s\"", bad[i].url, err, bad[i].msg);
	}

	/* the message never repeats the URL: it may hold a password */
	assert_false(qb_url_check("http://u:s3cr3t@h", err, sizeof(err)));
	assert_null(strstr(err, "s3cr3t"));

	/* the scheme-aware form */
	{
		static const char *const amqp[] = {"amqp", "amqps", NULL};

		assert_true(qb_url_check_scheme("amqp://guest:guest@127.0.0.1:5672/", amqp,
										QB_URL_USERINFO | QB_URL_QUERY, err, sizeof(err)));
		assert_true(qb_url_check_scheme("amqps://h/vhost?heartbeat=10", amqp,
										QB_URL_USERINFO | QB_URL_QUERY, err, sizeof(err)));
		assert_false(qb_url_check_scheme("amqp://u:p@h", amqp, 0, err, sizeof(err)));
		assert_non_null(strstr(err, "user info"));
		assert_false(qb_url_check_scheme("http://h", amqp, QB_URL_USERINFO, err, sizeof(err)));
		assert_non_null(strstr(err, "unsupported scheme \"http\" (use amqp or amqps)"));
		assert_false(qb_url_check_scheme("amqp://u:s3cr3t@h:0/", amqp, QB_URL_USERINFO, err, sizeof(err)));
		assert_non_null(strstr(err, "port"));
		assert_null(strstr(err, "s3cr3t"));
	}

	/* the same checks reached through a document */
	refuse("destinations:\n  p: { type: http, baseUrl: \"http://h/p?q=1\" }\n",
		   "destinations.p.baseUrl: a query string", "(line 2, column 29)", NULL);
	refuse("destinations:\n  p: { type: http, baseUrl: \"\" }\n", "destinations.p.baseUrl: not a URL", NULL);
	refuse("destinations:\n  b: { type: rabbitmq, url: \"http://h\", exchange: e }\n",
		   "destinations.b.url: unsupported scheme \"http\" (use amqp or amqps)", NULL);
	refuse("destinations:\n  n: { type: nats, url: \"amqp://h\" }\n",
		   "destinations.n.url: unsupported scheme \"amqp\" (use nats or tls)", NULL);
	refuse("destinations:\n  n: { type: nats, url: \"nats://a:1,\" }\n", "destinations.n.url: empty entry", NULL);
	refuse("destinations:\n  n: { type: nats, url: \"nats://a:1,nats://b:0\" }\n", "destinations.n.url: the port", NULL);
	refuse("destinations:\n  k: { type: kafka, brokers: \"a:9092,,b\" }\n", "destinations.k.brokers: empty entry", NULL);
	refuse("destinations:\n  k: { type: kafka, brokers: \"a:0\" }\n", "destinations.k.brokers: the port", NULL);
	refuse("destinations:\n  k: { type: kafka, brokers: \"\" }\n", "destinations.k.brokers: empty entry", NULL);
	refuse("destinations:\n  k: { type: kafka, brokers: \"a b\" }\n", "destinations.k.brokers: the broker list contains a space", NULL);
	qb_config_free(accept("destinations:\n  k: { type: kafka, brokers: \"SSL://a:9093,[::1]:9092,c\" }\n"));
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_expand_env_direct),
		cmocka_unit_test(test_expand_env_in_document),
		cmocka_unit_test(test_expand_file),
		cmocka_unit_test(test_expand_file_in_document),
		cmocka_unit_test(test_expand_file_cleanup),
		cmocka_unit_test(test_url_check),
	};

	return cmocka_run_group_tests_name("qb_config_env", tests, NULL, NULL);
}
