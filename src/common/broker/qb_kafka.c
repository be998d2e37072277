/*-------------------------------------------------------------------------
 * qb_kafka.c
 *	  Helpers of the Kafka publisher (qb_pub_kafka.c) and the Kafka source
 *	  (qb_src_kafka.c): setting properties, the silent log callback.
 *-------------------------------------------------------------------------
 */
#include <stdio.h>

#include "qb_errlen.h"
#include "qb_kafka.h"

bool
qb_kafka_set(rd_kafka_conf_t *conf, const char *name, const char *value, char *err, size_t errlen)
{
	char		why[QB_ERRLEN];

	if (rd_kafka_conf_set(conf, name, value, why, sizeof(why)) == RD_KAFKA_CONF_OK)
		return true;
	snprintf(err, errlen, "kafka property %s: %s", name, why);
	return false;
}

void
qb_kafka_log_silent(const rd_kafka_t *rk, int level, const char *fac, const char *buf)
{
}
