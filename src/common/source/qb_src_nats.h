/*-------------------------------------------------------------------------
 * qb_src_nats.h
 *	  The NATS source consumer (cnats): a JetStream durable pull consumer
 *	  whose messages the consumer engine stores in the inbox.
 *
 * See qb_src_nats.c for its vocabulary and thread rules.
 *-------------------------------------------------------------------------
 */
#ifndef QB_SRC_NATS_H
#define QB_SRC_NATS_H

#include "qb_source.h"

extern const QbConsumerOps qb_nats_consumer;

#endif							/* QB_SRC_NATS_H */
