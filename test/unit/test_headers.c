/*-------------------------------------------------------------------------
 * test_headers.c
 *	  The header rule (qb_headers.c) through each publisher's header
 *	  building, no broker needed: HTTP request headers (qbh_build_headers),
 *	  the AMQP table (qb_amqp_headers_build), Kafka headers (qbk_headers)
 *	  and NATS headers (qbn_headers).
 *
 * One table: each case is one row header and what each transport makes of
 * it: sent (as which text), left out, or the row refused (dead).
 * docs/delivery.md, "Row headers", is the same table in prose.
 *-------------------------------------------------------------------------
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <cmocka.h>

#include <amqp.h>
#include <curl/curl.h>
#include <jansson.h>
#include <librdkafka/rdkafka.h>
#include <nats/nats.h>

#include "qb_config.h"
#include "qb_headers.h"
#include "qb_http_int.h"
#include "qb_nats.h"
#include "qb_pub_amqp.h"
#include "qb_pub_amqp_int.h"
#include "qb_pub_http.h"
#include "qb_pub_kafka.h"
#include "qb_pub_kafka_int.h"
#include "qb_pub_nats.h"
#include "qb_pub_nats_int.h"

#define MID "0190d6a2-7b7e-7cc0-9a3e-2f1d7a9c4b11"
#define MAXH 16

enum
{
	HTTP, AMQP, KAFKA, NATS, NT
};
static const char *const tname[NT] = {"HTTP", "AMQP", "Kafka", "NATS"};

typedef enum Want
{
	SENT,						/* sent under the row's name, as .sent */
	OUT,						/* left out: the row's value is not sent */
	DEAD						/* the row is refused: QB_HDR_ROW_INVALID */
} Want;

typedef struct Case
{
	const char *name;
	const char *json;			/* the row header's value, as JSON */
	Want		want[NT];		/* HTTP, AMQP, Kafka, NATS */
	const char *sent;			/* its text where it is SENT */
} Case;

static char name255[256];
static char name256[257];

#define ALL(w) {w, w, w, w}

