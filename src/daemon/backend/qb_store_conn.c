/*-------------------------------------------------------------------------
 * qb_store_conn.c
 *	  Connect with backoff (qb_store_conn.h has the wording).
 *-------------------------------------------------------------------------
 */
#include <stdio.h>

#include "qb_clock.h"
#include "qb_store_conn.h"

int
qb_store_connect(QbStoreBackoff *b, QbStoreConnectFn connect, void *ctx,
				 char *err, size_t errlen)
{
	long		now = qb_now_ms();

	if (now < b->retry_at_ms)
	{
		snprintf(err, errlen, "database unreachable, next try in %ld ms: %s",
				 b->retry_at_ms - now, b->last_error);
		return -1;
	}
	if (connect(ctx, err, errlen) == 0)
	{
		b->backoff_ms = 0;
		b->retry_at_ms = 0;
		b->last_error[0] = '\0';
		return 0;
	}
	b->backoff_ms = b->backoff_ms == 0 ? QB_STORE_BACKOFF_FIRST_MS :
		(b->backoff_ms * 2 > QB_STORE_BACKOFF_MAX_MS ? QB_STORE_BACKOFF_MAX_MS : b->backoff_ms * 2);
	b->retry_at_ms = qb_now_ms() + b->backoff_ms;
	snprintf(b->last_error, sizeof(b->last_error), "%s", err);
	return -1;
}
