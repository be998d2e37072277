/*-------------------------------------------------------------------------
 * qb_src_kafka_int.h
 *	  qb_src_kafka.c's message headers to JSON, exposed so they can be
 *	  tested without a consumer.
 *
 * Internal: for the module itself and its tests and fuzz harnesses
 * (test/fuzz); no other module includes it.
 *-------------------------------------------------------------------------
 */
#ifndef QB_SRC_KAFKA_INT_H
#define QB_SRC_KAFKA_INT_H

#include <librdkafka/rdkafka.h>

/*
 * qbks_headers_json: a message's header list as JSON object text (malloc'd),
 * NULL when it is empty; *message_id is the message-id header's
 * value (malloc'd), or NULL.  A header without a value is null; one that is
 * not UTF-8 or holds a NUL is left out; a repeated name keeps the last.
 */
extern char *qbks_headers_json(const rd_kafka_headers_t *hdrs, char **message_id);

#endif							/* QB_SRC_KAFKA_INT_H */
