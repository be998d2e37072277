/*-------------------------------------------------------------------------
 * fuzz_ingress.c
 *	  libFuzzer harness: a webhook after libmicrohttpd, through the checks
 *	  of qb_ingress.c, to the row it would store, and that row's headers
 *	  through every publisher's conversion.
 *
 * The ingress's checks are static and read the request through
 * libmicrohttpd (qbi_check_webhook), so this harness runs the pieces they
 * call in their order, not the engine: qb_auth_verify; the JSON parse
 * (json_loadb, JSON_DECODE_ANY); the idempotency key, event type and
 * aggregate id (a header, or qb_jsonpath_text; at most 1024 bytes, UTF-8,
 * no control character but tab: qbi_value's rules, mirrored here);
 * each header through qbi_header_take (qb_ingress_int.h: the ingress's own
 * code); json_dumps of the headers; the source's transform (libjq, in the
 * forked helper).  What libmicrohttpd itself refuses (a line without a
 * colon, a NUL, 64 KiB of head) is TAP 037's.
 *
 * Input: the first byte picks the source (one of QBF_NSOURCES, each with
 * its auth scheme, where its values come from, and a transform), then a
 * header block, then the body (fuzz_common.h); "@SIG@" and "@TOK@" in a
 * header value stand for a matching signature and token (fuzz_auth_sig.h).
 *
 * What must hold for a request the checks accept (the row): the key is
 * non-empty UTF-8 of at most 1024 bytes; the stored headers are a JSON
 * object of token names and one-line UTF-8 string values, with no
 * transport or credential header; the payload is JSON; and no publisher
 * refuses the row's headers, as relayed with the relay's own x-* headers
 * (a stored row must never die of a header it received).
 *-------------------------------------------------------------------------
 */
#include <time.h>

#include "fuzz_auth_sig.h"
#include "fuzz_publish_check.h"
#include "qb_extract.h"
#include "qb_ingress_int.h"
#include "qb_transform.h"
#include "qb_utf8.h"

int			LLVMFuzzerInitialize(int *argc, char ***argv);
int			LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define QBF_MAX_VALUE_BYTES 1024	/* QBI_MAX_VALUE_BYTES */

static const char qbf_doc[] =
"destinations:\n"
"  plain: { type: http, baseUrl: \"http://127.0.0.1:9\" }\n"
"  signed:\n"
"    type: http\n"
"    baseUrl: \"http://127.0.0.1:9\"\n"
"    headers: { X-Api-Key: k1, X-Static: s }\n"
"    signing: { type: standard-webhooks, secret: \"whsec_c3RhbmRhcmQtd2ViaG9va3Mta2V5\" }\n"
"routes:\n"
"  - { topicPattern: \"**\", destination: plain }\n"
"sources:\n"
"  plain:\n"
"    type: http\n"
"    path: /plain\n"
"    idempotencyKeyPath: $.id\n"
"    eventTypePath: $.type\n"
"    aggregateIdPath: $.data.object.customer\n"
"  hmac:\n"
"    type: http\n"
"    path: /hmac\n"
"    topic: \"{{ source }}\"\n"
"    idempotencyKeyHeader: X-Request-Id\n"
"    auth: { type: hmac-sha256, secrets: [old-secret-fuzz, s3cret-fuzz], header: X-Signature, prefix: \"sha256=\" }\n"
"    transform: \".\"\n"
"  github:\n"
"    type: http\n"
"    path: /github\n"
"    idempotencyKeyHeader: X-GitHub-Delivery\n"
"    eventTypeHeader: X-GitHub-Event\n"
"    auth: { type: github, secrets: [old-secret-fuzz, s3cret-fuzz] }\n"
"    transform: \"{event: $eventType, id: .id, headers: $headers}\"\n"
"  stripe:\n"
"    type: http\n"
"    path: /stripe\n"
"    idempotencyKeyPath: $.id\n"
"    eventTypePath: $.type\n"
"    auth: { type: stripe, secrets: [old-secret-fuzz, s3cret-fuzz], toleranceSec: 86400 }\n"
"    transform: 'if .type == \"drop\" then error(\"dropped\") else . end'\n"
"  std:\n"
"    type: http\n"
"    path: /std\n"
"    eventTypePath: $.type\n"
"    aggregateIdPath: \"$['data']['id']\"\n"
"    auth: { type: standard-webhooks, secrets: [\"whsec_b3RoZXI=\", \"whsec_c3RhbmRhcmQtd2ViaG9va3Mta2V5\"], toleranceSec: 86400 }\n"
"    transform: \".data // .\"\n"
"  bearer:\n"
"    type: http\n"
"    path: /bearer\n"
"    idempotencyKeyPath: \"$['key']\"\n"
"    eventTypeHeader: X-Event-Type\n"
"    aggregateIdPath: $.items[0].id\n"
"    auth: { type: bearer, token: tok-fuzz-1234567890 }\n"
"    transform: \"del(.secret) | .source = $source | .agg = $key\"\n"
"  b64:\n"
"    type: http\n"
"    path: /b64\n"
"    topic: \"{{ source }}\"\n"
"    idempotencyKeyPath: $.id\n"
"    auth: { type: hmac-sha256, secrets: [old-secret-fuzz, s3cret-fuzz], header: X-Acme-Sig, encoding: base64 }\n"
"    transform: \"[paths] | length\"\n";

