/*-------------------------------------------------------------------------
 * fuzz_publish.c
 *	  libFuzzer harness: a row's headers to each publisher's form: the
 *	  HTTP request headers (qbh_build_headers, with and without static
 *	  headers and signing), the AMQP table (qb_amqp_headers_build), Kafka
 *	  headers (qbk_headers) and NATS headers (qbn_headers); and an HTTP
 *	  answer's Retry-After (qb_http_retry_after_ms).
 *
 * Input: the first line is a Retry-After value; the rest is the row's
 * headers as JSON (an object as it is; any other value v as {"h": v}).
 *
 * What must hold (fuzz_publish_check.h): a refusal has a message; an HTTP
 * request built holds only "token: value" lines without line breaks; AMQP
 * names are 1 to 255 bytes; the Kafka and NATS message id headers are the
 * row's message id, whatever the row's headers say.  A Retry-After is -1
 * or a delay of at least 0.
 *-------------------------------------------------------------------------
 */
#include "fuzz_publish_check.h"
#include "qb_http.h"

int			LLVMFuzzerInitialize(int *argc, char ***argv);
int			LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char qbf_doc[] =
"destinations:\n"
"  plain: { type: http, baseUrl: \"http://127.0.0.1:9\" }\n"
"  signed:\n"
"    type: http\n"
"    baseUrl: \"http://127.0.0.1:9\"\n"
"    headers: { X-Api-Key: k1, X-Static: s }\n"
"    signing: { type: hmac-sha256, secret: s3cret-fuzz, header: X-Signature, prefix: \"sha256=\" }\n";

static QbConfig *qbf_cfg;

int
LLVMFuzzerInitialize(int *argc, char ***argv)
{
	qbf_cfg = qbf_publish_setup("fuzz_publish", qbf_doc);
	return 0;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char	   *retry = qbf_line(&data, &size);
	long		ms = qb_http_retry_after_ms(retry, 1764460800LL);
	json_t	   *v;

	if (ms < -1)
		qbf_fail("qb_http_retry_after_ms(\"%s\") = %ld", retry, ms);
	free(retry);
	v = json_loadb((const char *) data, size, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
	if (v == NULL)
		return 0;
	if (!json_is_object(v))
	{
		json_t	   *o = json_pack("{s:o}", "h", v);

		if (o == NULL)
			return 0;
		v = o;
	}
	(void) qbf_publish_all(v, qb_config_destination(qbf_cfg, "plain"),
						   qb_config_destination(qbf_cfg, "signed"));
	json_decref(v);
	return 0;
}
