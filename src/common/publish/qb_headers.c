/*-------------------------------------------------------------------------
 * qb_headers.c
 *	  The header rule (qb_headers.h): which row headers each transport
 *	  gets, as what text, and which row can never be sent.
 *
 * Wording and the rule: see qb_headers.h.  The publishers own only how a
 * kept header is added to their library's object (qbh_build_headers,
 * qb_amqp_headers_build, qbk_headers, qbn_headers).
 *-------------------------------------------------------------------------
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "qb_headers.h"
#include "qb_sign.h"
#include "qb_token.h"

#define QBHDR_AMQP_NAME_MAX 255	/* an AMQP table key is a short string */
#define QBHDR_NATS_PREFIX	"Nats-"
#define QBHDR_SHOWN			60	/* bytes of a refused name in last_error */

/* the message id's names: QueueBox's on every transport */
static const char *const qbhdr_message_id[] = {
	QB_HDR_MESSAGE_ID_HTTP, QB_HDR_MESSAGE_ID_KAFKA, QB_HDR_MESSAGE_ID_NATS, NULL
};

static const char *const qbhdr_transport_name[] = {
	[QB_HDR_HTTP] = "HTTP",[QB_HDR_AMQP] = "AMQP",[QB_HDR_KAFKA] = "Kafka",[QB_HDR_NATS] = "NATS",
};

/* qbhdr_static: a static header of dest has that name */
static bool
qbhdr_static(const QbDestination *dest, const char *name)
{
	for (int i = 0; dest != NULL && i < dest->nheaders; i++)
		if (strcasecmp(dest->headers[i].name, name) == 0)
			return true;
	return false;
}

/* qbhdr_left_out: a name QueueBox sets or the transport reserves (rule 2) */
static bool
qbhdr_left_out(QbHdrTransport t, const QbDestination *dest, const char *name)
{
	for (int i = 0; qbhdr_message_id[i] != NULL; i++)
		if (strcasecmp(name, qbhdr_message_id[i]) == 0)
			return true;
	switch (t)
	{
		case QB_HDR_HTTP:
			return qb_config_header_reserved(name) || qbhdr_static(dest, name) ||
				(dest != NULL && qb_sign_sets(&dest->signing, name));
		case QB_HDR_NATS:
			return strncasecmp(name, QBHDR_NATS_PREFIX, strlen(QBHDR_NATS_PREFIX)) == 0;
		case QB_HDR_AMQP:
		case QB_HDR_KAFKA:
			break;
	}
	return false;
}

/* qbhdr_nats_ok: a name and value that cannot break NATS's header block */
static bool
qbhdr_nats_ok(const char *name, const char *value)
{
	for (const char *p = name; *p; p++)
		if ((unsigned char) *p <= ' ' || *p == ':' || *p == 0x7f)
			return false;
	return strpbrk(value, "\r\n") == NULL;
}

/*
 * qbhdr_invalid: why the transport cannot carry the header (rule 3), into
 * why; false when it can.
 */
static bool
qbhdr_invalid(QbHdrTransport t, const char *name, const char *value, char *why, size_t whylen)
{
	size_t		len = strlen(name);

	if (len == 0)
		snprintf(why, whylen, "has an empty name");
	else if (t == QB_HDR_HTTP && !qb_header_valid(name, value))
		snprintf(why, whylen,
				 "is not a valid HTTP header (a name is a token: letters, digits and !#$%%&'*+-.^_`|~; a value holds no control character but tab)");
	else if (t == QB_HDR_NATS && !qbhdr_nats_ok(name, value))
		snprintf(why, whylen,
				 "is not a valid NATS header (a name holds no space, ':' or control character; a value no CR or LF)");
	else if (t == QB_HDR_AMQP && len > QBHDR_AMQP_NAME_MAX)
		snprintf(why, whylen, "has a name of %zu bytes; an AMQP header name is 1 to 255 bytes", len);
	else
		return false;
	return true;
}

/* qbhdr_refuse: the last_error of a row refused for one header */
static void
qbhdr_refuse(QbHdrTransport t, const char *name, const char *why, char *err, size_t errlen)
{
	char		shown[QBHDR_SHOWN * 4 + 8];

	qb_token_printable(shown, sizeof(shown), name, QBHDR_SHOWN);
	snprintf(err, errlen,
			 "row header \"%s%s\" %s, so the row cannot be sent on %s; remove or fix it in the row's headers, then requeue the row (queuebox.requeue_outbox)",
			 shown, strlen(name) > QBHDR_SHOWN ? "..." : "", why, qbhdr_transport_name[t]);
}

/* qb_hdr_each: see qb_headers.h. */
QbHdrResult
qb_hdr_each(QbHdrTransport t, const QbDestination *dest, const json_t *headers,
			QbHdrEmit emit, void *arg, char *err, size_t errlen)
{
	const char *name;
	json_t	   *val;

	if (headers == NULL)
		return QB_HDR_OK;
	json_object_foreach((json_t *) headers, name, val)
	{
		char	   *dumped = NULL;
		const char *text;
		char		why[QB_ERRLEN];
		bool		ok;

		if (json_is_null(val) || qbhdr_left_out(t, dest, name))
			continue;
		if (json_is_string(val))
			text = json_string_value(val);
		else if ((text = dumped = json_dumps(val, JSON_ENCODE_ANY | JSON_COMPACT)) == NULL)
		{
			snprintf(err, errlen, "out of memory building the headers");
			return QB_HDR_FAILED;
		}
		if (qbhdr_invalid(t, name, text, why, sizeof(why)))
		{
			qbhdr_refuse(t, name, why, err, errlen);
			free(dumped);
			return QB_HDR_ROW_INVALID;
		}
		ok = emit(arg, name, text);
		free(dumped);
		if (!ok)
		{
			snprintf(err, errlen, "out of memory building the headers");
			return QB_HDR_FAILED;
		}
	}
	return QB_HDR_OK;
}

/* qb_hdr_start: see qb_headers.h. */
QbPubStart
qb_hdr_start(QbHdrResult r)
{
	switch (r)
	{
		case QB_HDR_OK:
			return QB_PUB_STARTED;
		case QB_HDR_ROW_INVALID:
			return QB_PUB_ROW_INVALID;
		case QB_HDR_FAILED:
			break;
	}
	return QB_PUB_NOT_STARTED;
}
