/*-------------------------------------------------------------------------
 * qb_store_conn.h
 *	  Connect with backoff, for a store that holds one connection (the
 *	  libpq and ODBC stores).
 *
 * Wording: a connect that fails starts a backoff, 250 ms doubling to 10 s;
 * until it ends every connect fails at once, "database unreachable, next
 * try in N ms: <the last connect's error>".  A connect that works resets it.
 * The store keeps its own connection and says whether it is usable; this
 * keeps only the timing and the last error.
 *
 * Threads: one backoff per store, one thread at a time.
 *-------------------------------------------------------------------------
 */
#ifndef QB_STORE_CONN_H
#define QB_STORE_CONN_H

#include <stddef.h>

#include "qb_errlen.h"

#define QB_STORE_BACKOFF_FIRST_MS	250
#define QB_STORE_BACKOFF_MAX_MS		10000

typedef struct QbStoreBackoff
{
	long		backoff_ms;		/* the last wait; 0: the last connect worked */
	long		retry_at_ms;	/* no connect before this (monotonic ms) */
	char		last_error[QB_ERRLEN];	/* why the last connect failed */
} QbStoreBackoff;

/* One connection attempt: 0, or -1 with err set. */
typedef int (*QbStoreConnectFn) (void *ctx, char *err, size_t errlen);

/*
 * Call connect(ctx) unless the backoff still runs.  Returns 0 when it
 * connected, -1 with err set when it failed or was not tried.
 */
extern int	qb_store_connect(QbStoreBackoff *b, QbStoreConnectFn connect, void *ctx,
							 char *err, size_t errlen);

#endif							/* QB_STORE_CONN_H */
