/*-------------------------------------------------------------------------
 * qb_ops.h
 *	  That an ops table (a struct of function pointers: QbPublisherOps,
 *	  QbConsumerOps, QbStore, QbHost, QbEngine, QbdBackend) has every
 *	  function it must have, checked once at start-up.
 *
 * -Wmissing-field-initializers says nothing of a named initializer that
 * leaves a field out, so each table's header lists its required fields
 * (QB_..._OPS(X, T)) and its optional ones; qb_ops_check names the first
 * required field left NULL, and QB_OPS_LISTED fails the build when the
 * struct has a function field neither list names.
 *-------------------------------------------------------------------------
 */
#ifndef QB_OPS_H
#define QB_OPS_H

#include <stddef.h>

/* One function field of an ops table: its name and where it is. */
typedef struct QbOpsField
{
	const char *name;
	size_t		offset;
} QbOpsField;

/* X(T, f) callbacks for a table's list: a QbOpsField, or one to count */
#define QB_OPS_FIELD(T, f) {#f, offsetof(T, f)},
#define QB_OPS_COUNT(T, f) + 1

/*
 * The struct T is `others` pointer-sized leading or data fields plus the
 * function fields the two lists name, and nothing else.
 */
#define QB_OPS_LISTED(T, others, required, optional) \
	_Static_assert(sizeof(T) == ((others) + (0 required(QB_OPS_COUNT, T) optional(QB_OPS_COUNT, T))) \
				   * sizeof(void (*) (void)), #T ": a function field is in neither list")

/* for a table with no optional field */
#define QB_OPS_NONE(X, T)

/*
 * 0, or -1 with err "<kind> '<name>' lacks '<field>'" for the first field
 * of fields[n] that table leaves NULL.
 */
extern int	qb_ops_check(const char *kind, const char *name, const void *table,
						 const QbOpsField *fields, int n, char *err, size_t errlen);

#endif							/* QB_OPS_H */
