/*-------------------------------------------------------------------------
 * test_store.c
 *	  What every store shares from the core (qb_store.c): the meaning of a
 *	  failed operation's SQLSTATE, and matching the rows an inbox insert
 *	  stored to the requests that asked for them.
 *-------------------------------------------------------------------------
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "qb_store.h"

static void
test_query_failure(void **state)
{
	assert_int_equal(qb_query_failure("P0002"), QB_QUERY_NOT_FOUND);	/* no_data_found */
	assert_int_equal(qb_query_failure("22007"), QB_QUERY_BAD_INPUT);	/* a bad timestamp */
	assert_int_equal(qb_query_failure("22023"), QB_QUERY_BAD_INPUT);	/* invalid_parameter_value */
	assert_int_equal(qb_query_failure("23514"), QB_QUERY_BAD_INPUT);	/* a CHECK refused it */
	assert_int_equal(qb_query_failure("57014"), -1);	/* statement timeout: the database */
	assert_int_equal(qb_query_failure("08006"), -1);	/* the connection failed */
	assert_int_equal(qb_query_failure("XX000"), -1);
	assert_int_equal(qb_query_failure("22"), -1);	/* not a SQLSTATE */
	assert_int_equal(qb_query_failure(NULL), -1);
}

static void
test_inbox_match(void **state)
{
	QbInboxRow	rows[4] = {
		{.source = "github", .idempotency_key = "a"},
		{.source = "stripe", .idempotency_key = "a"},
		{.source = "github", .idempotency_key = "a"},	/* a duplicate within the call */
		{.source = "github", .idempotency_key = "b"},
	};
	int64_t		ids[4] = {0, 0, 0, 0};

	assert_int_equal(qb_inbox_match(rows, 4, ids, 11, "github", "a"), 0);
	assert_int_equal(qb_inbox_match(rows, 4, ids, 12, "stripe", "a"), 1);
	assert_int_equal(qb_inbox_match(rows, 4, ids, 13, "github", "b"), 3);
	/* the store returns one row per key: the duplicate keeps 0 */
	assert_int_equal(qb_inbox_match(rows, 4, ids, 14, "gitlab", "a"), -1);
	assert_int_equal(ids[0], 11);
	assert_int_equal(ids[1], 12);
	assert_int_equal(ids[2], 0);
	assert_int_equal(ids[3], 13);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_query_failure),
		cmocka_unit_test(test_inbox_match),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
