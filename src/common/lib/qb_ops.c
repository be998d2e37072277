/*-------------------------------------------------------------------------
 * qb_ops.c
 *	  The start-up check of an ops table (qb_ops.h).
 *-------------------------------------------------------------------------
 */
#include <stdio.h>
#include <string.h>

#include "qb_ops.h"

/* qb_ops_check: see qb_ops.h. */
int
qb_ops_check(const char *kind, const char *name, const void *table,
			 const QbOpsField *fields, int n, char *err, size_t errlen)
{
	for (int i = 0; i < n; i++)
	{
		void		(*fn) (void);

		memcpy(&fn, (const char *) table + fields[i].offset, sizeof(fn));
		if (fn == NULL)
		{
			snprintf(err, errlen, "%s '%s' lacks '%s'", kind, name ? name : "(unnamed)",
					 fields[i].name);
			return -1;
		}
	}
	return 0;
}
