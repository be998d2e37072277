/*
 * ops_holes.h
 *	  For the ops-table tests (test_engines.c, test_daemon.c): a complete
 *	  table passes its check, and each required field left out in turn is
 *	  refused with a message naming the table and the field.
 */
#ifndef OPS_HOLES_H
#define OPS_HOLES_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qb_ops.h"

/* a table's check, its table behind a void pointer */
typedef int (*OpsCheck) (const void *table, char *err, size_t errlen);

static void
ops_dummy(void)
{
}

/* every field of fields[n] in table set to a function that does nothing */
static void
ops_fill(void *table, const QbOpsField *fields, int n)
{
	void		(*fn) (void) = ops_dummy;

	for (int i = 0; i < n; i++)
		memcpy((char *) table + fields[i].offset, &fn, sizeof(fn));
}

/* want: what err begins with, as "publisher ops 'kafka'" */
static void
ops_expect_holes(const void *table, size_t size, const QbOpsField *fields, int n,
				 OpsCheck check, const char *want)
{
	char	   *holed = malloc(size);
	char		err[256] = "";
	char		msg[256];

	assert_non_null(holed);
	memcpy(holed, table, size);
	if (check(holed, err, sizeof(err)) != 0)
		fail_msg("%s: a complete table refused: %s", want, err);
	for (int i = 0; i < n; i++)
	{
		memcpy(holed, table, size);
		memset(holed + fields[i].offset, 0, sizeof(void (*) (void)));
		assert_int_equal(check(holed, err, sizeof(err)), -1);
		snprintf(msg, sizeof(msg), "%s lacks '%s'", want, fields[i].name);
		assert_string_equal(err, msg);
	}
	free(holed);
}

#endif							/* OPS_HOLES_H */
