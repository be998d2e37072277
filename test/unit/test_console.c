/*-------------------------------------------------------------------------
 * test_console.c
 *	  Unit tests of qb_console.c: the session cookie read back from a
 *	  Cookie header (other cookies, look-alike names, bad hex, a NUL), the
 *	  Set-Cookie values, the login body, the embedded files, the login's
 *	  rate limit (per peer, its window, a full table).  The console
 *	  served end to end, in a browser too, is TAP 052's.
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

#include "qb_console.h"

static void
test_cookie_round_trip(void **state)
{
	const char *token = "tok; en=\"\\ with spaces\x7f";
	char	   *set = qb_console_set_cookie(token, false);
	char		header[512];
	char		buf[128];

	assert_non_null(set);
	/* hex: no byte of the token (space, quote, semicolon) reaches the header */
	assert_int_equal(strspn(set + strlen(QB_CONSOLE_COOKIE "="), "0123456789abcdef"), 2 * strlen(token));
	assert_int_equal(set[strlen(QB_CONSOLE_COOKIE "=") + 2 * strlen(token)], ';');
	assert_non_null(strstr(set, "; Path=/; HttpOnly; SameSite=Strict"));
	assert_null(strstr(set, "Secure"));
	/* the cookie's value as a browser sends it back, among others */
	snprintf(header, sizeof(header), "a=1; %.*s; b=2", (int) strcspn(set, ";"), set);
	assert_true(qb_console_cookie_token(header, buf, sizeof(buf)));
	assert_string_equal(buf, token);
	free(set);

	set = qb_console_set_cookie("x", true);
	assert_non_null(strstr(set, "; Secure"));
	free(set);
	set = qb_console_set_cookie(NULL, false);
	assert_string_equal(set, QB_CONSOLE_COOKIE "=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0");
	free(set);
}

static void
test_cookie_refused(void **state)
{
	char		buf[8];

	assert_false(qb_console_cookie_token(NULL, buf, sizeof(buf)));
	assert_false(qb_console_cookie_token("", buf, sizeof(buf)));
	assert_false(qb_console_cookie_token("x" QB_CONSOLE_COOKIE "=6162", buf, sizeof(buf)));
	assert_false(qb_console_cookie_token(QB_CONSOLE_COOKIE "x=6162", buf, sizeof(buf)));
	assert_false(qb_console_cookie_token(QB_CONSOLE_COOKIE "=", buf, sizeof(buf)));
	assert_false(qb_console_cookie_token(QB_CONSOLE_COOKIE "=616", buf, sizeof(buf)));	/* odd */
	assert_false(qb_console_cookie_token(QB_CONSOLE_COOKIE "=61zz", buf, sizeof(buf)));
	assert_false(qb_console_cookie_token(QB_CONSOLE_COOKIE "=610062", buf, sizeof(buf)));	/* a NUL */
	/* 8 bytes do not fit 8 with the NUL */
	assert_false(qb_console_cookie_token(QB_CONSOLE_COOKIE "=6161616161616161", buf, sizeof(buf)));
	assert_true(qb_console_cookie_token(QB_CONSOLE_COOKIE "=61616161616161", buf, sizeof(buf)));
	assert_string_equal(buf, "aaaaaaa");
}

static void
test_login_body(void **state)
{
	char		reason[256];
	char	   *t;

	t = qb_console_login_token("{\"token\": \"abc\"}", 16, reason, sizeof(reason));
	assert_string_equal(t, "abc");
	free(t);
	assert_null(qb_console_login_token("token=abc", 9, reason, sizeof(reason)));
	assert_non_null(strstr(reason, "{\"token\""));
	assert_null(qb_console_login_token("{\"token\": 1}", 12, reason, sizeof(reason)));
	assert_null(qb_console_login_token("{\"token\": \"a\", \"x\": 1}", 22, reason, sizeof(reason)));
	assert_null(qb_console_login_token("", 0, reason, sizeof(reason)));
}

static void
test_assets(void **state)
{
	const QbConsoleAsset *a = qb_console_asset("/console");

	assert_non_null(a);
	assert_string_equal(a->content_type, "text/html; charset=utf-8");
	assert_non_null(strstr(a->body, "<script src=\"/console/app.js\""));
	assert_non_null(qb_console_asset("/console/app.js"));
	assert_non_null(qb_console_asset("/console/app.css"));
	assert_null(qb_console_asset("/console/index.html"));
	assert_null(qb_console_asset("/console/"));
	assert_string_equal(qb_console_headers[0][0], "Content-Security-Policy");
}

static struct sockaddr_in
v4(const char *a)
{
	struct sockaddr_in s = {.sin_family = AF_INET, .sin_port = htons(40000)};

	assert_int_equal(inet_pton(AF_INET, a, &s.sin_addr), 1);
	return s;
}

