/*-------------------------------------------------------------------------
 * qb_src_amqp.h
 *	  The RabbitMQ source consumer (librabbitmq-c 0.11): basic.consume on
 *	  the source's queue, whose messages the consumer engine stores in the
 *	  inbox.
 *
 * See qb_src_amqp.c for its vocabulary.
 *-------------------------------------------------------------------------
 */
#ifndef QB_SRC_AMQP_H
#define QB_SRC_AMQP_H

#include "qb_source.h"

extern const QbConsumerOps qb_amqp_consumer;

#endif							/* QB_SRC_AMQP_H */
