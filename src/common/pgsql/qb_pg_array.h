/*-------------------------------------------------------------------------
 * qb_pg_array.h
 *	  PostgreSQL array literals, for a store that sends its parameters as
 *	  text (the libpq store): the text[] / int8[] / uuid[] / bool[] values
 *	  of the unnest() statements of qb_sql_pg.h.
 *
 * Wording: an array is built element by element, then read once as its
 * literal ("{...}").  Text elements are always double-quoted, with '"'
 * and '\' backslash-escaped, so no element (empty, "NULL", one holding a
 * comma, a brace or white space) is ever read back as anything else; a
 * NULL element is the bare word NULL.  The literal is a parameter value,
 * never SQL text: it is sent typed ($n::text[] and the paramTypes OIDs).
 *
 * Memory: the array owns its buffer; free it with qb_pg_array_free.  Out
 * of memory is sticky: qb_pg_array_text returns NULL.
 *-------------------------------------------------------------------------
 */
#ifndef QB_PG_ARRAY_H
#define QB_PG_ARRAY_H

#include <stdbool.h>
#include <stddef.h>

typedef struct QbPgArray
{
	char	   *buf;
	size_t		len;
	size_t		cap;
	int			n;				/* elements added */
	bool		oom;
	bool		closed;			/* the closing brace is in buf */
} QbPgArray;

/* a text element, quoted and escaped; NULL: a NULL element */
extern void qb_pg_array_add(QbPgArray *a, const char *elem);
extern void qb_pg_array_add_int(QbPgArray *a, long long v);
extern void qb_pg_array_add_bool(QbPgArray *a, bool v);

/* The literal ("{}" when empty), owned by a; NULL when out of memory. */
extern const char *qb_pg_array_text(QbPgArray *a);
extern void qb_pg_array_free(QbPgArray *a);

#endif							/* QB_PG_ARRAY_H */
