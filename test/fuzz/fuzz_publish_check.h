/*-------------------------------------------------------------------------
 * fuzz_publish_check.h
 *	  Row headers through each publisher's conversion (HTTP request
 *	  headers, AMQP table, Kafka headers, NATS headers), for fuzz_publish
 *	  and the end of fuzz_ingress.
 *
 * qbf_publish_all returns a bit per publisher that refused the row as it
 * is (QBF_REFUSED_*): for fuzz_publish, a refusal must come with a message
 * and what was accepted must be sendable; for fuzz_ingress, a row the
 * ingress stored must be refused by none.
 *-------------------------------------------------------------------------
 */
#ifndef QB_FUZZ_PUBLISH_CHECK_H
#define QB_FUZZ_PUBLISH_CHECK_H

#include <jansson.h>
#include <curl/curl.h>
#include <librdkafka/rdkafka.h>
#include <nats/nats.h>

#include "fuzz_common.h"
#include "fuzz_nats.h"
#include "qb_config.h"
#include "qb_http_int.h"
#include "qb_pub_amqp_int.h"
#include "qb_pub_kafka_int.h"
#include "qb_nats.h"
#include "qb_pub_nats_int.h"
#include "qb_token.h"

#define QBF_REFUSED_HTTP	0x01
#define QBF_REFUSED_AMQP	0x02
#define QBF_REFUSED_KAFKA	0x04
#define QBF_REFUSED_NATS	0x08

#define QBF_MESSAGE_ID "0190d6a2-7b7e-7cc0-9a3e-2f1d7a9c4b11"

/* qbf_publish_init: the NATS library, which a natsMsg needs (once, at start) */
static inline void
qbf_publish_init(void)
{
	char		err[256];

	if (!qb_nats_open(err, sizeof(err)))
	{
		fprintf(stderr, "qb_nats_open: %s\n", err);
		abort();
	}
}

/*
 * qbf_publish_setup: qbf_publish_init, then the harness's fixed configuration
 * doc parsed (a harness whose own document is refused is a bug: abort)
 */
static inline QbConfig *
qbf_publish_setup(const char *harness, const char *doc)
{
	char		err[QB_ERRLEN];
	QbConfig   *cfg = NULL;

	qbf_publish_init();
	if (qb_config_parse(doc, strlen(doc), NULL, &cfg, err, sizeof(err)) != 0)
	{
		fprintf(stderr, "%s: the harness's configuration is refused: %s\n", harness, err);
		abort();
	}
	return cfg;
}

/* qbf_http_lines_ok: every built line is "token: value" on one line */
static inline void
qbf_http_lines_ok(const struct curl_slist *l)
{
	for (; l != NULL; l = l->next)
	{
		const char *colon = strchr(l->data, ':');
		char	   *name;

		if (colon == NULL)
			qbf_fail("HTTP header line \"%.80s\" has no colon", l->data);
		name = qbf_strndup((const uint8_t *) l->data, colon - l->data);
		if (qb_token_invalid_at(name) >= 0)
			qbf_fail("HTTP header line \"%.80s\": the name is not a token", l->data);
		if (strchr(l->data, '\r') || strchr(l->data, '\n'))
			qbf_fail("HTTP header line \"%.80s\" holds a line break", l->data);
		free(name);
	}
}

static inline int
qbf_publish_all(const json_t *headers, const QbDestination *http_dest, const QbDestination *signed_dest)
{
	static const char body[] = "{\"id\":1}";
	QbMessage	m = {.message_id = QBF_MESSAGE_ID, .topic = "orders.created", .key = NULL,
	.headers = headers, .body = body, .body_len = sizeof(body) - 1};
	char		err[512];
	int			refused = 0;

	/* HTTP: plain, then a destination with static headers and signing */
	for (int d = 0; d < 2; d++)
	{
		struct curl_slist *list = NULL;

		memset(err, 'x', sizeof(err));
		switch (qbh_build_headers(&list, d ? signed_dest : http_dest, QBF_MESSAGE_ID, headers,
								  body, sizeof(body) - 1, err, sizeof(err)))
		{
			case QB_HDR_OK:
				qbf_http_lines_ok(list);
				break;
			case QB_HDR_ROW_INVALID:
				refused |= QBF_REFUSED_HTTP;
				/* fall through */
			case QB_HDR_FAILED:
				qbf_err_ok(err, sizeof(err), "qbh_build_headers");
				if (err[0] == '\0')
					qbf_fail("qbh_build_headers refused with an empty message");
				break;
		}
		curl_slist_free_all(list);
	}

	/* AMQP */
	{
		QbAmqpHeaders h;

		memset(err, 'x', sizeof(err));
		if (qb_amqp_headers_build(headers, &h, err, sizeof(err)) == QB_HDR_OK)
		{
			for (int i = 0; i < h.table.num_entries; i++)
				if (h.table.entries[i].key.len == 0 || h.table.entries[i].key.len > 255)
					qbf_fail("AMQP header %d is not a 1..255 byte name", i);
			if (h.correlation_id != NULL && strlen(h.correlation_id) > 255)
				qbf_fail("AMQP correlation id over 255 bytes");
		}
		else
		{
			qbf_err_ok(err, sizeof(err), "qb_amqp_headers_build");
			refused |= QBF_REFUSED_AMQP;
		}
		qb_amqp_headers_free(&h);
	}

	/* Kafka */
	{
		rd_kafka_headers_t *h;
		const void *v;
		size_t		len;

		memset(err, 'x', sizeof(err));
		if (qbk_headers(&m, &h, err, sizeof(err)) != QB_HDR_OK)
		{
			qbf_err_ok(err, sizeof(err), "qbk_headers");
			refused |= QBF_REFUSED_KAFKA;
		}
		else
		{
			if (rd_kafka_header_get_last(h, "message-id", &v, &len) != RD_KAFKA_RESP_ERR_NO_ERROR ||
				len != strlen(QBF_MESSAGE_ID) || memcmp(v, QBF_MESSAGE_ID, len) != 0)
				qbf_fail("Kafka headers: the last message-id is not the message id");
			if (rd_kafka_header_get(h, 1, "message-id", &v, &len) == RD_KAFKA_RESP_ERR_NO_ERROR)
				qbf_fail("Kafka headers: message-id twice");
			rd_kafka_headers_destroy(h);
		}
	}

	/* NATS */
	{
		natsMsg    *msg = qbf_nats_msg();
		const char *mid = NULL;

		memset(err, 'x', sizeof(err));
		switch (qbn_headers(msg, &m, err, sizeof(err)))
		{
			case QB_HDR_OK:
				if (natsMsgHeader_Get(msg, "Nats-Msg-Id", &mid) != NATS_OK ||
					strcmp(mid, QBF_MESSAGE_ID) != 0)
					qbf_fail("NATS headers: Nats-Msg-Id is not the message id");
				break;
			case QB_HDR_ROW_INVALID:
				qbf_err_ok(err, sizeof(err), "qbn_headers");
				refused |= QBF_REFUSED_NATS;
				break;
			case QB_HDR_FAILED:
				qbf_err_ok(err, sizeof(err), "qbn_headers");
				break;
		}
	}
	return refused;
}

#endif							/* QB_FUZZ_PUBLISH_CHECK_H */
