/*-------------------------------------------------------------------------
 * qb_pub_kafka.h
 *	  The Kafka publisher (qb_pub_kafka.c) behind QbPublisherOps.
 *-------------------------------------------------------------------------
 */
#ifndef QB_PUB_KAFKA_H
#define QB_PUB_KAFKA_H

#include "qb_publish.h"

extern const QbPublisherOps qb_kafka_publisher;

#endif							/* QB_PUB_KAFKA_H */
