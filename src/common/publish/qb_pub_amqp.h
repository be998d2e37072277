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

extern const QbPublisherOps qb_amqp_publisher;

#endif							/* QB_PUB_AMQP_H */
