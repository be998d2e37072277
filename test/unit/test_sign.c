/*-------------------------------------------------------------------------
 * test_sign.c
 *	  Outbound signing (qb_sign.c): the Standard Webhooks spec's published
 *	  test vector, rotation with two secrets, hmac-sha256 in hex, base64 and
 *	  with a prefix, the headers a scheme owns, and secrets that cannot be
 *	  keys.  Expected values come from the spec or the openssl command line;
 *	  a last test checks that the inbound verifier (qb_auth.c) accepts what
 *	  the signer makes, under each secret alone.
 *-------------------------------------------------------------------------
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <openssl/crypto.h>

#include "qb_sign.h"
#include "openssl_cli.h"

/* The headers a signer hands over, as a receiver would see them. */
typedef struct Got
{
	int			n;
	char		name[4][64];
	char		value[4][1024];
	int			fail_at;		/* add() refuses this call (1-based); 0 never */
} Got;

static bool
collect(void *ctx, const char *name, const char *value)
{
	Got		   *g = ctx;

	if (g->n + 1 == g->fail_at || g->n >= 4)
		return false;
	snprintf(g->name[g->n], sizeof(g->name[g->n]), "%s", name);
	snprintf(g->value[g->n], sizeof(g->value[g->n]), "%s", value);
	g->n++;
	return true;
}

static const char *
got(const Got *g, const char *name)
{
	for (int i = 0; i < g->n; i++)
		if (strcasecmp(g->name[i], name) == 0)
			return g->value[i];
	return NULL;
}

/* signing: a QbSigning over the given secrets (keys made as config does). */
static QbSigning
signing(QbAuthType t, const char *const *secrets, int n)
{
	QbSigning	s = {.type = t, .encoding = QB_SIG_HEX};
	char		err[256];

	s.keys = calloc(n, sizeof(QbSignKey));
	assert_non_null(s.keys);
	s.nkeys = n;
	for (int i = 0; i < n; i++)
		if (!qb_sign_key(t, secrets[i], &s.keys[i], err, sizeof(err)))
			fail_msg("secret %d refused: %s", i, err);
	return s;
}

/* signing_free: what signing() and a test made, keys wiped; *s is unsigned */
static void
signing_free(QbSigning *s)
{
	for (int i = 0; i < s->nkeys; i++)
	{
		OPENSSL_cleanse(s->keys[i].bytes, s->keys[i].len);
		free(s->keys[i].bytes);
	}
	free(s->keys);
	free(s->header);
	free(s->prefix);
	memset(s, 0, sizeof(*s));
}

/*
 * The spec's vector (libraries/javascript/src/webhook.test.ts, "sign
 * function works", the same in every library of standard-webhooks).
 */
#define SW_SECRET	"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
#define SW_MSG_ID	"msg_p5jXN8AQM9LWM0D4loKWxJek"
#define SW_TS		1614265330LL
#define SW_PAYLOAD	"{\"test\": 2432232314}"
#define SW_SIG		"v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="

static void
test_standard_webhooks_vector(void **state)
{
	const char *const with_prefix[] = {SW_SECRET};
	const char *const bare[] = {SW_SECRET + 6};
	char		err[256];

	for (int v = 0; v < 2; v++)
	{
		QbSigning	s = signing(QB_AUTH_STANDARD_WEBHOOKS, v == 0 ? with_prefix : bare, 1);
		Got			g = {0};

		assert_true(qb_sign_request(&s, SW_MSG_ID, SW_TS, SW_PAYLOAD, strlen(SW_PAYLOAD),
									collect, &g, err, sizeof(err)));
		assert_int_equal(g.n, 3);
		assert_string_equal(got(&g, "webhook-id"), SW_MSG_ID);
		assert_string_equal(got(&g, "webhook-timestamp"), "1614265330");
		assert_string_equal(got(&g, "webhook-signature"), SW_SIG);
		signing_free(&s);
		assert_int_equal(s.type, QB_AUTH_NONE);
	}
}

