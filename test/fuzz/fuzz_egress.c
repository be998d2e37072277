/*-------------------------------------------------------------------------
 * fuzz_egress.c
 *	  libFuzzer harness: the egress rules (qb_egress.h): a list parsed, a
 *	  destination's URLs judged at configure time, and each address a
 *	  connection could then reach judged at connect time.
 *
 * Input: the first line is a list (queuebox.allowed_destinations), the
 * second a URL or a list of them (a destination's baseUrl, brokers or
 * servers), judged whole, then each of its URLs alone.
 *
 * What must hold, for a list that parses, and each URL of the second line
 * whose host the URL reader reads as an address (the connection then goes
 * to that address and nowhere else):
 *	- configure time and connect time agree: the URL passes the configure
 *	  check exactly when a connection to its address, made for that URL,
 *	  passes the connect check;
 *	- a list of names only refuses it, at both times;
 *	- a link-local or metadata address is refused unless a listed network
 *	  holds it;
 * and a connection made for a listed name is refused only for its address
 * (a metadata address, or one outside the listed networks).
 *-------------------------------------------------------------------------
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include "fuzz_common.h"
#include "qb_egress.h"
#include "qb_url.h"

int			LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/*
 * the address a connection for url goes to, when its host is one; false: a
 * name, or no host.  The connection's host is the URL reader's (fuzz_url
 * checks it is each client library's).
 */
static bool
qbf_url_address(const char *url, struct sockaddr_storage *ss)
{
	struct sockaddr_in *v4 = (struct sockaddr_in *) ss;
	struct sockaddr_in6 *v6 = (struct sockaddr_in6 *) ss;
	char		host[256];
	char		err[256];

	memset(ss, 0, sizeof(*ss));
	if (!qb_url_host(url, strlen(url), host, sizeof(host), err, sizeof(err)))
		return false;
	if (inet_pton(AF_INET, host, &v4->sin_addr) == 1)
		return (v4->sin_family = AF_INET) != 0;
	if (inet_pton(AF_INET6, host, &v6->sin6_addr) == 1)
		return (v6->sin6_family = AF_INET6) != 0;
	return false;
}

/* is a in the refused set, by the rules' own judgement of an empty list? */
static bool
qbf_metadata(const struct sockaddr *a)
{
	QbEgress   *none = NULL;
	char		why[300];
	bool		refused;

	if (!qb_egress_parse("", "x", &none, why, sizeof(why)))
		qbf_fail("the empty list does not parse: %s", why);
	refused = !qb_egress_addr_ok(none, NULL, a, why, sizeof(why));
	qb_egress_free(none);
	return refused;
}

static void
qbf_one_url(const QbEgress *e, const char *url)
{
	struct sockaddr_storage ss;
	char		why1[300] = "";
	char		why2[300] = "";
	bool		at_configure,
				at_connect;

	at_configure = qb_egress_hosts_ok(e, url, why1, sizeof(why1));
	if (!at_configure && strncmp(why1, "egress refused: ", 16) != 0)
		qbf_fail("a refusal that does not say so: \"%s\"", why1);
	if (!qbf_url_address(url, &ss))
		return;
	at_connect = qb_egress_addr_ok(e, url, (struct sockaddr *) &ss, why2, sizeof(why2));
	if (at_configure != at_connect)
		qbf_fail("configure time says %d (%s), connect time %d (%s), for \"%s\"",
				 at_configure, why1, at_connect, why2, url);
	if (at_connect && e->nnames > 0 && e->ncidrs == 0)
		qbf_fail("an address host passed a list of names only: \"%s\"", url);
	if (at_connect && e->ncidrs == 0 && qbf_metadata((struct sockaddr *) &ss))
		qbf_fail("a metadata address passed: \"%s\"", url);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const uint8_t *nl = memchr(data, '\n', size);
	size_t		n1 = nl ? (size_t) (nl - data) : size;
	char	   *list = qbf_strndup(data, n1);
	char	   *urls = nl ? qbf_strndup(nl + 1, size - n1 - 1) : qbf_strndup(data, 0);
	QbEgress   *e = NULL;
	char		err[300];

	if (qb_egress_parse(list, "queuebox.allowed_destinations", &e, err, sizeof(err)))
	{
		char	   *save = NULL;
		struct sockaddr_in v4 = {.sin_family = AF_INET};

		char		why[300];

		(void) qb_egress_hosts_ok(e, urls, why, sizeof(why));
		(void) qb_egress_resolve_ok(e, "", why, sizeof(why));
		for (char *u = strtok_r(urls, ", \t\n", &save); u != NULL; u = strtok_r(NULL, ", \t\n", &save))
			qbf_one_url(e, u);
		/* a listed name reaches any address the networks allow, never a metadata one */
		inet_pton(AF_INET, "169.254.169.254", &v4.sin_addr);
		for (int i = 0; i < e->nrules; i++)
			if (e->rules[i].name != NULL && e->rules[i].name[0] != '*' && e->ncidrs == 0)
			{
				char		via[300];

				snprintf(via, sizeof(via), "http://%s/", e->rules[i].name);
				if (qb_egress_addr_ok(e, via, (struct sockaddr *) &v4, err, sizeof(err)))
					qbf_fail("a listed name reached a metadata address: %s", via);
			}
		qb_egress_free(e);
	}
	else if (e != NULL)
		qbf_fail("a refused list left a policy");
	free(list);
	free(urls);
	return 0;
}
