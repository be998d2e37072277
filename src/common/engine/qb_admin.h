/*-------------------------------------------------------------------------
 * qb_admin.h
 *	  The /admin/ routes (qb_admin.c), served by the ingress.
 *-------------------------------------------------------------------------
 */
#ifndef QB_ADMIN_H
#define QB_ADMIN_H

#include <stddef.h>

#include "qb_config.h"
#include "qb_metrics.h"
#include "qb_store.h"

/*
 * The admin routes (qb_admin.c).  Runs one operation through the store and
 * sets *status and *answer (malloc'd JSON).  method and path are the
 * request's; path starts after "/admin".  body may be NULL.
 */
extern void qb_admin_handle(const QbStore *store, long timeout_ms, const char *method,
							const char *path, const char *query_limit,
							const char *body, size_t body_len,
							int *status, char **answer);

/*
 * GET /admin/overview, the console's first page: every destination's
 * circuit, waiting rows and last error with its delivery counters, the
 * outbox and inbox counts, and each configured source's counters (from
 * metrics, this server's since it started).  Sets *status and *answer.
 */
extern void qb_admin_overview(const QbStore *store, long timeout_ms, const char *method,
							  const QbConfig *cfg, const QbMetrics *metrics,
							  int *status, char **answer);

#endif							/* QB_ADMIN_H */
