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

#include "qb_publish.h"

/*
 * qbk_headers: the row's headers (parsed by the engine; non-strings as their
 * JSON text) plus the message id header, as a new list the caller owns; NULL
 * with err set when out of memory.
 */
extern rd_kafka_headers_t *qbk_headers(const QbMessage *m, char *err, size_t errlen);

#endif							/* QB_PUB_KAFKA_INT_H */
