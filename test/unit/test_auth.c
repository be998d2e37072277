/*-------------------------------------------------------------------------
 * test_auth.c
 *	  Signature schemes and bearer tokens: valid, wrong secret, tampered body,
 *	  stale timestamp, rotated secret, missing header.  Expected signatures
 *	  are computed independently with the openssl command line, so the
 *	  tests do not check the code against itself.
 *-------------------------------------------------------------------------
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <ctype.h>
#include <unistd.h>

#include "qb_auth.h"
#include "openssl_cli.h"

typedef struct Headers
{
	const char *names[6];
	const char *values[6];
} Headers;

static const char *
get(void *ctx, const char *name)
{
	Headers    *h = ctx;

	for (int i = 0; i < 6 && h->names[i]; i++)
		if (strcasecmp(h->names[i], name) == 0)
			return h->values[i];
	return NULL;
}

static const char *BODY = "{\"id\":\"evt_1\",\"type\":\"invoice.paid\"}";
#define NOW 1764460800

static void
test_hmac_sha256(void **state)
{
	const char *secrets[] = {"s3cret"};
	const char *rotated[] = {"old-secret", "s3cret"};
	QbAuth		a = {.type = QB_AUTH_HMAC_SHA256, .secrets = secrets, .nsecrets = 1,
	.header = "X-Signature", .prefix = "sha256=", .encoding = QB_SIG_HEX};
	char		mac[256],
				v[300],
				err[256];
	Headers		h = {{"X-Signature"}, {v}};

	openssl_mac("key:s3cret", BODY, false, mac, sizeof(mac));
	snprintf(v, sizeof(v), "sha256=%s", mac);
	assert_true(qb_auth_verify(&a, get, &h, (const unsigned char *) BODY, strlen(BODY), NOW, err, sizeof(err)));

	/* upper-case hex is the same signature */
	for (char *p = v + 7; *p; p++)
		*p = (char) toupper((unsigned char) *p);
	assert_true(qb_auth_verify(&a, get, &h, (const unsigned char *) BODY, strlen(BODY), NOW, err, sizeof(err)));

	/* tampered body */
	assert_false(qb_auth_verify(&a, get, &h, (const unsigned char *) "{}", 2, NOW, err, sizeof(err)));
	assert_non_null(strstr(err, "X-Signature"));
	assert_null(strstr(err, mac));	/* no signature in the reason */

	/* wrong secret; then rotation accepts the current one beside an old one */
	secrets[0] = "other";
	assert_false(qb_auth_verify(&a, get, &h, (const unsigned char *) BODY, strlen(BODY), NOW, err, sizeof(err)));
	assert_null(strstr(err, "other"));
	a.secrets = rotated;
	a.nsecrets = 2;
	assert_true(qb_auth_verify(&a, get, &h, (const unsigned char *) BODY, strlen(BODY), NOW, err, sizeof(err)));

	/* missing prefix, missing header */
	snprintf(v, sizeof(v), "%s", mac);
	assert_false(qb_auth_verify(&a, get, &h, (const unsigned char *) BODY, strlen(BODY), NOW, err, sizeof(err)));
	assert_non_null(strstr(err, "sha256="));
	h.names[0] = "X-Other";
	assert_false(qb_auth_verify(&a, get, &h, (const unsigned char *) BODY, strlen(BODY), NOW, err, sizeof(err)));
	assert_non_null(strstr(err, "X-Signature header missing"));

	/* base64 encoding, no prefix */
	openssl_mac("key:s3cret", BODY, true, mac, sizeof(mac));
	h.names[0] = "X-Signature";
	snprintf(v, sizeof(v), "%s", mac);
	a.prefix = NULL;
	a.encoding = QB_SIG_BASE64;
	assert_true(qb_auth_verify(&a, get, &h, (const unsigned char *) BODY, strlen(BODY), NOW, err, sizeof(err)));
}

