/*-------------------------------------------------------------------------
 * qb_pg_array.c
 *	  PostgreSQL array literals built element by element (qb_pg_array.h).
 *-------------------------------------------------------------------------
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qb_pg_array.h"

/* qbpg_put appends n bytes; out of memory sticks. */
static void
qbpg_put(QbPgArray *a, const char *s, size_t n)
{
	if (a->oom)
		return;
	if (a->len + n + 2 > a->cap)
	{
		size_t		cap = a->cap ? a->cap : 64;
		char	   *b;

		while (a->len + n + 2 > cap)
			cap *= 2;
		if ((b = realloc(a->buf, cap)) == NULL)
		{
			a->oom = true;
			return;
		}
		a->buf = b;
		a->cap = cap;
	}
	memcpy(a->buf + a->len, s, n);
	a->len += n;
	a->buf[a->len] = '\0';
}

/* qbpg_next opens the array or separates the next element. */
static void
qbpg_next(QbPgArray *a)
{
	qbpg_put(a, a->n++ == 0 ? "{" : ",", 1);
}

void
qb_pg_array_add(QbPgArray *a, const char *elem)
{
	qbpg_next(a);
	if (elem == NULL)
	{
		qbpg_put(a, "NULL", 4);
		return;
	}
	qbpg_put(a, "\"", 1);
	for (const char *p = elem; *p; p++)
	{
		size_t		run = strcspn(p, "\"\\");

		qbpg_put(a, p, run);
		p += run;
		if (*p == '\0')
			break;
		qbpg_put(a, "\\", 1);
		qbpg_put(a, p, 1);
	}
	qbpg_put(a, "\"", 1);
}

void
qb_pg_array_add_int(QbPgArray *a, long long v)
{
	char		num[24];

	qbpg_next(a);
	qbpg_put(a, num, (size_t) snprintf(num, sizeof(num), "%lld", v));
}

void
qb_pg_array_add_bool(QbPgArray *a, bool v)
{
	qbpg_next(a);
	qbpg_put(a, v ? "t" : "f", 1);
}

const char *
qb_pg_array_text(QbPgArray *a)
{
	if (!a->closed)
	{
		qbpg_put(a, a->n == 0 ? "{}" : "}", a->n == 0 ? 2 : 1);
		a->closed = true;
	}
	return a->oom ? NULL : a->buf;
}

void
qb_pg_array_free(QbPgArray *a)
{
	free(a->buf);
	memset(a, 0, sizeof(*a));
}
