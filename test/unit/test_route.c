/*-------------------------------------------------------------------------
 * test_route.c
 *	  Unit tests of qb_route.c: topic matching, pattern checks; and routing
 *	  (qb_config_route_find).
 *
 * Besides a table of hand-picked cases, the matcher is compared with a
 * plain recursive reference on every pattern and topic over a small
 * alphabet, which covers the backtracking of several "**" exhaustively.
 *-------------------------------------------------------------------------
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cmocka.h>

#include "qb_config.h"
#include "qb_route.h"

static void
test_match_table(void **state)
{
	static const struct
	{
		const char *pattern;
		const char *topic;
		bool		match;
	}			cases[] = {
		{"orders.created", "orders.created", true},
		{"orders.created", "orders.Created", false},	/* case-sensitive */
		{"orders.created", "orders", false},
		{"orders", "orders.created", false},
		{"orders.**", "orders", true},	/* ** takes zero segments */
		{"orders.**", "orders.a", true},
		{"orders.**", "orders.a.b", true},
		{"orders.**", "order", false},
		{"orders.**", "ordersx.a", false},
		{"orders.**", "x.orders.a", false},
		{"**", "a", true},
		{"**", "a.b.c", true},
		{"**", "", true},
		{"*", "a", true},
		{"*", "a.b", false},
		{"*", "", false},
		{"a.*.c", "a.b.c", true},
		{"a.*.c", "a.c", false},
		{"a.*.c", "a.b.x.c", false},
		{"a.**.c", "a.c", true},
		{"a.**.c", "a.b.c", true},
		{"a.**.c", "a.b.x.c", true},
		{"a.**.c", "a.b.x.d", false},
		{"**.c", "c", true},
		{"**.c", "a.b.c", true},
		{"**.c", "a.c.d", false},
		{"*.*", "a.b", true},
		{"*.*", "a", false},
		{"*.**", "a", true},
		{"*.**", "", false},
		{"**.*", "a.b.c", true},
		{"**.*", "", false},
		{"a.**.b.**.c", "a.b.c", true},
		{"a.**.b.**.c", "a.x.b.y.z.c", true},
		{"a.**.b.**.c", "a.x.c.y.b", false},
		{"**.a.**", "a", true},
		{"**.a.**", "x.y.a.z", true},
		{"**.a.**", "x.y.z", false},
		{"**.a.*.b.**", "a.a.x.b", true},	/* the first a must not stick */
		{"**.a.*.b.**", "a.x.a.b", false},
		{"**.a.*.b.**", "x.a.x.a.y.b.z", true},
		{"**.**", "a.b", true},
		{"**.**.x", "x", true},
		{"a.b", "a.b.", false},
		{"a.b*", "a.b*", true},		/* the matcher compares; check refuses */
	};
	size_t		i;

	for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		if (qb_topic_match(cases[i].pattern, cases[i].topic) != cases[i].match)
			fail_msg("\"%s\" vs \"%s\": expected %s", cases[i].pattern, cases[i].topic,
					 cases[i].match ? "a match" : "no match");
}

/* ref_match: the obvious exponential recursion over segment arrays. */
static bool
ref_match(char **p, int np, char **t, int nt)
{
	int			k;

	if (np == 0)
		return nt == 0;
	if (strcmp(p[0], "**") == 0)
	{
		for (k = 0; k <= nt; k++)
			if (ref_match(p + 1, np - 1, t + k, nt - k))
				return true;
		return false;
	}
	if (nt == 0)
		return false;
	if (strcmp(p[0], "*") != 0 && strcmp(p[0], t[0]) != 0)
		return false;
	return ref_match(p + 1, np - 1, t + 1, nt - 1);
}

/* join: segments into a dotted string. */
static void
join(char *buf, char **segs, int n)
{
	int			i;

	buf[0] = '\0';
	for (i = 0; i < n; i++)
	{
		if (i > 0)
			strcat(buf, ".");
		strcat(buf, segs[i]);
	}
}

static void
test_match_exhaustive(void **state)
{
	static char *const palpha[] = {"a", "b", "*", "**"};
	static char *const talpha[] = {"a", "b"};
	char	   *p[6];
	char	   *t[6];
	char		pbuf[64];
	char		tbuf[64];
	int			np,
				nt;
	long		code,
				tcode,
				pmax,
				tmax,
				checked = 0;

	/* every pattern of up to 5 segments against every topic of up to 6 */
	for (np = 1, pmax = 4; np <= 5; np++, pmax *= 4)
		for (code = 0; code < pmax; code++)
		{
			long		c = code;
			int			i;

			for (i = 0; i < np; i++, c /= 4)
				p[i] = palpha[c % 4];
			join(pbuf, p, np);
			for (nt = 0, tmax = 1; nt <= 6; nt++, tmax *= 2)
				for (tcode = 0; tcode < tmax; tcode++)
				{
					long		d = tcode;

					for (i = 0; i < nt; i++, d /= 2)
						t[i] = talpha[d % 2];
					join(tbuf, t, nt);
					if (qb_topic_match(pbuf, tbuf) != ref_match(p, np, t, nt))
						fail_msg("\"%s\" vs \"%s\": expected %d", pbuf, tbuf,
								 ref_match(p, np, t, nt));
					checked++;
				}
		}
	assert_true(checked > 100000);
}

