/*-------------------------------------------------------------------------
 * fuzz_auth.c
 *	  libFuzzer harness: qb_auth_verify with every scheme: hmac-sha256
 *	  (hex with a prefix, base64 without), github (X-Hub-Signature-256),
 *	  stripe (Stripe-Signature), standard-webhooks (webhook-id,
 *	  webhook-timestamp, webhook-signature with several signatures) and
 *	  bearer; and qb_auth_secret_check.
 *
 * Input: the first byte picks the scheme (bits 0-2) and the tolerance
 * (bits 3-4: the default, 1 s, 60 s, 86400 s); then a header block ("Name:
 * value" lines, an empty line: fuzz_common.h), then the body.  "@SIG@" and
 * "@TOK@" in a value stand for a matching signature and the token
 * (fuzz_auth_sig.h).  Secrets are fixed, two per scheme (a rotation); the
 * clock is fixed at QBF_NOW.
 *
 * What must hold: a refusal has a message that names no secret, token or
 * matching signature.
 *-------------------------------------------------------------------------
 */
#include "fuzz_auth_sig.h"

int			LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const long tolerances[] = {0, 1, 60, 86400};
	QbAuth		a = {0};
	QbfHeaders	h;
	char		err[512];
	uint8_t		mode;

	if (size == 0)
		return 0;
	mode = data[0];
	data++;
	size--;
	a.secrets = qbf_hmac_secrets;
	a.nsecrets = 2;
	a.tolerance_sec = tolerances[(mode >> 3) & 3];
	switch (mode & 7)
	{
		case 0:
			a.type = QB_AUTH_HMAC_SHA256;
			a.header = "X-Signature";
			a.prefix = "sha256=";
			a.encoding = QB_SIG_HEX;
			break;
		case 1:
			a.type = QB_AUTH_HMAC_SHA256;
			a.header = "X-Acme-Sig";
			a.encoding = QB_SIG_BASE64;
			break;
		case 2:
			a.type = QB_AUTH_GITHUB;
			break;
		case 3:
			a.type = QB_AUTH_STRIPE;
			break;
		case 4:
			a.type = QB_AUTH_STANDARD_WEBHOOKS;
			a.secrets = qbf_whsec_secrets;
			break;
		case 5:
			a.type = QB_AUTH_BEARER;
			a.token = QBF_TOKEN;
			a.nsecrets = 0;
			a.secrets = NULL;
			break;
		case 6:
			a.type = QB_AUTH_HMAC_SHA256;	/* no header set: X-Signature, hex */
			break;
		default:
			a.type = QB_AUTH_NONE;
			break;
	}
	qbf_headers_read(&h, &data, &size);
	qbf_sign_headers(a.type, a.encoding, &h, data, size);
	memset(err, 'x', sizeof(err));
	if (!qb_auth_verify(&a, qbf_headers_get, &h, data, size, QBF_NOW, err, sizeof(err)))
	{
		qbf_err_ok(err, sizeof(err), "qb_auth_verify");
		if (err[0] == '\0')
			qbf_fail("qb_auth_verify refused with an empty message");
		qbf_no_secret_in(err, a.type, a.encoding, &h, data, size);
	}
	/* a header value as a configured secret */
	for (int i = 0; i < h.n; i++)
	{
		memset(err, 'x', sizeof(err));
		if (h.values[i][0] && !qb_auth_secret_check(a.type, h.values[i], err, sizeof(err)))
			qbf_err_ok(err, sizeof(err), "qb_auth_secret_check");
	}
	qbf_headers_free(&h);
	return 0;
}
