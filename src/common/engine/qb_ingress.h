/*-------------------------------------------------------------------------
 * qb_ingress.h
 *	  The HTTP ingress: webhooks into the inbox, health, readiness, metrics
 *	  and the admin routes, served by libmicrohttpd on the engine's thread.
 *
 * See qb_ingress.c for the request path and the answers.
 *
 * jansson: never call json_object() here or in qb_admin.c.  The postgres
 * executable exports a json_object symbol (the SQL function), which wins
 * over jansson's inside a backend; json_pack("{}") makes an empty object.
 *-------------------------------------------------------------------------
 */
#ifndef QB_INGRESS_H
#define QB_INGRESS_H

#include "qb_host.h"
#include "qb_metrics.h"
#include "qb_store.h"

typedef struct QbIngressStats
{
	long		accepted;		/* 202 */
	long		duplicates;		/* 200 duplicate */
	long		refused;		/* 4xx */
	long		unavailable;	/* 503 */
	long		batches;		/* store calls */
} QbIngressStats;

/*
 * Run until the host says stop.  metrics and stats may be NULL.  Returns 0 after a
 * clean stop (requests whose rows committed are answered first), -1 when it
 * could not start (err says why).
 */
extern int	qb_ingress_run(const QbHost *host, const QbStore *store, QbMetrics *metrics,
						   QbIngressStats *stats, char *err, size_t errlen);

#endif							/* QB_INGRESS_H */