/* A pattern that makes naive backtracking exponential must stay fast. */
static void
test_match_pathological(void **state)
{
	char		pattern[4096] = "";
	char		topic[8192] = "";
	clock_t		start;
	int			i;

	for (i = 0; i < 40; i++)
		strcat(pattern, "**.a.");
	strcat(pattern, "b");
	for (i = 0; i < 1000; i++)
		strcat(topic, i ? ".a" : "a");
	start = clock();
	assert_false(qb_topic_match(pattern, topic));
	strcat(topic, ".b");
	assert_true(qb_topic_match(pattern, topic));
	assert_true((double) (clock() - start) / CLOCKS_PER_SEC < 1.0);
}

static void
test_pattern_check(void **state)
{
	static const char *const good[] = {
		"a", "orders.**", "**", "*", "a.*.c", "**.a.**", "a-b_c.d:e", "*.*.**",
	};
	static const struct
	{
		const char *pattern;
		const char *msg;
	}			bad[] = {
		{"", "the pattern is empty"},
		{"a..b", "segment 2 is empty"},
		{".a", "segment 1 is empty"},
		{"a.", "segment 2 is empty"},
		{".", "segment 1 is empty"},
		{"a*", "segment 1 \"a*\" mixes '*' with other text"},
		{"a.*b", "segment 2 \"*b\" mixes"},
		{"a.b*c", "segment 2 \"b*c\" mixes"},
		{"***", "segment 1 \"***\" mixes"},
		{"**x", "mixes"},
		{"a b", "segment 1 contains a space"},
		{"a.\tb", "segment 2 contains a space or a control character"},
	};
	char		err[256];
	size_t		i;

	for (i = 0; i < sizeof(good) / sizeof(good[0]); i++)
		if (!qb_pattern_check(good[i], err, sizeof(err)))
			fail_msg("\"%s\" refused: %s", good[i], err);
	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
	{
		err[0] = '\0';
		if (qb_pattern_check(bad[i].pattern, err, sizeof(err)))
			fail_msg("\"%s\" accepted", bad[i].pattern);
		if (strstr(err, bad[i].msg) == NULL)
			fail_msg("\"%s\": \"%s\" lacks \"%s\"", bad[i].pattern, err, bad[i].msg);
	}
}

static void
test_route_find(void **state)
{
	static const char doc[] =
		"destinations:\n"
		"  a: { type: http, baseUrl: \"http://h\" }\n"
		"  b: { type: nats, url: \"nats://h\" }\n"
		"routes:\n"
		"  - { topicPattern: \"orders.eu.*\", destination: b }\n"
		"  - { topicPattern: \"orders.**\", destination: a }\n"
		"  - { topicPattern: \"*.audit\", destination: b }\n";
	QbConfig   *cfg = NULL;
	QbConfig	empty;
	char		err[QB_ERRLEN];

	if (qb_config_parse(doc, strlen(doc), NULL, &cfg, err, sizeof(err)) != 0)
		fail_msg("%s", err);
	assert_int_equal(qb_config_route_find(cfg, "orders.eu.created"), 0);	/* first wins */
	assert_int_equal(qb_config_route_find(cfg, "orders.us.created"), 1);
	assert_int_equal(qb_config_route_find(cfg, "orders"), 1);
	assert_int_equal(qb_config_route_find(cfg, "users.audit"), 2);
	assert_int_equal(qb_config_route_find(cfg, "orders.audit"), 1);
	assert_int_equal(qb_config_route_find(cfg, "users.created"), -1);
	assert_int_equal(qb_config_route_find(cfg, ""), -1);
	assert_int_equal(cfg->routes[qb_config_route_find(cfg, "users.audit")].dest_index, 1);
	qb_config_free(cfg);

	qb_config_defaults(&empty);
	assert_int_equal(qb_config_route_find(&empty, "orders"), -1);
	assert_int_equal(qb_config_route_find(NULL, "orders"), -1);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_match_table),
		cmocka_unit_test(test_match_exhaustive),
		cmocka_unit_test(test_match_pathological),
		cmocka_unit_test(test_pattern_check),
		cmocka_unit_test(test_route_find),
	};

	return cmocka_run_group_tests_name("qb_route", tests, NULL, NULL);
}
