/*-------------------------------------------------------------------------
 * qb_ingress.h
 *	  The HTTP ingress: webhooks into the inbox, health, readiness and
 *	  metrics, served by libmicrohttpd on the engine's thread; and the door
 *	  through which the same listener serves other routes (QbIngressRoutes:
 *	  the admin room's, admin/qb_admin_gate.c), which the host hands it
 *	  (QbHost.routes).
 *
 * Wording:
 *	- A route family is a QbIngressRoutes table: it claims a path by its
 *	  headers, then answers at once, after the body (no database), or in the
 *	  main loop with the store.
 *	- A QbIngressRequest is what the listener shows a route family of one
 *	  request, and the answer the family sets; the listener sends it.
 *
 * See qb_ingress.c for the request path and the answers.
 *
 * jansson: never call json_object() here or in the admin room.  The postgres
 * executable exports a json_object symbol (the SQL function), which wins
 * over jansson's inside a backend; json_pack("{}") makes an empty object.
 *-------------------------------------------------------------------------
 */
#ifndef QB_INGRESS_H
#define QB_INGRESS_H

#include <stdbool.h>
#include <stddef.h>

#include "qb_config.h"
#include "qb_host.h"
#include "qb_metrics.h"
#include "qb_store.h"

struct MHD_Connection;

/* What a route family wants next of a request it claimed and left unanswered. */
typedef enum QbIngressNext
{
	QB_INGRESS_BODY_ANSWER,		/* read the body (at most max), then body() */
	QB_INGRESS_BODY_SERVE		/* read the body, then serve() in the main loop */
} QbIngressNext;

/*
 * One request as the listener shows it to a route family, and its answer.
 * The request's strings belong to the listener; answer and set_cookie are
 * malloc'd and freed by it; route_data is the family's, freed by its done().
 */
typedef struct QbIngressRequest
{
	/* the request */
	struct MHD_Connection *conn;	/* its headers, query and peer */
	char	   *method;
	char	   *path;
	char	   *body;			/* NUL-terminated once read; NULL: none */
	size_t		len;
	/* what comes next while status is 0, and the body's limit */
	QbIngressNext next;
	size_t		max;
	/* the answer: status 0 until decided */
	int			status;
	char	   *answer;
	const char *content_type;	/* NULL: application/json */
	bool		allow_post;		/* 405: Allow: POST */
	const char *const (*headers)[2];	/* more headers, ended by {NULL}; or NULL */
	char	   *set_cookie;		/* the console's login or logout */
	long		retry_after;	/* 429: seconds for Retry-After */
	/* one header of this answer only (a dead list's next page), name NULL: none */
	const char *own_header;
	char		own_value[24];
	void	   *route_data;
} QbIngressRequest;

/* Routes the listener serves besides webhooks and health (QbHost.routes). */
typedef struct QbIngressRoutes
{
	/* the family's state for one listener's life (NULL: out of memory) */
	void	   *(*open) (void);
	void		(*close) (void *state);

	/*
	 * The first look, headers only: false when the path is not the family's;
	 * true with the answer set, or with next and max set.
	 */
	bool		(*route) (void *state, QbIngressRequest *req, const QbConfig *cfg,
						  QbMetrics *metrics);
	/* QB_INGRESS_BODY_ANSWER: the body is here; set the answer, no database */
	void		(*body) (void *state, QbIngressRequest *req, const QbConfig *cfg,
						 QbMetrics *metrics);
	/* QB_INGRESS_BODY_SERVE: set the answer, in the main loop, with the store */
	void		(*serve) (const QbHost *host, const QbStore *store, QbIngressRequest *req,
						  const QbConfig *cfg, QbMetrics *metrics);
	/* free route_data */
	void		(*done) (QbIngressRequest *req);
} QbIngressRoutes;

/* QbIngressRoutes's functions, all required (qb_ops.h) */
#define QB_INGRESS_ROUTES_OPS(X, T) X(T, open) X(T, close) X(T, route) X(T, body) \
	X(T, serve) X(T, done)

/* qb_ingress_answer: the answer {"status": word, "reason": reason} (NULL: none). */
extern void qb_ingress_answer(QbIngressRequest *req, int status, const char *word,
							  const char *reason);

/* qb_ingress_source_at: the webhook source answering at path, or NULL. */
extern const QbSource *qb_ingress_source_at(const QbConfig *cfg, const char *path);

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
