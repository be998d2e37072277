/*-------------------------------------------------------------------------
 * test_broker_headers.c
 *	  A broker message's headers to the JSON stored with its inbox row:
 *	  the AMQP headers table (qbsa_headers), Kafka headers
 *	  (qbks_headers_json) and NATS headers (qbns_headers).
 *
 * The cases fuzz_broker_headers found (test/fuzz/corpus/fuzz_broker_headers/
 * holds the inputs): an AMQP header whose name or string value is not
 * UTF-8 was reported as out of memory, so the consumer nacked the message
 * back to the queue and got it again, for ever; a Kafka header value
 * holding a NUL became "\u0000", which PostgreSQL's jsonb refuses, so the
 * batch's store failed.  Such a header is now left out, and the others of
 * the message are kept.
 *-------------------------------------------------------------------------
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include <amqp.h>
#include <jansson.h>
#include <librdkafka/rdkafka.h>
#include <nats/nats.h>

#include "qb_nats.h"
#include "qb_src_amqp_int.h"
#include "qb_src_kafka_int.h"
#include "qb_src_nats_int.h"

static amqp_table_entry_t
entry(const char *key, size_t klen, const char *value, size_t vlen)
{
	amqp_table_entry_t e;

	memset(&e, 0, sizeof(e));
	e.key.bytes = (void *) key;
	e.key.len = klen;
	e.value.kind = AMQP_FIELD_KIND_UTF8;
	e.value.value.bytes.bytes = (void *) value;
	e.value.value.bytes.len = vlen;
	return e;
}

static char *
amqp_headers(amqp_table_entry_t *e, int n, bool *oom)
{
	amqp_basic_properties_t p;

	memset(&p, 0, sizeof(p));
	p._flags = AMQP_BASIC_HEADERS_FLAG;
	p.headers.num_entries = n;
	p.headers.entries = e;
	return qbsa_headers(&p, oom);
}

static void
test_amqp_not_utf8(void **state)
{
	amqp_table_entry_t e[4];
	bool		oom = true;
	char	   *text;

	/* the fuzzer's input: one header named "\xff" */
	e[0] = entry("\xff", 1, "", 0);
	text = amqp_headers(e, 1, &oom);
	assert_false(oom);
	assert_string_equal(text, "{}");
	free(text);

	/* a bad name, a bad value, a NUL in a value: left out; the good one kept */
	e[0] = entry("caf\xc3", 4, "v", 1);
	e[1] = entry("X-Bad-Value", 11, "a\xc0\xaf" "b", 4);
	e[2] = entry("X-Nul", 5, "a\0b", 3);
	e[3] = entry("X-Good", 6, "caf\xc3\xa9", 5);
	text = amqp_headers(e, 4, &oom);
	assert_false(oom);
	assert_string_equal(text, "{\"X-Good\":\"caf\xc3\xa9\"}");
	free(text);
}

static void
test_kafka_nul_and_utf8(void **state)
{
	rd_kafka_headers_t *h = rd_kafka_headers_new(4);
	char	   *mid = NULL;
	char	   *text;

	rd_kafka_header_add(h, "X-Nul", -1, "a\0b", 3);
	rd_kafka_header_add(h, "X-Bad", -1, "\xff", 1);
	rd_kafka_header_add(h, "X-None", -1, NULL, 0);
	rd_kafka_header_add(h, "message-id", -1, "m-1", 3);
	text = qbks_headers_json(h, &mid);
	assert_non_null(text);
	assert_null(strstr(text, "\\u0000"));
	assert_string_equal(text, "{\"X-None\":null,\"message-id\":\"m-1\"}");
	assert_string_equal(mid, "m-1");
	free(text);
	free(mid);
	rd_kafka_headers_destroy(h);
}

static void
test_nats_not_utf8(void **state)
{
	natsMsg    *m = NULL;
	bool		oom = true;
	char	   *text;
	char		err[256];

	assert_true(qb_nats_open(err, sizeof(err)));
	assert_int_equal(natsMsg_Create(&m, "s", NULL, "{}", 2), NATS_OK);
	assert_int_equal(natsMsgHeader_Add(m, "X-Bad", "\xff"), NATS_OK);
	assert_int_equal(natsMsgHeader_Add(m, "X-Good", "1"), NATS_OK);
	assert_int_equal(natsMsgHeader_Add(m, "X-Good", "2"), NATS_OK);
	text = qbns_headers(m, &oom);
	assert_false(oom);
	assert_string_equal(text, "{\"X-Good\":\"1, 2\"}");
	free(text);
	natsMsg_Destroy(m);
}

/* qb_nats_redact: a server list with every password hidden, a comma or '@' in one too */
static void
test_nats_redact(void **state)
{
	char		out[256];
	static const char *const cases[][2] = {
		{"nats://u:p@h:4222", "nats://***@h:4222"},
		{"nats://h1:4222,nats://u:p@h2:4222", "nats://h1:4222,nats://***@h2:4222"},
		{"nats://a:p@h1,tls://b:q@h2", "nats://***@h1,tls://***@h2"},
		{"nats://h:4222", "nats://h:4222"},
		/*
		 * found by fuzz_url: a comma in the password split the entry, and its
		 * first half was printed; now each part is read as a URL, and one
		 * that does not read is not shown (the configuration refuses it)
		 */
		{"nats://u:S3CR3T]m.x2,PqW,PWpD:@h",
		"(a server URL that does not read),(a server URL that does not read),(a server URL that does not read)"},
		{"nats://u:p%2Cq@h", "nats://***@h"},
		{"nats://u:p%40ss@h", "nats://***@h"},
		{"nats://u:p@ss@h", "(a server URL that does not read)"},
		{"u:secret@h:4222", "(a server URL that does not read)"},
		{"tls://u@[::1]:4223", "tls://***@[::1]:4223"},
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
	{
		qb_nats_redact(cases[i][0], out, sizeof(out));
		assert_string_equal(out, cases[i][1]);
	}
	qb_nats_redact("nats://u:p@h", out, 6);
	assert_int_equal(strlen(out), 5);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_amqp_not_utf8),
		cmocka_unit_test(test_kafka_nul_and_utf8),
		cmocka_unit_test(test_nats_not_utf8),
		cmocka_unit_test(test_nats_redact),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