/* Two secrets: one v1 signature each, space-separated, in document order. */
static void
test_standard_webhooks_rotation(void **state)
{
	/* the second key's bytes are "queuebox-rotated-key-01" */
	const char *const secrets[] = {"whsec_cXVldWVib3gtcm90YXRlZC1rZXktMDE=", SW_SECRET};
	QbSigning	s = signing(QB_AUTH_STANDARD_WEBHOOKS, secrets, 2);
	const char *body = "{\"order\": 7, \"note\": \"caf\xc3\xa9\"}";
	char		content[256];
	char		mac[128];
	char		want[256];
	char		hexkey[128];
	char		err[256];
	Got			g = {0};

	assert_true(qb_sign_request(&s, "id-7", 1700000000LL, body, strlen(body),
								collect, &g, err, sizeof(err)));
	snprintf(content, sizeof(content), "id-7.1700000000.%s", body);
	openssl_mac("key:queuebox-rotated-key-01", content, true, mac, sizeof(mac));
	snprintf(want, sizeof(want), "v1,%s", mac);
	/* MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw, as hex */
	snprintf(hexkey, sizeof(hexkey), "hexkey:%s",
			 "31f290f6bf06298aab4f08d43c3f082cf648a362da2da4b0");
	openssl_mac(hexkey, content, true, mac, sizeof(mac));
	snprintf(want + strlen(want), sizeof(want) - strlen(want), " v1,%s", mac);
	assert_string_equal(got(&g, "webhook-signature"), want);
	signing_free(&s);
}

static void
test_hmac_sha256(void **state)
{
	const char *const one[] = {"s3cret"};
	const char *const two[] = {"n3w-secret", "s3cret"};
	const char *body = "{\"id\":\"evt_1\",\"amount\":42}";
	char		hex_old[128],
				hex_new[128],
				b64[128],
				want[512],
				err[256];

	openssl_mac("key:s3cret", body, false, hex_old, sizeof(hex_old));
	openssl_mac("key:n3w-secret", body, false, hex_new, sizeof(hex_new));
	openssl_mac("key:s3cret", body, true, b64, sizeof(b64));

	/* hex, no prefix: the bare digest */
	{
		QbSigning	s = signing(QB_AUTH_HMAC_SHA256, one, 1);
		Got			g = {0};

		s.header = strdup("X-Signature");
		assert_true(qb_sign_request(&s, "m", 1, body, strlen(body), collect, &g, err, sizeof(err)));
		assert_int_equal(g.n, 1);
		assert_string_equal(g.name[0], "X-Signature");
		assert_string_equal(g.value[0], hex_old);
		assert_true(qb_sign_sets(&s, "x-signature"));
		assert_false(qb_sign_sets(&s, "webhook-signature"));
		signing_free(&s);
	}
	/* base64 with a prefix */
	{
		QbSigning	s = signing(QB_AUTH_HMAC_SHA256, one, 1);
		Got			g = {0};

		s.header = strdup("X-Hub-Signature-256");
		s.prefix = strdup("sha256=");
		s.encoding = QB_SIG_BASE64;
		assert_true(qb_sign_request(&s, "m", 1, body, strlen(body), collect, &g, err, sizeof(err)));
		snprintf(want, sizeof(want), "sha256=%s", b64);
		assert_string_equal(got(&g, "X-Hub-Signature-256"), want);
		signing_free(&s);
	}
	/* two secrets: each value prefixed, joined by ", " */
	{
		QbSigning	s = signing(QB_AUTH_HMAC_SHA256, two, 2);
		Got			g = {0};

		s.header = strdup("X-Signature");
		s.prefix = strdup("sha256=");
		assert_true(qb_sign_request(&s, "m", 1, body, strlen(body), collect, &g, err, sizeof(err)));
		snprintf(want, sizeof(want), "sha256=%s, sha256=%s", hex_new, hex_old);
		assert_string_equal(got(&g, "X-Signature"), want);
		signing_free(&s);
	}
}

