/*-------------------------------------------------------------------------
 * qb_admin.h
 *	  The /admin/ routes (qb_admin.c), served by the ingress.
 *-------------------------------------------------------------------------
 */
#ifndef QB_ADMIN_H
#define QB_ADMIN_H

#include <stddef.h>

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

#endif							/* QB_ADMIN_H */
