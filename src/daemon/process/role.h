/*-------------------------------------------------------------------------
 * role.h
 *	  A role: one engine of the core's registry (qb_engines.h) in one process
 *	  (role.c), what the supervisor forks and the daemon's host serves; its
 *	  name is the engine's ("outbox 0", "relay", "consumer 1").  The supervisor calls down into it; a
 *	  role calls nothing of the supervisor's.
 *-------------------------------------------------------------------------
 */
#ifndef QBD_ROLE_H
#define QBD_ROLE_H

#include <stddef.h>

#include "qb_engines.h"
#include "qbd.h"

/* the body of a forked role process; returns its exit status */
extern int	qbd_role_main(QbdShared *sh, QbEngineKind kind, int index);

#endif							/* QBD_ROLE_H */