static const Case cases[] = {
	/* values: strings as they are, null left out, the rest as compact JSON text */
	{"X-Str", "\"plain\"", ALL(SENT), "plain"},
	{"X-Null", "null", ALL(OUT), NULL},
	{"X-Int", "5", ALL(SENT), "5"},
	{"X-Real", "1.5", ALL(SENT), "1.5"},
	{"X-Bool", "true", ALL(SENT), "true"},
	{"X-Obj", "{\"a\": [1, 2]}", ALL(SENT), "{\"a\":[1,2]}"},
	{"X-Arr", "[1, \"x\"]", ALL(SENT), "[1,\"x\"]"},
	{"X-Utf8", "\"caf\xc3\xa9\"", ALL(SENT), "caf\xc3\xa9"},
	{"X-Tab", "\"a\\tb\"", ALL(SENT), "a\tb"},
	{"X-Empty", "\"\"", ALL(SENT), ""},
	/* QueueBox's message id, under any transport's name, any letter case */
	{"X-Message-Id", "\"forged\"", ALL(OUT), NULL},
	{"x-message-id", "\"forged\"", ALL(OUT), NULL},
	{"message-id", "\"forged\"", ALL(OUT), NULL},
	{"Message-ID", "\"forged\"", ALL(OUT), NULL},
	{"Nats-Msg-Id", "\"forged\"", ALL(OUT), NULL},
	/* what else QueueBox sets on HTTP: its own, static and signing headers */
	{"Content-Type", "\"text/plain\"", {OUT, SENT, SENT, SENT}, "text/plain"},
	{"User-Agent", "\"evil\"", {OUT, SENT, SENT, SENT}, "evil"},
	{"Expect", "\"100-continue\"", {OUT, SENT, SENT, SENT}, "100-continue"},
	{"X-Static", "\"row\"", {OUT, SENT, SENT, SENT}, "row"},
	{"x-signature", "\"sha256=forged\"", {OUT, SENT, SENT, SENT}, "sha256=forged"},
	/* what a transport reserves: HTTP framing and hop-by-hop, NATS's Nats-* */
	{"Host", "\"elsewhere\"", {OUT, SENT, SENT, SENT}, "elsewhere"},
	{"Content-Length", "\"1\"", {OUT, SENT, SENT, SENT}, "1"},
	{"Transfer-Encoding", "\"chunked\"", {OUT, SENT, SENT, SENT}, "chunked"},
	{"Connection", "\"close\"", {OUT, SENT, SENT, SENT}, "close"},
	{"upgrade", "\"websocket\"", {OUT, SENT, SENT, SENT}, "websocket"},
	{"Nats-Expected-Stream", "\"other\"", {SENT, SENT, SENT, OUT}, "other"},
	{"nats-rollup", "\"all\"", {SENT, SENT, SENT, OUT}, "all"},
	/* passed on as any header: the engine made traceparent the attempt's */
	{"traceparent", "\"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\"", ALL(SENT),
	"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
	{"tracestate", "\"k=v\"", ALL(SENT), "k=v"},
	{"X-Correlation-Id", "\"c-1\"", ALL(SENT), "c-1"},
	/* names and values a transport cannot carry: the row is dead */
	{"", "\"v\"", ALL(DEAD), NULL},
	{"Bad Name", "\"v\"", {DEAD, SENT, SENT, DEAD}, "v"},
	{"a:b", "\"v\"", {DEAD, SENT, SENT, DEAD}, "v"},
	{"X-(paren)", "\"v\"", {DEAD, SENT, SENT, SENT}, "v"},
	{"caf\xc3\xa9", "\"v\"", {DEAD, SENT, SENT, SENT}, "v"},
	{"X-Evil", "\"a\\r\\nInjected: 1\"", {DEAD, SENT, SENT, DEAD}, "a\r\nInjected: 1"},
	{"X-Lf", "\"a\\nb\"", {DEAD, SENT, SENT, DEAD}, "a\nb"},
	{"X-Ctl", "\"a\\u0001b\"", {DEAD, SENT, SENT, SENT}, "a\001b"},
	{"X-Del", "\"a\x7f" "b\"", {DEAD, SENT, SENT, SENT}, "a\x7f" "b"},
	{name255, "\"v\"", ALL(SENT), "v"},
	{name256, "\"v\"", {SENT, DEAD, SENT, SENT}, "v"},
	/* null goes first: a bad name with a null value is just left out */
	{"Bad Name", "null", ALL(OUT), NULL},
};

/* the headers one transport built: name/value pairs, in order */
typedef struct Built
{
	QbHdrResult r;
	char		err[512];
	int			n;
	char	   *name[MAXH];
	char	   *value[MAXH];
	char	   *correlation_id; /* AMQP */
} Built;

static QbConfig *cfg;

static void
built_add(Built *b, const char *name, size_t nlen, const char *value, size_t vlen)
{
	assert_true(b->n < MAXH);
	b->name[b->n] = strndup(name, nlen);
	b->value[b->n] = strndup(value, vlen);
	b->n++;
}

static void
built_free(Built *b)
{
	for (int i = 0; i < b->n; i++)
	{
		free(b->name[i]);
		free(b->value[i]);
	}
	free(b->correlation_id);
	memset(b, 0, sizeof(*b));
}

static void
build_http(const json_t *row, Built *b)
{
	struct curl_slist *list = NULL;
	const QbDestination *d = qb_config_destination(cfg, "hooks");

	b->r = qbh_build_headers(&list, d, MID, row, "{}", 2, b->err, sizeof(b->err));
	for (struct curl_slist *l = list; l != NULL; l = l->next)
	{
		const char *colon = strchr(l->data, ':');
		const char *v;

		assert_non_null(colon);
		v = colon[1] == ' ' ? colon + 2 : colon + 1;
		built_add(b, l->data, colon - l->data, v, strlen(v));
	}
	curl_slist_free_all(list);
}

static void
build_amqp(const json_t *row, Built *b)
{
	QbAmqpHeaders h;

	b->r = qb_amqp_headers_build(row, &h, b->err, sizeof(b->err));
	for (int i = 0; i < h.table.num_entries; i++)
	{
		amqp_table_entry_t *e = &h.table.entries[i];

		assert_int_equal(e->value.kind, AMQP_FIELD_KIND_UTF8);	/* long strings */
		built_add(b, e->key.bytes, e->key.len, e->value.value.bytes.bytes,
				  e->value.value.bytes.len);
	}
	if (h.correlation_id != NULL)
		b->correlation_id = strdup(h.correlation_id);
	qb_amqp_headers_free(&h);
}

static void
build_kafka(const json_t *row, Built *b)
{
	QbMessage	m = {.message_id = MID, .topic = "t", .headers = row, .body = "{}", .body_len = 2};
	rd_kafka_headers_t *h = NULL;
	const char *name;
	const void *v;
	size_t		len;

	b->r = qbk_headers(&m, &h, b->err, sizeof(b->err));
	if (b->r != QB_HDR_OK)
	{
		assert_null(h);
		return;
	}
	for (size_t i = 0; rd_kafka_header_get_all(h, i, &name, &v, &len) == RD_KAFKA_RESP_ERR_NO_ERROR; i++)
		built_add(b, name, strlen(name), v, len);
	rd_kafka_headers_destroy(h);
}

static void
build_nats(const json_t *row, Built *b)
{
	QbMessage	m = {.message_id = MID, .topic = "t", .headers = row, .body = "{}", .body_len = 2};
	natsMsg    *msg = NULL;
	const char **keys = NULL;
	int			nkeys = 0;

	assert_int_equal(natsMsg_Create(&msg, "s", NULL, "{}", 2), NATS_OK);
	b->r = qbn_headers(msg, &m, b->err, sizeof(b->err));
	if (natsMsgHeader_Keys(msg, &keys, &nkeys) == NATS_OK)
	{
		for (int i = 0; i < nkeys; i++)
		{
			const char **vals = NULL;
			int			nvals = 0;

			assert_int_equal(natsMsgHeader_Values(msg, keys[i], &vals, &nvals), NATS_OK);
			for (int j = 0; j < nvals; j++)
				built_add(b, keys[i], strlen(keys[i]), vals[j], strlen(vals[j]));
			free((void *) vals);
		}
		free((void *) keys);
	}
	natsMsg_Destroy(msg);
}

static void (*const build[NT]) (const json_t *row, Built *b) = {
	build_http, build_amqp, build_kafka, build_nats
};

/* how many built headers are named name (any letter case), and with value when not NULL */
static int
count(const Built *b, const char *name, const char *value)
{
	int			k = 0;

	for (int i = 0; i < b->n; i++)
		if (strcasecmp(b->name[i], name) == 0 && (value == NULL || strcmp(b->value[i], value) == 0))
			k++;
	return k;
}

/* QueueBox's own headers, once each, whatever the row said */
static void
check_ours(int t, const Built *b)
{
	switch (t)
	{
		case HTTP:
			assert_int_equal(count(b, "X-Message-Id", NULL), 1);
			assert_int_equal(count(b, "X-Message-Id", MID), 1);
			assert_int_equal(count(b, "Content-Type", "application/json"), 1);
			assert_int_equal(count(b, "X-Static", "dest"), 1);
			assert_int_equal(count(b, "X-Signature", NULL), 1);
			break;
		case KAFKA:
			assert_int_equal(count(b, "message-id", NULL), 1);
			assert_int_equal(count(b, "message-id", MID), 1);
			break;
		case NATS:
			assert_int_equal(count(b, "Nats-Msg-Id", NULL), 1);
			assert_int_equal(count(b, "Nats-Msg-Id", MID), 1);
			break;
		case AMQP:
			/* the message id is the message_id property: nothing in the table */
			assert_int_equal(count(b, "X-Message-Id", NULL) + count(b, "message-id", NULL) +
							 count(b, "Nats-Msg-Id", NULL), 0);
			break;
	}
}

static void
check_case(const Case *c, int t, const Built *b)
{
	json_t	   *v = json_loads(c->json, JSON_DECODE_ANY, NULL);
	char	   *text = json_is_string(v) ? strdup(json_string_value(v)) :
		json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);

	switch (c->want[t])
	{
		case SENT:
			if (b->r != QB_HDR_OK)
				fail_msg("%s, header \"%.40s\": refused: %s", tname[t], c->name, b->err);
			for (int i = 0, k = 0; i < b->n; i++)
				if (strcmp(b->name[i], c->name) == 0 && ++k == 1 && strcmp(b->value[i], c->sent) != 0)
					fail_msg("%s, header \"%.40s\": sent as \"%s\", want \"%s\"",
							 tname[t], c->name, b->value[i], c->sent);
			if (count(b, c->name, c->sent) != 1)
				fail_msg("%s, header \"%.40s\": sent %d times", tname[t], c->name,
						 count(b, c->name, c->sent));
			check_ours(t, b);
			break;
		case OUT:
			if (b->r != QB_HDR_OK)
				fail_msg("%s, header \"%.40s\": refused: %s", tname[t], c->name, b->err);
			if (count(b, c->name, text) != 0)
				fail_msg("%s, header \"%.40s\": the row's value was sent", tname[t], c->name);
			check_ours(t, b);
			break;
		case DEAD:
			if (b->r != QB_HDR_ROW_INVALID)
				fail_msg("%s, header \"%.40s\": not refused (%d)", tname[t], c->name, b->r);
			assert_non_null(strstr(b->err, "row header \""));
			assert_non_null(strstr(b->err, tname[t]));
			assert_non_null(strstr(b->err, "requeue"));
			break;
	}
	free(text);
	json_decref(v);
}

