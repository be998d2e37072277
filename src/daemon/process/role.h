/*-------------------------------------------------------------------------
 * role.h
 *	  A role: one engine in one process (role.c), what the supervisor forks
 *	  and the daemon's host serves.  The supervisor calls down into it; a
 *	  role calls nothing of the supervisor's.
 *-------------------------------------------------------------------------
 */
#ifndef QBD_ROLE_H
#define QBD_ROLE_H

#include <stddef.h>

#include "qbd.h"

typedef enum QbdRoleKind
{
	QBD_ROLE_OUTBOX,
	QBD_ROLE_RELAY,
	QBD_ROLE_INGRESS,
	QBD_ROLE_CONSUMER
} QbdRoleKind;

/* "outbox 0", "relay", "ingress", "consumer 1" */
extern void qbd_role_name(QbdRoleKind kind, int index, char *buf, size_t len);

/* the body of a forked role process; returns its exit status */
extern int	qbd_role_main(QbdShared *sh, QbdRoleKind kind, int index);

#endif							/* QBD_ROLE_H */
