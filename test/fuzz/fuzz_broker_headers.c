/*-------------------------------------------------------------------------
 * fuzz_broker_headers.c
 *	  libFuzzer harness: a broker message's headers to the JSON stored with
 *	  its inbox row: the AMQP headers table (qbsa_headers), Kafka headers
 *	  (qbks_headers_json) and NATS headers (qbns_headers).
 *
 * Input: records, each a kind byte, a name and a value: the name up to
 * the first '\n' and the value up to the next (values may hold any byte
 * but '\n', names any but '\n'; a NUL inside is kept where the broker
 * type allows it).  The same records make an AMQP table (the kind byte
 * picks the field type: strings, bytes, booleans, every integer width,
 * floats, timestamp, void, decimal, nested table and array), a Kafka
 * header list (kind bit 0: a header without a value) and NATS headers (set
 * with natsMsgHeader_Add, so a repeated name has several values).
 *
 * What must hold: the text is NULL (no headers) or a JSON object that
 * PostgreSQL's jsonb takes (no \u0000, which it refuses); a NULL
 * is never called out of memory when memory did not run out (a message
 * whose headers cannot be read must not be retried for ever as if the
 * machine were full); Kafka's message id is the last "message-id" value.
 *-------------------------------------------------------------------------
 */
#include <amqp.h>
#include <jansson.h>
#include <librdkafka/rdkafka.h>
#include <nats/nats.h>

#include "fuzz_common.h"
#include "fuzz_nats.h"
#include "qb_nats.h"
#include "qb_src_amqp_int.h"
#include "qb_src_kafka_int.h"
#include "qb_src_nats_int.h"

int			LLVMFuzzerInitialize(int *argc, char ***argv);
int			LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define QBF_MAX_RECORDS 32

typedef struct QbfRecord
{
	uint8_t		kind;
	const uint8_t *name;
	size_t		nlen;
	const uint8_t *value;
	size_t		vlen;
} QbfRecord;

int
LLVMFuzzerInitialize(int *argc, char ***argv)
{
	char		err[256];

	if (!qb_nats_open(err, sizeof(err)))
	{
		fprintf(stderr, "qb_nats_open: %s\n", err);
		abort();
	}
	return 0;
}

/* qbf_records: split the input; returns how many. */
static int
qbf_records(const uint8_t *p, size_t n, QbfRecord *r)
{
	int			k = 0;

	while (n > 0 && k < QBF_MAX_RECORDS)
	{
		const uint8_t *nl;

		r[k].kind = *p++;
		n--;
		nl = memchr(p, '\n', n);
		r[k].name = p;
		r[k].nlen = nl ? (size_t) (nl - p) : n;
		p += nl ? r[k].nlen + 1 : r[k].nlen;
		n -= nl ? r[k].nlen + 1 : r[k].nlen;
		nl = memchr(p, '\n', n);
		r[k].value = p;
		r[k].vlen = nl ? (size_t) (nl - p) : n;
		p += nl ? r[k].vlen + 1 : r[k].vlen;
		n -= nl ? r[k].vlen + 1 : r[k].vlen;
		k++;
	}
	return k;
}

/* qbf_json_ok: the converted text is NULL or a JSON object; frees it. */
static void
qbf_json_ok(char *text, const char *who)
{
	json_t	   *o;

	if (text == NULL)
		return;
	o = json_loads(text, 0, NULL);
	/* without JSON_ALLOW_NUL, jansson refuses \u0000 as jsonb does */
	if (o == NULL || !json_is_object(o))
		qbf_fail("%s: the headers' JSON is not an object (or holds \\u0000): %.200s", who, text);
	json_decref(o);
	free(text);
}

/* qbf_num: up to 8 value bytes as an integer (little-endian). */
static uint64_t
qbf_num(const QbfRecord *r)
{
	uint64_t	v = 0;

	for (size_t i = 0; i < r->vlen && i < 8; i++)
		v |= (uint64_t) r->value[i] << (8 * i);
	return v;
}