static QbConfig *qbf_cfg;
static QbTransformHelper qbf_jq;	/* the transforms' helper, kept across inputs */

int
LLVMFuzzerInitialize(int *argc, char ***argv)
{
	qbf_cfg = qbf_publish_setup("fuzz_ingress", qbf_doc);
	return 0;
}

/*
 * qbf_value: qbi_value's rules (a header, or a JSONPath of the body).  false:
 * refused; *out NULL when an optional value is absent.
 */
static bool
qbf_value(QbfHeaders *h, json_t *doc, const char *path, const char *header,
		  bool required, char **out)
{
	const char *v = NULL;
	char	   *owned = NULL;

	*out = NULL;
	if (header != NULL)
	{
		v = qbf_headers_get(h, header);
		if (v == NULL || v[0] == '\0')
			return !required;
	}
	else if (path != NULL)
	{
		owned = qb_jsonpath_text(doc, path);
		if (owned == NULL || owned[0] == '\0')
		{
			free(owned);
			return !required;
		}
		v = owned;
	}
	else
		return true;
	if (strlen(v) > QBF_MAX_VALUE_BYTES || qb_utf8_invalid_at(v, strlen(v)) >= 0 ||
		qb_field_value_invalid_at(v) >= 0)
	{
		free(owned);
		return false;
	}
	*out = owned ? owned : strdup(v);
	return true;
}