static void
test_github(void **state)
{
	const char *secrets[] = {"gh-secret"};
	QbAuth		a = {.type = QB_AUTH_GITHUB, .secrets = secrets, .nsecrets = 1};
	char		mac[256],
				v[300],
				err[256];
	Headers		h = {{"x-hub-signature-256"}, {v}};

	openssl_mac("key:gh-secret", BODY, false, mac, sizeof(mac));
	snprintf(v, sizeof(v), "sha256=%s", mac);
	assert_true(qb_auth_verify(&a, get, &h, (const unsigned char *) BODY, strlen(BODY), NOW, err, sizeof(err)));
	assert_false(qb_auth_verify(&a, get, &h, (const unsigned char *) BODY, strlen(BODY) - 1, NOW, err, sizeof(err)));
	assert_non_null(strstr(err, "X-Hub-Signature-256"));
}

static void
test_stripe(void **state)
{
	const char *secrets[] = {"whsec_stripe"};
	const char *rotated[] = {"whsec_new", "whsec_stripe"};
	QbAuth		a = {.type = QB_AUTH_STRIPE, .secrets = secrets, .nsecrets = 1};
	char		signed_payload[512],
				mac[256],
				v[400],
				err[256];
	Headers		h = {{"Stripe-Signature"}, {v}};

	snprintf(signed_payload, sizeof(signed_payload), "%d.%s", NOW, BODY);
	openssl_mac("key:whsec_stripe", signed_payload, false, mac, sizeof(mac));
	snprintf(v, sizeof(v), "t=%d,v1=%s,v0=deadbeef", NOW, mac);
	assert_true(qb_auth_verify(&a, get, &h, (const unsigned char *) BODY, strlen(BODY), NOW + 10, err, sizeof(err)));

	/* a second v1 (Stripe's own rotation) may be the matching one */
	snprintf(v, sizeof(v), "t=%d,v1=%064d,v1=%s", NOW, 0, mac);
	assert_true(qb_auth_verify(&a, get, &h, (const unsigned char *) BODY, strlen(BODY), NOW, err, sizeof(err)));

	/* stale: 301 s later with the default tolerance of 300 s */
	assert_false(qb_auth_verify(&a, get, &h, (const unsigned char *) BODY, strlen(BODY), NOW + 301, err, sizeof(err)));
	assert_non_null(strstr(err, "tolerance of 300 s"));
	a.tolerance_sec = 600;
	assert_true(qb_auth_verify(&a, get, &h, (const unsigned char *) BODY, strlen(BODY), NOW + 301, err, sizeof(err)));
	a.tolerance_sec = 0;

	/* tampered body, wrong secret, rotation */
	assert_false(qb_auth_verify(&a, get, &h, (const unsigned char *) "{}", 2, NOW, err, sizeof(err)));
	secrets[0] = "whsec_wrong";
	assert_false(qb_auth_verify(&a, get, &h, (const unsigned char *) BODY, strlen(BODY), NOW, err, sizeof(err)));
	a.secrets = rotated;
	a.nsecrets = 2;
	assert_true(qb_auth_verify(&a, get, &h, (const unsigned char *) BODY, strlen(BODY), NOW, err, sizeof(err)));

	/*
	 * the most negative timestamps: their distance from now is over 2^63 s
	 * and was a signed overflow (UBSan in fuzz_auth, seeded with it)
	 */
	snprintf(v, sizeof(v), "t=-9223372036854775808,v1=%s", mac);
	assert_false(qb_auth_verify(&a, get, &h, (const unsigned char *) BODY, strlen(BODY), NOW, err, sizeof(err)));
	assert_non_null(strstr(err, "is 9223372038619236608 s away from now"));
	snprintf(v, sizeof(v), "t=-99999999999999999999,v1=%s", mac);
	assert_false(qb_auth_verify(&a, get, &h, (const unsigned char *) BODY, strlen(BODY), NOW, err, sizeof(err)));
	assert_non_null(strstr(err, "is 9223372038619236608 s away from now"));
	/* malformed header */
	snprintf(v, sizeof(v), "v1=%s", mac);
	assert_false(qb_auth_verify(&a, get, &h, (const unsigned char *) BODY, strlen(BODY), NOW, err, sizeof(err)));
	assert_non_null(strstr(err, "t=<timestamp>"));
}

