/*-------------------------------------------------------------------------
 * test_pg_stmt.c
 *	  The PostgreSQL statements' descriptors (pgsql/qb_pg_stmt.c) agree
 *	  with their text: every slot filled, as many parameters as the text
 *	  has $n, each $n::type cast the type the descriptor sends, one query
 *	  per QbQuery; and the claim statements return the columns
 *	  qb_claim_cols.h names, in its order.
 *-------------------------------------------------------------------------
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qb_pg_stmt.h"
#include "qb_store.h"

_Static_assert(QB_PG_NQUERIES == QB_NQUERIES, "one statement per QbQuery");

/* every descriptor is filled: a name, a text, its parameters and no more */
static void
test_complete(void **state)
{
	for (int id = 0; id < QB_PG_NSTMTS; id++)
	{
		const QbPgStmt *st = &qb_pg_stmts[id];

		if (st->name == NULL || st->sql == NULL)
			fail_msg("statement %d has no name or text", id);
		assert_in_range(st->nparams, 0, QB_PG_MAXPARAMS);
		for (int i = 0; i < QB_PG_MAXPARAMS; i++)
			if ((st->params[i] == QB_PG_T_NONE) != (i >= st->nparams))
				fail_msg("%s: parameter %d of %d", st->name, i + 1, st->nparams);
	}
}

/* the type a cast names, or QB_PG_T_NONE for one the table does not know */
static QbPgType
cast_type(const char *p)
{
	static const struct
	{
		const char *name;
		QbPgType	type;
	}			casts[] = {
		{"bigint[]", QB_PG_T_INT8_ARRAY}, {"int[]", QB_PG_T_INT4_ARRAY},
		{"text[]", QB_PG_T_TEXT_ARRAY}, {"bool[]", QB_PG_T_BOOL_ARRAY},
		{"uuid[]", QB_PG_T_UUID_ARRAY}, {"bigint", QB_PG_T_INT8},
		{"int", QB_PG_T_INT4}, {"text", QB_PG_T_TEXT}, {"uuid", QB_PG_T_UUID},
		{"boolean", QB_PG_T_BOOL}, {"bool", QB_PG_T_BOOL},
		{"timestamptz", QB_PG_T_TIMESTAMPTZ},
	};

	for (size_t i = 0; i < sizeof(casts) / sizeof(casts[0]); i++)
	{
		size_t		n = strlen(casts[i].name);

		if (strncmp(p, casts[i].name, n) == 0 && !isalnum((unsigned char) p[n]) &&
			p[n] != '[' && p[n] != '_')
			return casts[i].type;
	}
	return QB_PG_T_NONE;
}

/*
 * The text uses $1..$nparams, each at least once, and no higher one; in a
 * named statement (its parameters typed as sent) every $n::type cast names
 * the descriptor's type.  The queries take text and cast it on purpose.
 */
static void
test_params_match_text(void **state)
{
	for (int id = 0; id < QB_PG_NSTMTS; id++)
	{
		const QbPgStmt *st = &qb_pg_stmts[id];
		int			seen[QB_PG_MAXPARAMS + 1] = {0};

		for (const char *p = strchr(st->sql, '$'); p != NULL; p = strchr(p + 1, '$'))
		{
			char	   *end;
			long		k = strtol(p + 1, &end, 10);

			if (end == p + 1)
				continue;
			if (k < 1 || k > st->nparams)
				fail_msg("%s: its text uses $%ld, its descriptor has %d parameters",
						 st->name, k, st->nparams);
			seen[k] = 1;
			if (id < QB_PG_S_QUERY && strncmp(end, "::", 2) == 0)
			{
				QbPgType	t = cast_type(end + 2);

				if (t != QB_PG_T_NONE && t != st->params[k - 1])
					fail_msg("%s: $%ld is cast %.*s but sent as type %d", st->name, k,
							 (int) strcspn(end + 2, " ,)"), end + 2, (int) st->params[k - 1]);
			}
		}
		for (int k = 1; k <= st->nparams; k++)
			if (!seen[k])
				fail_msg("%s: $%d is in the descriptor, not in the text", st->name, k);
	}
}

/*
 * The RETURNING list of a claim-shaped statement, split at its top-level
 * commas: QB_CLAIM_NCOLS expressions, the first eleven reading the columns
 * qb_claim_cols.h names.
 */
static void
check_claim_returning(const char *sql)
{
	static const char *const starts[] = {
		[QB_CLAIM_COL_ID] = "o.id",
		[QB_CLAIM_COL_MESSAGE_ID] = "o.message_id",
		[QB_CLAIM_COL_TOPIC] = "o.topic",
		[QB_CLAIM_COL_KEY] = "o.key",
		[QB_CLAIM_COL_PAYLOAD] = "o.payload",
		[QB_CLAIM_COL_HEADERS] = "o.headers",
		[QB_CLAIM_COL_ATTEMPT] = "o.attempt",
		[QB_CLAIM_COL_MAX_ATTEMPTS] = "coalesce(o.max_attempts",
		[QB_CLAIM_COL_CREATED_EPOCH] = "extract(epoch FROM o.created_at)",
		[QB_CLAIM_COL_CLAIMED] = "o.state = 'processing'",
		[QB_CLAIM_COL_DESTINATION] = "o.destination",
	};
	const char *p = strstr(sql, " RETURNING ");
	int			col = 0;
	int			depth = 0;

	assert_non_null(p);
	p += strlen(" RETURNING ");
	for (;;)
	{
		while (*p == ' ')
			p++;
		if (col < (int) (sizeof(starts) / sizeof(starts[0])) &&
			strncmp(p, starts[col], strlen(starts[col])) != 0)
			fail_msg("claim column %d reads \"%.30s\", not %s", col, p, starts[col]);
		col++;
		for (; *p != '\0' && (depth > 0 || *p != ','); p++)
			depth += *p == '(' ? 1 : *p == ')' ? -1 : 0;
		if (*p == '\0')
			break;
		p++;
	}
	assert_int_equal(col, QB_CLAIM_NCOLS);
}

static void
test_claim_columns(void **state)
{
	check_claim_returning(qb_pg_stmts[QB_PG_S_CLAIM].sql);
	check_claim_returning(qb_pg_stmts[QB_PG_S_CLAIM_NO_PROBE].sql);
	check_claim_returning(qb_pg_stmts[QB_PG_S_PROMOTE].sql);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_complete),
		cmocka_unit_test(test_params_match_text),
		cmocka_unit_test(test_claim_columns),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
