/*-------------------------------------------------------------------------
 * qb_gauges.h
 *	  The gauges /metrics shows beside the shared counters: the configured
 *	  destinations and sources by name, and what the store says of the
 *	  queues and the circuits (QB_Q_GAUGES), read when /metrics is asked.
 *
 * Transaction rules: one query_text call, so one transaction of the
 * store's.  Memory: the names point into the configuration; qb_gauges_free
 * frees the arrays.
 *-------------------------------------------------------------------------
 */
#ifndef QB_GAUGES_H
#define QB_GAUGES_H

#include "qb_config.h"
#include "qb_metrics.h"
#include "qb_store.h"

/*
 * qb_gauges_read: g from cfg and the store; database_up false (and no
 * circuit) when the store cannot answer.
 */
extern void qb_gauges_read(const QbStore *store, const QbConfig *cfg, QbGauges *g);

extern void qb_gauges_free(QbGauges *g);

#endif							/* QB_GAUGES_H */
