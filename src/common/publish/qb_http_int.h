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

/*
 * qbh_build_headers: the row's headers, then the destination's static ones
 * (which win over a row header of the same name), then ours, then the
 * signature's (over body, timestamped now), appended to *list.  False with
 * err set; *row_fault says whether the row is to blame (it goes dead).
 */
extern bool qbh_build_headers(struct curl_slist **list, const QbDestination *dest,
							  const char *message_id, const json_t *row_headers,
							  const char *body, size_t body_len,
							  bool *row_fault, char *err, size_t errlen);

#endif							/* QB_HTTP_INT_H */