/* Every case of the table through every transport. */
static void
test_rule_table(void **state)
{
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
	{
		const Case *c = &cases[i];
		json_t	   *row = json_object();
		json_t	   *v = json_loads(c->json, JSON_DECODE_ANY, NULL);

		if (v == NULL)
			fail_msg("case %zu: bad JSON %s", i, c->json);
		json_object_set_new(row, c->name, v);
		for (int t = 0; t < NT; t++)
		{
			Built		b;

			memset(&b, 0, sizeof(b));
			build[t] (row, &b);
			check_case(c, t, &b);
			built_free(&b);
		}
		json_decref(row);
	}
}

/* No row headers, or an empty object: only QueueBox's own. */
static void
test_none(void **state)
{
	json_t	   *empty = json_object();

	for (int t = 0; t < NT; t++)
		for (int k = 0; k < 2; k++)
		{
			Built		b;

			memset(&b, 0, sizeof(b));
			build[t] (k ? empty : NULL, &b);
			assert_int_equal(b.r, QB_HDR_OK);
			check_ours(t, &b);
			assert_int_equal(b.n, t == HTTP ? 5 : t == AMQP ? 0 : 1);
			built_free(&b);
		}
	json_decref(empty);
}

/*
 * Several headers: the row's order is kept, and one header a transport
 * cannot carry refuses the whole row there, however many are fine.
 */