static struct sockaddr_in6
v6(const char *a)
{
	struct sockaddr_in6 s = {.sin6_family = AF_INET6};

	assert_int_equal(inet_pton(AF_INET6, a, &s.sin6_addr), 1);
	return s;
}

#define SA(x) ((const struct sockaddr *) &(x))

static void
test_limit(void **state)
{
	QbConsoleLimit *l = calloc(1, sizeof(QbConsoleLimit));
	struct sockaddr_in a = v4("127.0.0.1"),
				b = v4("127.0.0.2");
	struct sockaddr_in6 c = v6("2001:db8::1"),
				c2 = v6("2001:db8::ffff"),
				d = v6("2001:db8:0:1::1");
	struct sockaddr un = {.sa_family = AF_UNIX};
	char		addr[32];

	/* four wrong tokens: still allowed; the fifth starts the wait, to the window's end */
	for (int i = 0; i < QB_CONSOLE_LIMIT_FAILS - 1; i++)
	{
		qb_console_limit_fail(l, SA(a), 1000 + i);
		assert_int_equal(qb_console_limit_wait(l, SA(a), 1000 + i), 0);
	}
	qb_console_limit_fail(l, SA(a), 1010);
	assert_int_equal(qb_console_limit_wait(l, SA(a), 1010), QB_CONSOLE_LIMIT_WINDOW - 10);
	assert_int_equal(qb_console_limit_wait(l, SA(a), 1000 + QB_CONSOLE_LIMIT_WINDOW - 1), 1);
	assert_int_equal(qb_console_limit_wait(l, SA(a), 1000 + QB_CONSOLE_LIMIT_WINDOW), 0);
	/* another port of the same address is the same peer; another address is not */
	a.sin_port = htons(40001);
	assert_int_equal(qb_console_limit_wait(l, SA(a), 1010), QB_CONSOLE_LIMIT_WINDOW - 10);
	assert_int_equal(qb_console_limit_wait(l, SA(b), 1010), 0);
	/* after the window a failure starts a new one: one failure is no wait */
	qb_console_limit_fail(l, SA(a), 1000 + QB_CONSOLE_LIMIT_WINDOW);
	assert_int_equal(qb_console_limit_wait(l, SA(a), 1000 + QB_CONSOLE_LIMIT_WINDOW), 0);
	/* five failures spread over more than the window never wait */
	for (int i = 0; i < 2 * QB_CONSOLE_LIMIT_FAILS; i++)
	{
		qb_console_limit_fail(l, SA(b), 2000 + i * (QB_CONSOLE_LIMIT_WINDOW / 2));
		assert_int_equal(qb_console_limit_wait(l, SA(b), 2000 + i * (QB_CONSOLE_LIMIT_WINDOW / 2)), 0);
	}
	/* IPv6: one /64 is one peer */
	for (int i = 0; i < QB_CONSOLE_LIMIT_FAILS; i++)
		qb_console_limit_fail(l, i % 2 ? SA(c) : SA(c2), 3000);
	assert_true(qb_console_limit_wait(l, SA(c), 3000) > 0);
	assert_true(qb_console_limit_wait(l, SA(c2), 3000) > 0);
	assert_int_equal(qb_console_limit_wait(l, SA(d), 3000), 0);
	/* an address of no IP family is not counted */
	for (int i = 0; i < QB_CONSOLE_LIMIT_FAILS; i++)
		qb_console_limit_fail(l, &un, 3000);
	assert_int_equal(qb_console_limit_wait(l, &un, 3000), 0);
	assert_int_equal(qb_console_limit_wait(l, NULL, 3000), 0);

	/* a full table forgets the peer whose window began first */
	memset(l, 0, sizeof(*l));
	for (int i = 0; i < QB_CONSOLE_LIMIT_FAILS; i++)
		qb_console_limit_fail(l, SA(b), 4000);
	for (int i = 0; i < QB_CONSOLE_LIMIT_SLOTS; i++)
	{
		struct sockaddr_in x;

		snprintf(addr, sizeof(addr), "10.0.0.%d", i + 1);
		x = v4(addr);
		qb_console_limit_fail(l, SA(x), 4001);
		assert_int_equal(qb_console_limit_wait(l, SA(b), 4001), i < QB_CONSOLE_LIMIT_SLOTS - 1 ? 59 : 0);
	}
	free(l);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_cookie_round_trip),
		cmocka_unit_test(test_cookie_refused),
		cmocka_unit_test(test_login_body),
		cmocka_unit_test(test_assets),
		cmocka_unit_test(test_limit),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
