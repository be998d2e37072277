/*-------------------------------------------------------------------------
 * openssl_cli.h
 *	  The unit tests' independent HMAC: the openssl command line, so that a
 *	  signature test never checks qb_crypto.c against itself.  Included by
 *	  test_auth.c and test_sign.c (each test program is one file plus the
 *	  core, so the helper is static, in a header).
 *-------------------------------------------------------------------------
 */
#ifndef OPENSSL_CLI_H
#define OPENSSL_CLI_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/*
 * openssl_mac: HMAC-SHA256 of data by the openssl CLI, hex or base64.
 * keyopt is a -macopt: "key:<text>" or "hexkey:<hex>".
 */
static void
openssl_mac(const char *keyopt, const char *data, bool b64, char *out, size_t outlen)
{
	char		cmd[1024];
	char		path[] = "/tmp/qb-auth-XXXXXX";
	int			fd = mkstemp(path);
	FILE	   *p;

	assert_true(fd >= 0);
	assert_int_equal(write(fd, data, strlen(data)), (int) strlen(data));
	close(fd);
	snprintf(cmd, sizeof(cmd),
			 b64 ? "openssl dgst -sha256 -mac HMAC -macopt %s -binary %s | openssl base64 -A"
			 : "openssl dgst -sha256 -mac HMAC -macopt %s -r %s | cut -d' ' -f1",
			 keyopt, path);
	p = popen(cmd, "r");
	assert_non_null(p);
	assert_non_null(fgets(out, (int) outlen, p));
	pclose(p);
	out[strcspn(out, "\n")] = '\0';
	unlink(path);
}

#endif							/* OPENSSL_CLI_H */
