/*-------------------------------------------------------------------------
 * qb_http_int.h
 *	  qb_http.c's request headers, exposed so they can be tested apart
 *	  from libcurl's transfers.
 *
 * Internal: for the module itself and its tests and fuzz harnesses
 * (test/fuzz); no other module includes it.
 *-------------------------------------------------------------------------
 */
#ifndef QB_HTTP_INT_H
#define QB_HTTP_INT_H

#include <stdbool.h>
#include <stddef.h>

#include <curl/curl.h>
#include <jansson.h>

#include "qb_config.h"
#include "qb_headers.h"

/*
 * qbh_build_headers: the row's headers by the header rule (qb_headers.h:
 * those named like the destination's static headers, its signing headers
 * and what we set are left out), then the destination's static headers,
 * then ours, then the signature's (over body, timestamped now), appended
 * to *list.  QB_HDR_ROW_INVALID or QB_HDR_FAILED with err set.
 */
extern QbHdrResult qbh_build_headers(struct curl_slist **list, const QbDestination *dest,
									 const char *message_id, const json_t *row_headers,
									 const char *body, size_t body_len, char *err, size_t errlen);

#endif							/* QB_HTTP_INT_H */