/* qbf_row_check: what must hold of a stored row (the banner). */
static void
qbf_row_check(const QbSource *s, const char *key, const char *headers, const char *payload,
			  size_t len)
{
	json_t	   *obj = json_loads(headers, 0, NULL);
	json_t	   *relayed;
	json_t	   *doc;
	const char *name;
	json_t	   *v;
	int			refused;

	if (key == NULL || key[0] == '\0' || strlen(key) > QBF_MAX_VALUE_BYTES ||
		qb_utf8_invalid_at(key, strlen(key)) >= 0)
		qbf_fail("source %s stored a row without a usable key", s->name);
	if (obj == NULL || !json_is_object(obj))
		qbf_fail("source %s stored headers that are not a JSON object: %.200s", s->name, headers);
	json_object_foreach(obj, name, v)
	{
		if (!json_is_string(v))
			qbf_fail("stored header %s is not a string", name);
		if (!qb_header_valid(name, json_string_value(v)))
			qbf_fail("stored header \"%.100s\" could not be sent as HTTP", name);
		if (qb_utf8_invalid_at(json_string_value(v), json_string_length(v)) >= 0)
			qbf_fail("stored header \"%.100s\" is not UTF-8", name);
		if (qb_header_redacted(name, s->auth.header))
			qbf_fail("stored header \"%.100s\" carries a credential", name);
		if (strcasecmp(name, "Host") == 0 || strcasecmp(name, "Content-Length") == 0 ||
			strcasecmp(name, "Transfer-Encoding") == 0 || strcasecmp(name, "Connection") == 0)
			qbf_fail("stored header \"%.100s\" is a transport header", name);
	}
	doc = json_loadb(payload, len, JSON_DECODE_ANY, NULL);
	if (doc == NULL)
		qbf_fail("source %s stored a payload that is not JSON (or holds \\u0000, which jsonb refuses)",
				 s->name);
	json_decref(doc);

	/* the relay's outbox row: the received headers plus its own */
	relayed = json_deep_copy(obj);
	json_object_set_new(relayed, "x-inbox-id", json_string("42"));
	json_object_set_new(relayed, "x-source", json_string(s->name));
	json_object_set_new(relayed, "x-idempotency-key", json_string(key));
	refused = qbf_publish_all(relayed, qb_config_destination(qbf_cfg, "plain"),
							  qb_config_destination(qbf_cfg, "signed"));
	if (refused)
		qbf_fail("a row source %s stored is refused by a publisher (mask 0x%x; 1 HTTP, 2 AMQP, 4 Kafka, 8 NATS): %.300s",
				 s->name, refused, headers);
	json_decref(relayed);
	json_decref(obj);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const QbSource *s;
	QbfHeaders	h;
	QbiHeaders	qh;
	char		err[QB_ERRLEN];
	json_t	   *doc;
	char	   *key = NULL,
			   *event_type = NULL,
			   *aggregate_id = NULL,
			   *headers = NULL,
			   *body;
	size_t		len;
	bool		ok;

	if (size == 0)
		return 0;
	s = &qbf_cfg->sources[data[0] % qbf_cfg->nsources];
	data++;
	size--;
	qbf_headers_read(&h, &data, &size);
	qbf_sign_headers(s->auth.type, s->auth.encoding, &h, data, size);
	body = qbf_strndup(data, size);
	len = size;

	/* 3. checks: authentication, JSON, values, headers, transform */
	if (s->auth.type != QB_AUTH_NONE &&
		!qb_auth_verify(&s->auth, qbf_headers_get, &h, (const unsigned char *) body, len,
						QBF_NOW, err, sizeof(err)))
		goto done;
	if (len == 0)
		goto done;
	doc = json_loadb(body, len, JSON_DECODE_ANY, NULL);
	if (doc == NULL)
		goto done;
	ok = qbf_value(&h, doc, s->idempotency_key_path, s->idempotency_key_header, true, &key) &&
		qbf_value(&h, doc, s->event_type_path, s->event_type_header, false, &event_type) &&
		qbf_value(&h, doc, s->aggregate_id_path, NULL, false, &aggregate_id);
	json_decref(doc);
	if (!ok)
		goto done;
	if (key == NULL)
		qbf_fail("source %s: a required key was accepted absent", s->name);

	qh.src = s;
	qh.obj = json_pack("{}");
	qh.bad[0] = '\0';
	for (int i = 0; i < h.n; i++)
		if (!qbi_header_take(&qh, h.names[i], h.values[i]))
			qbf_fail("qbi_header_take: out of memory");
	if (qh.bad[0] != '\0')
	{
		qbf_err_ok(qh.bad, sizeof(qh.bad), "qbi_header_take");
		json_decref(qh.obj);
		goto done;
	}
	headers = json_dumps(qh.obj, JSON_COMPACT);
	json_decref(qh.obj);
	if (headers == NULL)
		qbf_fail("the checked headers cannot be dumped as JSON");
	if (s->transform != NULL)
	{
		QbTransformVars vars = {NULL, aggregate_id, headers, s->name, event_type};
		char	   *out;
		size_t		outlen;

		switch (qb_transform_run(&qbf_jq, s->transform, body, len, &vars, NULL, &out, &outlen,
								 err, sizeof(err)))
		{
			case QB_TRANSFORM_OK:
				free(body);
				body = out;
				len = outlen;
				break;
			case QB_TRANSFORM_REJECTED:
			case QB_TRANSFORM_FAILED:
				qbf_err_ok(err, sizeof(err), "qb_transform_run");
				goto done;
		}
	}
	/* 4. the row */
	qbf_row_check(s, key, headers, body, len);

done:
	free(key);
	free(event_type);
	free(aggregate_id);
	free(headers);
	free(body);
	qbf_headers_free(&h);
	return 0;
}
