/*-------------------------------------------------------------------------
 * qb_pub_nats.h
 *	  The NATS publisher (cnats): JetStream with acknowledgements by
 *	  default, core NATS when a destination sets jetstream: false.
 *
 * See qb_pub_nats.c for its vocabulary and thread rules.
 *-------------------------------------------------------------------------
 */
#ifndef QB_PUB_NATS_H
#define QB_PUB_NATS_H

#include "qb_publish.h"

extern const QbPublisherOps qb_nats_publisher;

#endif							/* QB_PUB_NATS_H */
