/*-------------------------------------------------------------------------
 * qb_egress_policy.h
 *	  The host's egress policy: the rules of its setting, as they are now.
 *
 * Wording:
 *	- The rules (QbEgress, qb_egress.h) are plain values: a parsed list.
 *	- The host's policy (QbEgressPolicy) is the rules of the host's own
 *	  setting (the extension's queuebox.allowed_destinations), replaced
 *	  whole when the setting changes; none when the host has no such
 *	  setting (the daemon: a document's egress: section gives its rules).
 *	  The host keeps it in its QbRuntime (qb_runtime.h) and hands the
 *	  validator a pointer to it (QbConfigEnv.egress); the validator hands
 *	  the same pointer to every destination and to the span exporter, which
 *	  read it at each connect, so a list narrowed after a configuration was
 *	  stored applies at the next connection.
 *
 * Threads: set on the host's main thread, read on any (librdkafka's, the
 * exporter's): qb_egress_policy_set publishes the new rules with one atomic
 * store and never frees the old ones (a thread may be reading them; a
 * change leaks one small list).
 *-------------------------------------------------------------------------
 */
#ifndef QB_EGRESS_POLICY_H
#define QB_EGRESS_POLICY_H

#include <stdbool.h>
#include <stddef.h>

#include "qb_egress.h"

typedef struct QbEgressPolicy
{
	QbEgress   *rules;			/* read and written atomically; NULL: none */
} QbEgressPolicy;

/*
 * The host's setting changed: list NULL or "" is the default rules (a
 * policy all the same: a document may then set none).  setting names what
 * to change in messages.  false with err when the list does not parse (the
 * rules in force stay).
 */
extern bool qb_egress_policy_set(QbEgressPolicy *p, const char *list, const char *setting,
								 char *err, size_t errlen);

/* The host's rules now, or NULL: p is NULL or was never set. */
extern const QbEgress *qb_egress_policy_rules(const QbEgressPolicy *p);

/*
 * The rules that judge a connection now: own (a document's, a copy of
 * them), else the host's; NULL (the default rules) when neither has any.
 */
extern const QbEgress *qb_egress_in_force(const QbEgress *own, const QbEgressPolicy *host);

#endif							/* QB_EGRESS_POLICY_H */