static void
test_standard_webhooks(void **state)
{
	/* key bytes "standard-webhooks-key" as whsec_ base64 */
	const char *secrets[] = {"whsec_c3RhbmRhcmQtd2ViaG9va3Mta2V5"};
	const char *rotated[] = {"whsec_b3RoZXI=", "whsec_c3RhbmRhcmQtd2ViaG9va3Mta2V5"};
	QbAuth		a = {.type = QB_AUTH_STANDARD_WEBHOOKS, .secrets = secrets, .nsecrets = 1};
	char		ts[32],
				content[512],
				mac[256],
				sig[400],
				err[256];
	Headers		h = {{"webhook-id", "webhook-timestamp", "webhook-signature"}, {"msg_2Lh9", ts, sig}};

	snprintf(ts, sizeof(ts), "%d", NOW);
	snprintf(content, sizeof(content), "msg_2Lh9.%d.%s", NOW, BODY);
	openssl_mac("hexkey:7374616e646172642d776562686f6f6b732d6b6579", content, true, mac, sizeof(mac));
	snprintf(sig, sizeof(sig), "v1,AAAA v1,%s", mac);
	assert_true(qb_auth_verify(&a, get, &h, (const unsigned char *) BODY, strlen(BODY), NOW - 5, err, sizeof(err)));

	assert_false(qb_auth_verify(&a, get, &h, (const unsigned char *) BODY, strlen(BODY), NOW + 1000, err, sizeof(err)));
	assert_non_null(strstr(err, "webhook-timestamp"));
	assert_false(qb_auth_verify(&a, get, &h, (const unsigned char *) "x", 1, NOW, err, sizeof(err)));
	secrets[0] = "whsec_b3RoZXI=";
	assert_false(qb_auth_verify(&a, get, &h, (const unsigned char *) BODY, strlen(BODY), NOW, err, sizeof(err)));
	a.secrets = rotated;
	a.nsecrets = 2;
	assert_true(qb_auth_verify(&a, get, &h, (const unsigned char *) BODY, strlen(BODY), NOW, err, sizeof(err)));

	h.names[0] = "x-other";
	assert_false(qb_auth_verify(&a, get, &h, (const unsigned char *) BODY, strlen(BODY), NOW, err, sizeof(err)));
	assert_non_null(strstr(err, "webhook-id header missing"));
}

static void
test_bearer(void **state)
{
	QbAuth		a = {.type = QB_AUTH_BEARER, .token = "tok-123"};
	char		err[256];
	Headers		h = {{"Authorization"}, {"Bearer tok-123"}};

	assert_true(qb_auth_verify(&a, get, &h, NULL, 0, NOW, err, sizeof(err)));
	h.values[0] = "bearer tok-123";
	assert_true(qb_auth_verify(&a, get, &h, NULL, 0, NOW, err, sizeof(err)));
	h.values[0] = "Bearer tok-12";
	assert_false(qb_auth_verify(&a, get, &h, NULL, 0, NOW, err, sizeof(err)));
	assert_null(strstr(err, "tok-12"));
	h.values[0] = "Basic dG9rLTEyMw==";
	assert_false(qb_auth_verify(&a, get, &h, NULL, 0, NOW, err, sizeof(err)));
	h.names[0] = "X-Other";
	assert_false(qb_auth_verify(&a, get, &h, NULL, 0, NOW, err, sizeof(err)));
	assert_non_null(strstr(err, "Authorization header missing"));
	/* an empty configured token never matches */
	a.token = "";
	h.names[0] = "Authorization";
	h.values[0] = "Bearer ";
	assert_false(qb_auth_verify(&a, get, &h, NULL, 0, NOW, err, sizeof(err)));
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_hmac_sha256),
		cmocka_unit_test(test_github),
		cmocka_unit_test(test_stripe),
		cmocka_unit_test(test_standard_webhooks),
		cmocka_unit_test(test_bearer),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
