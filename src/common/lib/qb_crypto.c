/*-------------------------------------------------------------------------
 * qb_crypto.c
 *	  HMAC-SHA256, hex, base64 and whsec keys (see qb_crypto.h).
 *
 * HMACs and base64 come from OpenSSL (EVP_MAC, EVP_EncodeBlock and
 * EVP_DecodeBlock); only hex is written here.
 *-------------------------------------------------------------------------
 */
#include <string.h>

#include <openssl/evp.h>
#include <openssl/params.h>

#include "qb_crypto.h"

bool
qb_hmac_sha256(const unsigned char *key, size_t keylen,
			   const unsigned char *const *parts, const size_t *lens, int nparts,
			   unsigned char out[QB_HMAC_LEN])
{
	EVP_MAC    *mac = EVP_MAC_fetch(NULL, "HMAC", NULL);
	EVP_MAC_CTX *ctx = mac ? EVP_MAC_CTX_new(mac) : NULL;
	OSSL_PARAM	params[2];
	size_t		outlen = 0;
	bool		ok = false;

	params[0] = OSSL_PARAM_construct_utf8_string("digest", (char *) "SHA256", 0);
	params[1] = OSSL_PARAM_construct_end();
	memset(out, 0, QB_HMAC_LEN);
	if (ctx != NULL && EVP_MAC_init(ctx, key, keylen, params) == 1)
	{
		ok = true;
		for (int i = 0; i < nparts; i++)
			ok = EVP_MAC_update(ctx, parts[i], lens[i]) == 1 && ok;
		ok = EVP_MAC_final(ctx, out, &outlen, QB_HMAC_LEN) == 1 && ok &&
			outlen == QB_HMAC_LEN;
		if (!ok)
			memset(out, 0, QB_HMAC_LEN);
	}
	EVP_MAC_CTX_free(ctx);
	EVP_MAC_free(mac);
	return ok;
}

bool
qb_sha256_hex(const void *data, size_t len, char out[QB_HMAC_HEX_LEN + 1])
{
	unsigned char md[EVP_MAX_MD_SIZE];
	unsigned int mdlen = 0;

	out[0] = '\0';
	if (EVP_Digest(data, len, md, &mdlen, EVP_sha256(), NULL) != 1 || mdlen != QB_HMAC_LEN)
		return false;
	qb_hex_encode(md, mdlen, out);
	return true;
}

void
qb_hex_encode(const unsigned char *in, size_t n, char *out)
{
	static const char digits[] = "0123456789abcdef";

	for (size_t i = 0; i < n; i++)
	{
		out[2 * i] = digits[in[i] >> 4];
		out[2 * i + 1] = digits[in[i] & 15];
	}
	out[2 * n] = '\0';
}

int
qb_hex_digit(int c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

void
qb_b64_encode(const unsigned char *in, size_t n, char *out)
{
	EVP_EncodeBlock((unsigned char *) out, in, (int) n);
}

/*
 * EVP_DecodeBlock counts padding as zero bytes, so they are taken off
 * again.
 */
int
qb_b64_decode(const char *in, unsigned char *out)
{
	size_t		len = strlen(in);
	int			n;

	if (len == 0 || len % 4 != 0)
		return -1;
	n = EVP_DecodeBlock(out, (const unsigned char *) in, (int) len);
	if (n < 0)
		return -1;
	if (in[len - 1] == '=')
		n--;
	if (in[len - 2] == '=')
		n--;
	return n;
}

int
qb_whsec_decode(const char *secret, unsigned char out[QB_WHSEC_MAX])
{
	const char *b64 = secret;

	if (strncmp(b64, "whsec_", 6) == 0)
		b64 += 6;
	if (strlen(b64) > 4 * (QB_WHSEC_MAX / 3))
		return -1;
	return qb_b64_decode(b64, out);
}
