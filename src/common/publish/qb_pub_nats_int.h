/*-------------------------------------------------------------------------
 * qb_pub_nats_int.h
 *	  qb_pub_nats.c's message headers, exposed so they can be tested
 *	  without a connection.
 *
 * Internal: for the module itself and its tests and fuzz harnesses
 * (test/fuzz); no other module includes it.
 *-------------------------------------------------------------------------
 */
#ifndef QB_PUB_NATS_INT_H
#define QB_PUB_NATS_INT_H

#include <stddef.h>

#include <nats/nats.h>

#include "qb_headers.h"
#include "qb_publish.h"

/*
 * qbn_headers: the row's headers by the header rule (qb_headers.h) into
 * msg, then Nats-Msg-Id = the message id.  QB_HDR_ROW_INVALID or
 * QB_HDR_FAILED with err set.
 */
extern QbHdrResult qbn_headers(natsMsg *msg, const QbMessage *m, char *err, size_t errlen);

#endif							/* QB_PUB_NATS_INT_H */
