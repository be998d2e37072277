/*-------------------------------------------------------------------------
 * qb_pub_amqp_int.h
 *	  qb_pub_amqp.c's message headers, exposed so they can be tested
 *	  without a broker.
 *
 * Internal: for the module itself and its tests and fuzz harnesses
 * (test/fuzz); no other module includes it.
 *-------------------------------------------------------------------------
 */
#ifndef QB_PUB_AMQP_INT_H
#define QB_PUB_AMQP_INT_H

#include <stddef.h>

#include <amqp.h>
#include <jansson.h>

#include "qb_headers.h"

/*
 * A row's AMQP headers: the table basic.publish sends (every value a long
 * string; keys and values malloc'd) and the correlation id taken from it.
 */
typedef struct QbAmqpHeaders
{
	amqp_table_t table;
	/* the X-Correlation-Id header's value (any letter case, at most 255 bytes), or NULL */
	const char *correlation_id;
} QbAmqpHeaders;

/*
 * qb_amqp_headers_build: the row's headers (a parsed JSON object, or NULL)
 * by the header rule (qb_headers.h) into *out, which the caller frees with
 * qb_amqp_headers_free whatever the result.  QB_HDR_ROW_INVALID or
 * QB_HDR_FAILED with err set.
 */
extern QbHdrResult qb_amqp_headers_build(const json_t *row_headers, QbAmqpHeaders *out,
										 char *err, size_t errlen);
extern void qb_amqp_headers_free(QbAmqpHeaders *h);

#endif							/* QB_PUB_AMQP_INT_H */
