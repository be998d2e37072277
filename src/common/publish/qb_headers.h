/*-------------------------------------------------------------------------
 * qb_headers.h
 *	  The header rule: what a row's headers become on each transport,
 *	  written once for the four publishers (docs/delivery.md, "Row
 *	  headers", has the table).
 *
 * Wording:
 *	- A row header is one member of the row's headers object (parsed once by
 *	  qb_message_headers): its name is the member's key, its value any JSON
 *	  value.
 *	- A transport is where a destination type puts headers: HTTP request
 *	  headers, the AMQP headers table, Kafka record headers, NATS message
 *	  headers.
 *	- QueueBox's names are those QueueBox sets on a message itself: the
 *	  message id under each transport's name (X-Message-Id, message-id,
 *	  Nats-Msg-Id), on every transport; on HTTP also the names of
 *	  qb_config_header_reserved (Content-Type, User-Agent, Expect ...), the
 *	  destination's static headers and its signing headers.
 *	- A transport's reserved names are those it keeps for itself: on HTTP
 *	  the framing and hop-by-hop fields (qb_config_header_reserved: Host,
 *	  Content-Length, Transfer-Encoding, Connection ...); on NATS every
 *	  Nats-* name (JetStream's controls: Nats-Expected-Stream, Nats-Rollup
 *	  ...).  AMQP and Kafka reserve none.
 *
 * The rule, for each row header in the row's order (names in any letter
 * case):
 *	1. A null value: left out.
 *	2. QueueBox's names and the transport's reserved names: left out; what
 *	   QueueBox sets is sent (so a row can never forge a message id).
 *	3. A name or value the transport cannot carry: the row is invalid
 *	   (QB_HDR_ROW_INVALID; the engine settles it dead, nothing is sent).
 *	   On every transport an empty name; HTTP: a name that is not a token, a
 *	   value with a control character but tab; NATS: a name with a space,
 *	   ':' or a control character, a value with CR or LF; AMQP: a name over
 *	   255 bytes.
 *	4. Else sent: a string as it is, any other value (number, boolean,
 *	   object, array) as its compact JSON text.
 * traceparent and tracestate are row headers like any other here: the
 * outbox engine has already made the row's traceparent the attempt's child
 * (qb_trace_publish) before a publisher sees the headers.
 *-------------------------------------------------------------------------
 */
#ifndef QB_HEADERS_H
#define QB_HEADERS_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "qb_config.h"
#include "qb_publish.h"

/* QueueBox's message id header on each transport (AMQP: the message_id property) */
#define QB_HDR_MESSAGE_ID_HTTP	"X-Message-Id"
#define QB_HDR_MESSAGE_ID_KAFKA "message-id"
#define QB_HDR_MESSAGE_ID_NATS	"Nats-Msg-Id"

typedef enum QbHdrTransport
{
	QB_HDR_HTTP,
	QB_HDR_AMQP,
	QB_HDR_KAFKA,
	QB_HDR_NATS
} QbHdrTransport;

/* What building a transport's headers from a row came to: the one answer every publisher acts on */
typedef enum QbHdrResult
{
	QB_HDR_OK,					/* built */
	QB_HDR_ROW_INVALID,			/* a row header the transport cannot carry: dead */
	QB_HDR_FAILED				/* a local failure (memory, a library): retry */
} QbHdrResult;

/*
 * One header as the transport gets it (name and value are the row's, or
 * the value's JSON text, valid during the call); false when it could not be
 * added (out of memory).
 */
typedef bool (*QbHdrEmit) (void *arg, const char *name, const char *value);

/*
 * qb_hdr_each runs the rule over headers (the row's object, or NULL: none)
 * for transport t and hands each header it keeps to emit, in the row's
 * order.  dest: the destination whose static and signing headers are
 * QueueBox's names too (HTTP), or NULL.  QB_HDR_ROW_INVALID with err
 * naming the header and what to do; QB_HDR_FAILED with err when emit
 * failed.  Headers emitted before a failure stay with the caller's
 * transport object, which the caller frees.
 */
extern QbHdrResult qb_hdr_each(QbHdrTransport t, const QbDestination *dest,
							   const json_t *headers, QbHdrEmit emit, void *arg,
							   char *err, size_t errlen);

/* A result as a publisher's start answer: ok is started, row invalid is dead, failed is retried */
extern QbPubStart qb_hdr_start(QbHdrResult r);

#endif							/* QB_HEADERS_H */
