/*-------------------------------------------------------------------------
 * qb_src_kafka.h
 *	  The Kafka source consumer (qb_src_kafka.c) behind QbConsumerOps.
 *-------------------------------------------------------------------------
 */
#ifndef QB_SRC_KAFKA_H
#define QB_SRC_KAFKA_H

#include "qb_source.h"

extern const QbConsumerOps qb_kafka_consumer;

#endif							/* QB_SRC_KAFKA_H */
