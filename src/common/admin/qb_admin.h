/*-------------------------------------------------------------------------
 * qb_admin.h
 *	  The /admin/ routes (qb_admin.c), served on the ingress's listener
 *	  through the admin gate (qb_admin_gate.c).
 *-------------------------------------------------------------------------
 */
#ifndef QB_ADMIN_H
#define QB_ADMIN_H

#include <stddef.h>

#include "qb_config.h"
#include "qb_host.h"
#include "qb_limits.h"
#include "qb_metrics.h"
#include "qb_store.h"

/* at most this many query-string parameters; more is a 400 */
#define QB_ADMIN_MAX_ARGS	16

/* One query-string parameter, decoded; value NULL for "?name" without '='. */
typedef struct QbAdminArg
{
	const char *name;
	const char *value;
} QbAdminArg;

/* An admin request as the admin gate read it.  Strings are borrowed. */
typedef struct QbAdminRequest
{
	const char *method;
	const char *path;			/* after "/admin" */
	const QbAdminArg *args;		/* the query string's parameters */
	int			nargs;
	const char *body;			/* NULL: none */
	size_t		body_len;
	/*
	 * who asked, for the log line of a write and the audit rows it writes:
	 * "admin route from 127.0.0.1" (the admin token is shared, so the peer
	 * address is all the server knows)
	 */
	const char *actor;
} QbAdminRequest;

/* The answer: status, body (malloc'd JSON) and the list's cursor. */
typedef struct QbAdminAnswer
{
	int			status;
	char	   *body;
	/*
	 * a dead list's next page starts after this id (the header
	 * X-QueueBox-Next-After); "" when the list reached its end
	 */
	char		next_after[24];
} QbAdminAnswer;

/* the header that carries QbAdminAnswer.next_after */
#define QB_ADMIN_NEXT_AFTER_HEADER "X-QueueBox-Next-After"

/*
 * The admin routes (qb_admin.c).  Runs one operation through the store and
 * fills *ans.  Every write (a POST) is logged on host: the action, its
 * target, the status and the actor; never a token or a payload.
 */
extern void qb_admin_handle(const QbHost *host, const QbStore *store, long timeout_ms,
							const QbAdminRequest *req, QbAdminAnswer *ans);

/*
 * GET /admin/overview, the console's first page: every destination's
 * circuit, waiting rows and last error with its delivery counters, the
 * outbox and inbox counts, each configured source's counters (from
 * metrics, this server's since it started), and what each worker of this
 * server is doing (metrics' worker slots).  Sets *status and *answer.
 */
extern void qb_admin_overview(const QbStore *store, long timeout_ms, const char *method,
							  const QbConfig *cfg, const QbMetrics *metrics,
							  const struct QbLimits *limits, int *status, char **answer);

#endif							/* QB_ADMIN_H */
