/*-------------------------------------------------------------------------
 * qb_ingress_int.h
 *	  qb_ingress.c's check of a webhook's received headers, exposed so it
 *	  can be tested without libmicrohttpd.
 *
 * Internal: for the module itself and its tests and fuzz harnesses
 * (test/fuzz); no other module includes it.
 *-------------------------------------------------------------------------
 */
#ifndef QB_INGRESS_INT_H
#define QB_INGRESS_INT_H

#include <stdbool.h>

#include <jansson.h>

#include "qb_config.h"

/* The headers of one webhook as they are checked and gathered. */
typedef struct QbiHeaders
{
	const QbSource *src;
	json_t	   *obj;
	char		bad[QB_ERRLEN];		/* why the first bad header is refused, "" when none */
} QbiHeaders;

/*
 * qbi_header_take: one received header into h->obj, the JSON object that is
 * stored with the row.  A name that is not a token or is over 255 bytes, or a
 * value that is not one line of UTF-8, sets h->bad (the 400's reason; later headers are then
 * ignored); transport and credential headers are left out; a repeated name
 * keeps every value, comma-separated.  false only when out of memory.
 */
extern bool qbi_header_take(QbiHeaders *h, const char *name, const char *value);

#endif							/* QB_INGRESS_INT_H */
