/*-------------------------------------------------------------------------
 * test_pg_array.c
 *	  PostgreSQL array literals (qb_pg_array.c): what the libpq store sends
 *	  as its text[] / int8[] / bool[] parameters.  Every element must read
 *	  back as itself: quotes, backslashes, commas, braces, white space, the
 *	  empty string and the word NULL, and a NULL element is SQL NULL.  (The
 *	  store conformance suite reads such values back through a server.)
 *-------------------------------------------------------------------------
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "qb_pg_array.h"

static void
test_empty(void **state)
{
	QbPgArray	a = {0};

	assert_string_equal(qb_pg_array_text(&a), "{}");
	assert_string_equal(qb_pg_array_text(&a), "{}");	/* read twice: the same */
	qb_pg_array_free(&a);
}

static void
test_text_quoting(void **state)
{
	QbPgArray	a = {0};

	qb_pg_array_add(&a, "plain");
	qb_pg_array_add(&a, "");
	qb_pg_array_add(&a, NULL);
	qb_pg_array_add(&a, "NULL");
	qb_pg_array_add(&a, "say \"hi\"");
	qb_pg_array_add(&a, "back\\slash\\");
	qb_pg_array_add(&a, "a,b {c} d");
	qb_pg_array_add(&a, " lead");
	qb_pg_array_add(&a, "\"");
	assert_string_equal(qb_pg_array_text(&a),
						"{\"plain\",\"\",NULL,\"NULL\",\"say \\\"hi\\\"\",\"back\\\\slash\\\\\","
						"\"a,b {c} d\",\" lead\",\"\\\"\"}");
	assert_int_equal(a.n, 9);
	qb_pg_array_free(&a);
}

static void
test_numbers_and_bools(void **state)
{
	QbPgArray	i = {0};
	QbPgArray	b = {0};

	qb_pg_array_add_int(&i, 1);
	qb_pg_array_add_int(&i, -9223372036854775807LL - 1);
	qb_pg_array_add(&i, NULL);
	assert_string_equal(qb_pg_array_text(&i), "{1,-9223372036854775808,NULL}");
	qb_pg_array_add_bool(&b, true);
	qb_pg_array_add_bool(&b, false);
	assert_string_equal(qb_pg_array_text(&b), "{t,f}");
	qb_pg_array_free(&i);
	qb_pg_array_free(&b);
}

/* many elements: the buffer grows and keeps every one */
static void
test_growth(void **state)
{
	QbPgArray	a = {0};
	char		want[8192] = "{";
	char		num[16];

	for (int k = 0; k < 500; k++)
	{
		snprintf(num, sizeof(num), "%d", k);
		qb_pg_array_add(&a, num);
		snprintf(want + strlen(want), sizeof(want) - strlen(want), "%s\"%d\"", k ? "," : "", k);
	}
	strcat(want, "}");
	assert_string_equal(qb_pg_array_text(&a), want);
	qb_pg_array_free(&a);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_empty),
		cmocka_unit_test(test_text_quoting),
		cmocka_unit_test(test_numbers_and_bools),
		cmocka_unit_test(test_growth),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