static void
test_order_and_one_bad(void **state)
{
	json_t	   *row = json_loads("{\"b\": \"1\", \"a\": 2, \"gone\": null, \"c\": \"3\"}", 0, NULL);

	for (int t = 0; t < NT; t++)
	{
		Built		b;

		memset(&b, 0, sizeof(b));
		build[t] (row, &b);
		assert_int_equal(b.r, QB_HDR_OK);
		if (t != NATS)			/* cnats keeps a message's headers in a hash map */
		{
			assert_string_equal(b.name[0], "b");
			assert_string_equal(b.name[1], "a");
			assert_string_equal(b.value[1], "2");
			assert_string_equal(b.name[2], "c");
		}
		assert_int_equal(count(&b, "gone", NULL), 0);
		built_free(&b);
	}
	json_object_set_new(row, "", json_string("x"));
	for (int t = 0; t < NT; t++)
	{
		Built		b;

		memset(&b, 0, sizeof(b));
		build[t] (row, &b);
		assert_int_equal(b.r, QB_HDR_ROW_INVALID);
		assert_non_null(strstr(b.err, "has an empty name"));
		built_free(&b);
	}
	json_decref(row);
}

/* AMQP: X-Correlation-Id (any letter case) is also the correlation_id property. */
static void
test_amqp_correlation_id(void **state)
{
	char		big[300];
	json_t	   *row = json_loads("{\"x-correlation-ID\": \"c-7\", \"t\": \"acme\"}", 0, NULL);
	Built		b;

	memset(&b, 0, sizeof(b));
	build_amqp(row, &b);
	assert_string_equal(b.correlation_id, "c-7");
	assert_int_equal(count(&b, "x-correlation-ID", "c-7"), 1);
	built_free(&b);
	json_decref(row);

	/* over a short string's 255 bytes: a header only */
	memset(big, 'c', 256);
	big[256] = '\0';
	row = json_pack("{s:s}", "X-Correlation-Id", big);
	memset(&b, 0, sizeof(b));
	build_amqp(row, &b);
	assert_null(b.correlation_id);
	assert_int_equal(count(&b, "X-Correlation-Id", big), 1);
	built_free(&b);
	json_decref(row);
}

