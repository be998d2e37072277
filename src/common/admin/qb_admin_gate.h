/*-------------------------------------------------------------------------
 * qb_admin_gate.h
 *	  The admin API's and the console's routes on the ingress's listener:
 *	  the table a host puts in QbHost.routes (qb_admin_gate.c says who may
 *	  come in and how).
 *-------------------------------------------------------------------------
 */
#ifndef QB_ADMIN_GATE_H
#define QB_ADMIN_GATE_H

#include "qb_ingress.h"

extern const QbIngressRoutes qb_admin_routes;

#endif							/* QB_ADMIN_GATE_H */