static void
qbf_amqp(const QbfRecord *r, int n)
{
	static const uint8_t kinds[] = {
		AMQP_FIELD_KIND_UTF8, AMQP_FIELD_KIND_BYTES, AMQP_FIELD_KIND_BOOLEAN,
		AMQP_FIELD_KIND_I8, AMQP_FIELD_KIND_U8, AMQP_FIELD_KIND_I16, AMQP_FIELD_KIND_U16,
		AMQP_FIELD_KIND_I32, AMQP_FIELD_KIND_U32, AMQP_FIELD_KIND_I64, AMQP_FIELD_KIND_U64,
		AMQP_FIELD_KIND_F32, AMQP_FIELD_KIND_F64, AMQP_FIELD_KIND_TIMESTAMP,
		AMQP_FIELD_KIND_VOID, AMQP_FIELD_KIND_DECIMAL, AMQP_FIELD_KIND_TABLE,
	AMQP_FIELD_KIND_ARRAY};
	amqp_table_entry_t e[QBF_MAX_RECORDS];
	amqp_basic_properties_t p;
	bool		oom = true;
	char	   *text;

	memset(&p, 0, sizeof(p));
	memset(e, 0, sizeof(e));
	for (int i = 0; i < n; i++)
	{
		uint64_t	num = qbf_num(&r[i]);
		double		d;

		e[i].key.bytes = (void *) r[i].name;
		e[i].key.len = r[i].nlen;
		e[i].value.kind = kinds[r[i].kind % sizeof(kinds)];
		switch (e[i].value.kind)
		{
			case AMQP_FIELD_KIND_UTF8:
			case AMQP_FIELD_KIND_BYTES:
				e[i].value.value.bytes.bytes = (void *) r[i].value;
				e[i].value.value.bytes.len = r[i].vlen;
				break;
			case AMQP_FIELD_KIND_BOOLEAN:
				e[i].value.value.boolean = (amqp_boolean_t) (num & 1);
				break;
			case AMQP_FIELD_KIND_F32:
				{
					float		f;
					uint32_t	u = (uint32_t) num;

					memcpy(&f, &u, sizeof(f));
					e[i].value.value.f32 = f;
					break;
				}
			case AMQP_FIELD_KIND_F64:
				memcpy(&d, &num, sizeof(d));
				e[i].value.value.f64 = d;
				break;
			case AMQP_FIELD_KIND_TABLE:
			case AMQP_FIELD_KIND_ARRAY:
				/* empty: the conversion skips them without looking inside */
				break;
			default:
				e[i].value.value.u64 = num;
				break;
		}
	}
	p._flags = (n > 0 && (r[0].kind & 0x80)) ? 0 : AMQP_BASIC_HEADERS_FLAG;
	p.headers.num_entries = n;
	p.headers.entries = e;
	text = qbsa_headers(&p, &oom);
	if (text == NULL && oom)
		qbf_fail("qbsa_headers: out of memory reported for headers it could not convert");
	qbf_json_ok(text, "qbsa_headers");
}

static void
qbf_kafka(const QbfRecord *r, int n)
{
	rd_kafka_headers_t *h = rd_kafka_headers_new(8);
	char	   *mid = (char *) 0x1;
	char	   *text;

	for (int i = 0; i < n; i++)
	{
		char	   *name = qbf_strndup(r[i].name, r[i].nlen);

		rd_kafka_header_add(h, name, -1, (r[i].kind & 1) ? NULL : r[i].value,
							(r[i].kind & 1) ? 0 : (ssize_t) r[i].vlen);
		free(name);
	}
	text = qbks_headers_json(h, &mid);
	if (mid == (char *) 0x1)
		qbf_fail("qbks_headers_json left the message id unset");
	if (mid != NULL)
	{
		const void *v;
		size_t		len;

		if (rd_kafka_header_get_last(h, "message-id", &v, &len) != RD_KAFKA_RESP_ERR_NO_ERROR)
			qbf_fail("qbks_headers_json found a message id where there is none");
		(void) v;
		(void) len;
	}
	free(mid);
	qbf_json_ok(text, "qbks_headers_json");
	rd_kafka_headers_destroy(h);
}

static void
qbf_nats(const QbfRecord *r, int n)
{
	natsMsg    *m = qbf_nats_msg();
	bool		oom = true;
	char	   *text;

	for (int i = 0; i < n; i++)
	{
		char	   *name = qbf_strndup(r[i].name, r[i].nlen);
		char	   *value = qbf_strndup(r[i].value, r[i].vlen);

		(void) natsMsgHeader_Add(m, name, value);
		free(name);
		free(value);
	}
	text = qbns_headers(m, &oom);
	if (text == NULL && oom)
		qbf_fail("qbns_headers: out of memory reported for headers it could not convert");
	qbf_json_ok(text, "qbns_headers");
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	QbfRecord	r[QBF_MAX_RECORDS];
	int			n = qbf_records(data, size, r);

	qbf_amqp(r, n);
	qbf_kafka(r, n);
	qbf_nats(r, n);
	return 0;
}
