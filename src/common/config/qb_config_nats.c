/*-------------------------------------------------------------------------
 * qb_config_nats.c
 *	  The nats type: a nats destination (url, subject, jetstream,
 *	  createStream) and a nats source (url, subject, stream, durable: a
 *	  JetStream pull consumer).
 *-------------------------------------------------------------------------
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qb_config_int.h"
#include "qb_nats.h"

static const char *const qbcf_keys_nats[] =
{"type", "url", "subject", "jetstream", "createStream", "transform", "maxInFlight",
"circuitBreaker", "onDead", "rateLimit", "maxConcurrent", NULL};
static const char *const qbcf_keys_nats_source[] =
{"type", "url", "subject", "stream", "durable", "idempotencyKeyPath", "idempotencyKeyHeader",
"eventTypePath", "eventTypeHeader", "aggregateIdPath", "topic", "consumption", "transform",
"batchSize", "onDead", NULL};

/*
 * qbcf_nats_urls: a url, which may list several servers separated by
 * commas, checked as the connection reads it (qb_nats_url_check).
 */
static bool
qbcf_nats_urls(QbcfCtx *cx, const char *path, const QbcfNode *n, const char *url)
{
	char		sub[QBCF_PATHLEN];
	char		msg[QBCF_MSGLEN];

	qbcf_path_key(sub, sizeof(sub), path, "url");
	if (!qb_nats_url_check(url, msg, sizeof(msg)))
		return qbcf_error(cx, sub, n, "%s", msg);
	return true;
}

/*
 * qbcf_nats_stream: with createStream, the stream the publisher makes when
 * none captures the destination's subject: named "queuebox-<destination>",
 * capturing the subject's literal tokens before its first placeholder then
 * ">" ("orders.{{ topic }}" -> "orders.>"), or the subject itself when it
 * has no placeholder.  A subject that starts with a placeholder (or none:
 * the row's topic) would need ">", which JetStream keeps for itself.
 */
static bool
qbcf_nats_stream(QbcfCtx *cx, const char *path, const QbcfNode *m, QbDestination *d)
{
	char		sub[QBCF_PATHLEN];
	const QbcfNode *at = qbcf_get(m, "createStream");
	const char *subject = d->target;
	const char *ph = subject ? strstr(subject, "{{") : NULL;
	size_t		len;			/* the literal part: subject[0 .. len) */
	const char *end;			/* its last token's end */
	const char *tok;
	char	   *out;

	qbcf_path_key(sub, sizeof(sub), path, "createStream");
	if (!d->jetstream)
		return qbcf_error(cx, sub, at,
						  "createStream makes a JetStream stream, and this destination sets jetstream: false (core NATS needs no stream); remove one of the two");
	if (ph != NULL)
		while (ph > subject && ph[-1] != '.')
			ph--;				/* back to the start of the placeholder's token */
	len = subject == NULL ? 0 : ph != NULL ? (size_t) (ph - subject) : strlen(subject);
	if (len == 0)
		return qbcf_error(cx, sub, at,
						  "createStream needs a subject whose first token is literal, e.g. subject: \"events.{{ topic }}\" (the stream then captures events.>); %s",
						  subject == NULL ? "without subject the row's topic is the subject, and no stream can be derived from it" :
						  "this subject starts with a placeholder");
	end = subject + (ph != NULL ? len - 1 : len);	/* without the dot before ph */
	tok = subject;
	for (const char *p = subject;; p++)
	{
		if (p == end || *p == '.')
		{
			if (p == tok || (p - tok == 1 && (*tok == '*' || *tok == '>')))
				return qbcf_error(cx, sub, at,
								  "createStream: the subject's literal part \"%.*s\" is not a valid NATS subject (non-empty dot-separated tokens, no wildcards)",
								  (int) len, subject);
			if (p == end)
				break;
			tok = p + 1;
		}
		else if ((unsigned char) *p <= ' ' || *p == 0x7f)
			return qbcf_error(cx, sub, at,
							  "createStream: the subject's literal part \"%.*s\" has a space or control character, which no NATS subject may hold",
							  (int) len, subject);
	}
	d->stream = qbcf_prefixed(cx, "queuebox-", d->name);
	if (d->stream == NULL || (out = qbcf_arena_alloc(cx->arena, len + 2)) == NULL)
		return qbcf_error(cx, sub, at, "out of memory");
	memcpy(out, subject, len);
	out[len] = ph != NULL ? '>' : '\0';
	out[len + 1] = '\0';
	d->stream_subject = out;
	return true;
}

/* qbcf_nats: the keys of a nats destination (the shared ones are read). */
static bool
qbcf_nats(QbcfCtx *cx, const char *path, const QbcfNode *m, QbDestination *d)
{
	const QbcfNode *n;

	/*
	 * JetStream by default: core NATS is at most once and loses messages
	 * across a server restart (measured), which an outbox must not do
	 * silently.
	 */
	d->jetstream = true;
	return qbcf_required_string(cx, path, m, "url",
								"a nats destination needs one, e.g. url: \"nats://host:4222\"",
								false, &d->broker_url, &n) &&
		qbcf_nats_urls(cx, path, n, d->broker_url) &&
		qbcf_target(cx, path, m, d, "subject", NULL, true) &&
		qbcf_target_template(cx, path, m, d, "subject") &&
		qbcf_flag(cx, path, m, "jetstream", &d->jetstream) &&
		qbcf_flag(cx, path, m, "createStream", &d->create_stream) &&
		(!d->create_stream || qbcf_nats_stream(cx, path, m, d));
}

const QbcfDestType qbcf_dest_nats =
{
	.type = "nats",
	.keys = qbcf_keys_nats,
	.check = qbcf_nats,
};

/*
 * qbcf_nats_source: the servers, the subject and the stream a nats source
 * consumes; the durable consumer's name defaults from the source's.
 */
static bool
qbcf_nats_source(QbcfCtx *cx, const char *path, const QbcfNode *m, QbSource *s)
{
	const QbcfNode *n;

	if (!qbcf_required_string(cx, path, m, "url",
							  "a nats source needs one, e.g. url: \"nats://host:4222\"",
							  true, &s->broker_url, &n))
		return false;
	if (!qbcf_nats_urls(cx, path, n, s->broker_url))
		return false;
	if (!qbcf_required_string(cx, path, m, "subject", "the subject to consume, e.g. subject: orders.>",
							  true, &s->subject, &n) ||
		!qbcf_required_string(cx, path, m, "stream",
							  "the JetStream stream that captures the subject, e.g. stream: ORDERS",
							  true, &s->stream, &n) ||
		!qbcf_opt_string(cx, path, m, "durable", true, &s->durable))
		return false;
	if (s->durable == NULL && (s->durable = qbcf_prefixed(cx, "queuebox-", s->name)) == NULL)
		return qbcf_error(cx, path, m, "out of memory");
	return true;
}

const QbcfSourceType qbcf_source_nats =
{
	.type = "nats",
	.keys = qbcf_keys_nats_source,
	.check = qbcf_nats_source,
};
