/*-------------------------------------------------------------------------
 * qb_pub_kafka_int.h
 *	  qb_pub_kafka.c's message headers, exposed so they can be tested
 *	  without a producer.
 *
 * Internal: for the module itself and its tests and fuzz harnesses
 * (test/fuzz); no other module includes it.
 *-------------------------------------------------------------------------
 */
#ifndef QB_PUB_KAFKA_INT_H
#define QB_PUB_KAFKA_INT_H

#include <stddef.h>

#include <librdkafka/rdkafka.h>

#include "qb_headers.h"
#include "qb_publish.h"

/*
 * qbk_headers: the row's headers by the header rule (qb_headers.h), then
 * message-id = the message id, as a new list in *out the caller owns; NULL
 * in *out unless QB_HDR_OK, with err set.
 */
extern QbHdrResult qbk_headers(const QbMessage *m, rd_kafka_headers_t **out,
							   char *err, size_t errlen);

#endif							/* QB_PUB_KAFKA_INT_H */
