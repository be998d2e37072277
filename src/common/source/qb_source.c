/*-------------------------------------------------------------------------
 * qb_source.c
 *	  The consumers by source type, and the deliveries they hand over
 *	  (qb_source.h).
 *-------------------------------------------------------------------------
 */
#include <stdlib.h>
#include <string.h>

#include <stdio.h>

#include "qb_ops.h"
#include "qb_source.h"
#include "qb_src_amqp.h"
#include "qb_src_kafka.h"
#include "qb_src_nats.h"

/* The consumers this build has, indexed by QbSourceType; NULL: not yet. */
static const QbConsumerOps *const qbsrc_ops[] = {
	[QB_SOURCE_HTTP] = NULL,
	[QB_SOURCE_RABBITMQ] = &qb_amqp_consumer,
	[QB_SOURCE_KAFKA] = &qb_kafka_consumer,
	[QB_SOURCE_NATS] = &qb_nats_consumer,
};

/* their names, for qb_consumers_check's message */
static const char *const qbsrc_names[] = {
	[QB_SOURCE_HTTP] = "http",
	[QB_SOURCE_RABBITMQ] = "rabbitmq",
	[QB_SOURCE_KAFKA] = "kafka",
	[QB_SOURCE_NATS] = "nats",
};

#define QBC_NTYPES ((int) (sizeof(qbsrc_ops) / sizeof(qbsrc_ops[0])))

QB_OPS_LISTED(QbConsumerOps, 1, QB_CONSUMER_OPS, QB_OPS_NONE);

/* qb_consumer_check: see qb_source.h. */
int
qb_consumer_check(const QbConsumerOps *ops, char *err, size_t errlen)
{
	static const QbOpsField fields[] = {QB_CONSUMER_OPS(QB_OPS_FIELD, QbConsumerOps)};
	int			t = (int) ops->type;

	return qb_ops_check("consumer ops", t >= 0 && t < QBC_NTYPES ? qbsrc_names[t] : "?", ops,
						fields, sizeof(fields) / sizeof(fields[0]), err, errlen);
}

/* qb_consumers_check: see qb_source.h. */
int
qb_consumers_check(char *err, size_t errlen)
{
	for (int t = 0; t < QBC_NTYPES; t++)
	{
		if (qbsrc_ops[t] == NULL)
			continue;
		if ((int) qbsrc_ops[t]->type != t)
		{
			snprintf(err, errlen, "consumer ops at the index of '%s' are another type's",
					 qbsrc_names[t]);
			return -1;
		}
		if (qb_consumer_check(qbsrc_ops[t], err, errlen) != 0)
			return -1;
	}
	return 0;
}

/* qb_consumer_ops: see qb_source.h. */
const QbConsumerOps *
qb_consumer_ops(QbSourceType type)
{
	if ((int) type < 0 || (int) type >= QBC_NTYPES)
		return NULL;
	return qbsrc_ops[type];
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