/* Which headers a scheme owns; none without signing. */
static void
test_headers_owned(void **state)
{
	const char *const secrets[] = {SW_SECRET};
	QbSigning	none = {0};
	QbSigning	s = signing(QB_AUTH_STANDARD_WEBHOOKS, secrets, 1);
	Got			g = {0};
	char		err[256] = "";

	assert_false(qb_sign_sets(&none, "webhook-id"));
	assert_false(qb_sign_sets(NULL, "webhook-id"));
	assert_true(qb_sign_request(&none, "m", 1, "{}", 2, collect, &g, err, sizeof(err)));
	assert_int_equal(g.n, 0);
	assert_true(qb_sign_sets(&s, "Webhook-Id"));
	assert_true(qb_sign_sets(&s, "WEBHOOK-TIMESTAMP"));
	assert_true(qb_sign_sets(&s, "webhook-signature"));
	assert_false(qb_sign_sets(&s, "X-Message-Id"));

	/* an add() that fails is reported, naming the header */
	g.fail_at = 3;
	assert_false(qb_sign_request(&s, "m", 1, "{}", 2, collect, &g, err, sizeof(err)));
	assert_non_null(strstr(err, "webhook-signature"));
	signing_free(&s);
}

/* Secrets that make no key; the message never repeats the secret. */
static void
test_bad_secrets(void **state)
{
	QbSignKey	k;
	char		err[256];

	assert_false(qb_sign_key(QB_AUTH_STANDARD_WEBHOOKS, "whsec_not*base64!", &k, err, sizeof(err)));
	assert_non_null(strstr(err, "not valid base64"));
	assert_null(strstr(err, "not*base64"));
	assert_null(k.bytes);
	assert_false(qb_sign_key(QB_AUTH_STANDARD_WEBHOOKS, "whsec_", &k, err, sizeof(err)));
	assert_false(qb_sign_key(QB_AUTH_HMAC_SHA256, "", &k, err, sizeof(err)));
	assert_non_null(strstr(err, "must not be empty"));

	/* hmac-sha256 takes the secret's bytes as they are, whsec_ included */
	assert_true(qb_sign_key(QB_AUTH_HMAC_SHA256, "whsec_abc", &k, err, sizeof(err)));
	assert_int_equal(k.len, 9);
	assert_memory_equal(k.bytes, "whsec_abc", 9);
	free(k.bytes);
}

/* headers of a Got, for qb_auth_verify */
static const char *
got_get(void *ctx, const char *name)
{
	return got(ctx, name);
}

/* What the signer makes, the inbound verifier accepts, under either secret. */
static void
test_verifier_accepts(void **state)
{
	const char *const secrets[] = {"whsec_cXVldWVib3gtcm90YXRlZC1rZXktMDE=", SW_SECRET};
	QbSigning	s = signing(QB_AUTH_STANDARD_WEBHOOKS, secrets, 2);
	const char *body = "{\"a\": 1}";
	char		err[256];
	Got			g = {0};

	assert_true(qb_sign_request(&s, "mid-1", 1764460800LL, body, strlen(body),
								collect, &g, err, sizeof(err)));
	for (int i = 0; i < 2; i++)
	{
		QbAuth		a = {.type = QB_AUTH_STANDARD_WEBHOOKS, .secrets = &secrets[i], .nsecrets = 1};

		if (!qb_auth_verify(&a, got_get, &g, (const unsigned char *) body, strlen(body),
							1764460800, err, sizeof(err)))
			fail_msg("secret %d: %s", i, err);
		assert_false(qb_auth_verify(&a, got_get, &g, (const unsigned char *) "{\"a\": 2}", 8,
									1764460800, err, sizeof(err)));
	}
	signing_free(&s);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_standard_webhooks_vector),
		cmocka_unit_test(test_standard_webhooks_rotation),
		cmocka_unit_test(test_hmac_sha256),
		cmocka_unit_test(test_headers_owned),
		cmocka_unit_test(test_bad_secrets),
		cmocka_unit_test(test_verifier_accepts),
	};

	return cmocka_run_group_tests_name("qb_sign", tests, NULL, NULL);
}
