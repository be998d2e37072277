/*-------------------------------------------------------------------------
 * qb_src_nats_int.h
 *	  qb_src_nats.c's message headers to JSON, exposed so they can be
 *	  tested without a server; and two looks inside a consumer for the
 *	  fetch check (test/brokers/nats_fetch_check.c).
 *
 * Internal: for the module itself and its tests and fuzz harnesses
 * (test/fuzz); no other module includes it.
 *-------------------------------------------------------------------------
 */
#ifndef QB_SRC_NATS_INT_H
#define QB_SRC_NATS_INT_H

#include <stdbool.h>

#include <nats/nats.h>

/*
 * qbns_headers: the message's headers as JSON object text (malloc'd; a
 * repeated header's values joined by ", "), NULL when it has none; *oom set
 * when NULL means out of memory.  A header whose name or values are not
 * UTF-8 is left out.
 */
extern char *qbns_headers(natsMsg *m, bool *oom);

/* A consumer's (qb_nats_consumer.open's) subscription subject: the inbox
 * its pull requests name as reply (for test/brokers/nats_fetch_check.c,
 * which sends requests of its own to that inbox). */
extern const char *qbns_inbox(void *consumer);

/* How many messages (statuses too) wait in that subscription, not yet
 * fetched; 0 when it cannot say.  fetch() uses it as well. */
extern int	qbns_waiting(void *consumer);

#endif							/* QB_SRC_NATS_INT_H */
