/*-------------------------------------------------------------------------
 * qb_pub_amqp.h
 *	  The RabbitMQ publisher (librabbitmq-c 0.11): publisher confirms on one
 *	  connection and channel per destination.
 *
 * Wording:
 *	- A connection is one AMQP connection with channel 1 in confirm mode,
 *	  kept across batches for one destination (keyed by its name and url).
 *	- A delivery tag is the channel's publish counter (1, 2, 3 ...) that the
 *	  broker's basic.ack and basic.nack refer to; multiple=true covers every
 *	  tag up to the one named.
 *	- An unconfirmed message is one published and neither acked nor nacked
 *	  yet.  A returned message (basic.return: mandatory and unroutable) is
 *	  still acked by the broker afterwards; we report that ack as a failure.
 *
 * The URL: see qb_amqp.h.
 *-------------------------------------------------------------------------
 */
#ifndef QB_PUB_AMQP_H
#define QB_PUB_AMQP_H

#include <stdbool.h>
#include <stddef.h>

#include "qb_amqp.h"
#include "qb_publish.h"

/*
 * Build the AMQP headers table of a row (exported for the unit tests):
 * the row's headers (a parsed JSON object, or NULL) become a table whose
 * string values are long strings; other values are their JSON text, nulls
 * are skipped.  The X-Correlation-Id value (any letter case) is copied to
 * *correlation_id (malloc'd, NULL when absent).  Returns false with err set
 * when the headers can never be sent (a name empty or longer than 255
 * bytes).  On success the entries and their strings are malloc'd: free with
 * qb_amqp_headers_free.
 */
typedef struct QbAmqpHeader
{
	char	   *name;
	char	   *value;
} QbAmqpHeader;

extern bool qb_amqp_headers_build(const json_t *row_headers, QbAmqpHeader **out, int *n,
								  char **correlation_id, char *err, size_t errlen);
extern void qb_amqp_headers_free(QbAmqpHeader *h, int n);

extern const QbPublisherOps qb_amqp_publisher;

#endif							/* QB_PUB_AMQP_H */
