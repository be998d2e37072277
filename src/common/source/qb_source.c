/*-------------------------------------------------------------------------
 * qb_source.c
 *	  The consumers by source type, and the deliveries they hand over
 *	  (qb_source.h).
 *-------------------------------------------------------------------------
 */
#include <stdlib.h>
#include <string.h>

#include "qb_source.h"
#include "qb_src_amqp.h"
#include "qb_src_kafka.h"
#include "qb_src_nats.h"

/* The consumers this build has, indexed by QbSourceType; NULL: not yet. */
static const QbConsumerOps *const qbc_ops[] = {
	[QB_SOURCE_HTTP] = NULL,
	[QB_SOURCE_RABBITMQ] = &qb_amqp_consumer,
	[QB_SOURCE_KAFKA] = &qb_kafka_consumer,
	[QB_SOURCE_NATS] = &qb_nats_consumer,
};

/* qb_consumer_ops: see qb_source.h. */
const QbConsumerOps *
qb_consumer_ops(QbSourceType type)
{
	if ((int) type < 0 || (size_t) type >= sizeof(qbc_ops) / sizeof(qbc_ops[0]))
		return NULL;
	return qbc_ops[type];
}

/* qb_deliveries_clear: see qb_source.h. */
void
qb_deliveries_clear(QbDelivery *d, int n)
{
	for (int i = 0; d != NULL && i < n; i++)
	{
		free(d[i].body);
		free(d[i].headers);
		free(d[i].message_id);
		free(d[i].type);
		free(d[i].position);
		memset(&d[i], 0, sizeof(QbDelivery));
	}
}
