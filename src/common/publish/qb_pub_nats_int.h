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

#include "qb_publish.h"

/*
 * qbn_headers copies the row's headers (parsed by the engine; non-strings as
 * JSON text, nulls skipped) into msg, then Nats-Msg-Id = message_id, which
 * wins over a row header of that name.  QB_PUB_ROW_INVALID for a header NATS
 * cannot carry; err says which.
 */
extern QbPubStart qbn_headers(natsMsg *msg, const QbMessage *m, char *err, size_t errlen);

#endif							/* QB_PUB_NATS_INT_H */
