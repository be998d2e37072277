/*-------------------------------------------------------------------------
 * qb_kafka.h
 *	  What the Kafka publisher and the Kafka source share (qb_kafka.c).
 *-------------------------------------------------------------------------
 */
#ifndef QB_KAFKA_H
#define QB_KAFKA_H

#include <stdbool.h>
#include <stddef.h>

#include <librdkafka/rdkafka.h>

/* Set one property, or false with librdkafka's reason (and the name) in err. */
extern bool qb_kafka_set(rd_kafka_conf_t *conf, const char *name, const char *value,
						 char *err, size_t errlen);

/*
 * A log_cb that keeps nothing: with log.queue=true the log is served by the
 * poll on our thread, so librdkafka never writes to stderr from its own.
 */
extern void qb_kafka_log_silent(const rd_kafka_t *rk, int level, const char *fac,
								const char *buf);

#endif							/* QB_KAFKA_H */
