/*-------------------------------------------------------------------------
 * qb_egress_policy.c
 *	  The host's egress policy (see qb_egress_policy.h for the wording and
 *	  the thread rules).
 *-------------------------------------------------------------------------
 */
#include "qb_egress_policy.h"

/* qb_egress_policy_set: see qb_egress_policy.h. */
bool
qb_egress_policy_set(QbEgressPolicy *p, const char *list, const char *setting,
					 char *err, size_t errlen)
{
	QbEgress   *e;

	if (!qb_egress_parse(list, setting, &e, err, errlen))
		return false;
	__atomic_store_n(&p->rules, e, __ATOMIC_RELEASE);
	return true;
}

/* qb_egress_policy_rules: see qb_egress_policy.h. */
const QbEgress *
qb_egress_policy_rules(const QbEgressPolicy *p)
{
	return p != NULL ? __atomic_load_n(&p->rules, __ATOMIC_ACQUIRE) : NULL;
}

/* qb_egress_in_force: see qb_egress_policy.h. */
const QbEgress *
qb_egress_in_force(const QbEgress *own, const QbEgressPolicy *host)
{
	return own != NULL ? own : qb_egress_policy_rules(host);
}