/* A refused name shows printable and cut: no control byte reaches last_error. */
static void
test_refusal_text(void **state)
{
	json_t	   *row = json_pack("{s:s}", "X-Bad\r\nInjected", "v");
	Built		b;

	memset(&b, 0, sizeof(b));
	build_http(row, &b);
	assert_int_equal(b.r, QB_HDR_ROW_INVALID);
	assert_non_null(strstr(b.err, "row header \"X-Bad\\x0d\\x0aInjected\" is not a valid HTTP header"));
	built_free(&b);
	json_decref(row);
	row = json_pack("{s:s}", name256, "v");
	memset(&b, 0, sizeof(b));
	build_amqp(row, &b);
	assert_int_equal(b.r, QB_HDR_ROW_INVALID);
	assert_non_null(strstr(b.err, "...\" has a name of 256 bytes; an AMQP header name is 1 to 255 bytes"));
	built_free(&b);
	json_decref(row);
}

/*
 * Each publisher's start answers a row the rule refuses with
 * QB_PUB_ROW_INVALID (the engine settles it dead), before any connection.
 */
static void
test_start_refuses(void **state)
{
	static const QbPublisherOps *const ops[NT] = {
		&qb_http_publisher, &qb_amqp_publisher, &qb_kafka_publisher, &qb_nats_publisher
	};
	static const char *const dest[NT] = {"hooks", "mq", "kf", "nt"};
	json_t	   *row = json_pack("{s:s, s:s}", "X-Ok", "v", "", "empty name");
	QbMessage	m = {.message_id = MID, .topic = "t", .headers = row, .body = "{}", .body_len = 2};

	for (int t = 0; t < NT; t++)
	{
		char		err[512] = "";
		void	   *p = ops[t]->create(err, sizeof(err));

		assert_non_null(p);
		assert_int_equal(ops[t]->start(p, qb_config_destination(cfg, dest[t]), &m, 0, err, sizeof(err)),
						 QB_PUB_ROW_INVALID);
		assert_non_null(strstr(err, "has an empty name"));
		assert_int_equal(ops[t]->in_flight(p), 0);
		ops[t]->destroy(p);
	}
	json_decref(row);
}

static int
setup(void **state)
{
	static const char doc[] =
		"destinations:\n"
		"  hooks:\n"
		"    type: http\n"
		"    baseUrl: \"http://127.0.0.1:9\"\n"
		"    headers: { X-Static: dest }\n"
		"    signing: { type: hmac-sha256, secret: s3cret, header: X-Signature, prefix: \"sha256=\" }\n"
		"  mq: { type: rabbitmq, url: \"amqp://u:p@127.0.0.1:9/\", exchange: e }\n"
		"  kf: { type: kafka, brokers: \"127.0.0.1:9\" }\n"
		"  nt: { type: nats, url: \"nats://127.0.0.1:9\" }\n";
	char		err[QB_ERRLEN];

	memset(name255, 'h', 255);
	memset(name256, 'h', 256);
	if (!qb_nats_open(err, sizeof(err)) ||
		qb_config_parse(doc, strlen(doc), NULL, &cfg, err, sizeof(err)) != 0)
	{
		fprintf(stderr, "setup: %s\n", err);
		return -1;
	}
	return 0;
}

static int
teardown(void **state)
{
	qb_config_free(cfg);
	return 0;
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_rule_table),
		cmocka_unit_test(test_none),
		cmocka_unit_test(test_order_and_one_bad),
		cmocka_unit_test(test_amqp_correlation_id),
		cmocka_unit_test(test_refusal_text),
		cmocka_unit_test(test_start_refuses),
	};

	return cmocka_run_group_tests_name("qb_headers", tests, setup, teardown);
}
