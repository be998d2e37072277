/*-------------------------------------------------------------------------
 * qb_egress.c
 *	  Egress rules: parse a policy, judge a host and an address (see
 *	  qb_egress.h for the rules).
 *
 * Vocabulary: an entry is one item of the list; a rule is its parsed form;
 * the refused set is the link-local and metadata networks refused unless a
 * listed CIDR contains them; a host is what a URL names (the one URL
 * reader, qb_url.h, reads it: the same host the connection is made to);
 * an address host is one a resolver reads as an address without asking
 * DNS ("10.1.2.3", "[::1]", and the old spellings "2130706433", "0x7f.1",
 * "0177.0.0.1", "127.1"); the via of a connection is the URL or
 * "host:port" it was made for.  Thread safety: parsing and judging touch
 * only their arguments.
 * Which rules judge (a document's or the host's) is the caller's to say
 * (qb_egress_policy.h).
 *-------------------------------------------------------------------------
 */
#include <arpa/inet.h>
#include <ctype.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

#include "qb_egress.h"
#include "qb_errlen.h"
#include "qb_url.h"

/* refused unless listed: {family, address, bits, what} */
static const struct
{
	int			family;
	const char *addr;
	int			bits;
}			qbe_refused[] = {
	{AF_INET, "169.254.0.0", 16},	/* link-local: AWS, GCP, Azure metadata */
	{AF_INET, "100.100.100.200", 32},	/* Alibaba Cloud metadata */
	{AF_INET6, "fe80::", 10},	/* link-local */
	{AF_INET6, "fd00:ec2::254", 128},	/* AWS metadata over IPv6 */
};

#define QBE_NREFUSED (int) (sizeof(qbe_refused) / sizeof(qbe_refused[0]))

/* the default rules: e NULL */
static const QbEgress qbe_none = {NULL, 0, 0, 0, (char *) "queuebox.allowed_destinations", (char *) ""};

/* does addr (len bytes of family) lie in the network net/bits? */
static bool
qbe_in(const unsigned char *addr, const unsigned char *net, int bits)
{
	int			whole = bits / 8;
	int			rest = bits % 8;

	if (memcmp(addr, net, whole) != 0)
		return false;
	return rest == 0 || ((addr[whole] ^ net[whole]) & (0xff << (8 - rest))) == 0;
}

/* zero the host bits of a network address */
static void
qbe_mask(unsigned char *addr, int len, int bits)
{
	for (int i = 0; i < len; i++)
	{
		int			keep = bits - i * 8;

		if (keep <= 0)
			addr[i] = 0;
		else if (keep < 8)
			addr[i] &= (unsigned char) (0xff << (8 - keep));
	}
}

/*
 * qbe_unmap: an IPv6 address that carries an IPv4 one becomes that one: the
 * IPv4-mapped ::ffff:a.b.c.d (the kernel connects to a.b.c.d) and the NAT64
 * well-known prefix 64:ff9b::a.b.c.d (a NAT64 gateway does).
 */
static void
qbe_unmap(int *family, unsigned char *addr)
{
	static const unsigned char mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
	static const unsigned char nat64[12] = {0, 0x64, 0xff, 0x9b};

	if (*family == AF_INET6 && (memcmp(addr, mapped, 12) == 0 || memcmp(addr, nat64, 12) == 0))
	{
		memmove(addr, addr + 12, 4);
		memset(addr + 4, 0, 12);
		*family = AF_INET;
	}
}

/*
 * qbe_literal: an address as a rule writes it ("10.1.2.3", "::1", "[::1]"),
 * inet_pton's spellings only, into family and bytes (16, zero past the
 * address), not unmapped.
 */
static bool
qbe_literal(const char *s, size_t len, int *family, unsigned char *out)
{
	char		buf[64];

	memset(out, 0, 16);
	if (len >= 2 && s[0] == '[' && s[len - 1] == ']')
	{
		s++;
		len -= 2;
	}
	if (len == 0 || len >= sizeof(buf))
		return false;
	memcpy(buf, s, len);
	buf[len] = '\0';
	if (inet_pton(AF_INET, buf, out) == 1)
		*family = AF_INET;
	else if (inet_pton(AF_INET6, buf, out) == 1)
		*family = AF_INET6;
	else
		return false;
	return true;
}

/*
 * qbe_address_host: is this host an address host (see the banner)?  Its
 * family and bytes, unmapped.  inet_aton reads the old IPv4 spellings as
 * resolvers and libcurl do; only its characters are given to it, since it
 * stops at a blank and takes what came before.
 */
static bool
qbe_address_host(const char *s, size_t len, int *family, unsigned char *out)
{
	char		buf[64];
	struct in_addr v4;

	if (len > 1 && s[len - 1] == '.')
		len--;					/* "10.1.2.3." is 10.1.2.3 */
	if (!qbe_literal(s, len, family, out))
	{
		if (len == 0 || len >= sizeof(buf) || strspn(s, "0123456789abcdefABCDEFxX.") < len)
			return false;
		memcpy(buf, s, len);
		buf[len] = '\0';
		if (inet_aton(buf, &v4) == 0)
			return false;
		memcpy(out, &v4, 4);
		*family = AF_INET;
	}
	qbe_unmap(family, out);
	return true;
}

/* qbe_bits: the prefix length after a rule's '/' (len bytes), at most max */
static bool
qbe_bits(const char *s, size_t len, int max, int *bits)
{
	char		num[8];
	char	   *end;

	if (len == 0 || len >= sizeof(num) || !isdigit((unsigned char) s[0]))
		return false;
	memcpy(num, s, len);
	num[len] = '\0';
	*bits = (int) strtol(num, &end, 10);
	return *end == '\0' && *bits <= max;
}

/*
 * qbe_rule_address: an address rule; a mapped or NAT64 network of /96 or
 * more becomes its IPv4 network, as the addresses it holds are judged.
 */
static bool
qbe_rule_address(const char *s, size_t len, QbEgressRule *r)
{
	const char *slash = memchr(s, '/', len);
	size_t		alen = slash ? (size_t) (slash - s) : len;

	if (!qbe_literal(s, alen, &r->family, r->addr))
		return false;
	r->bits = r->family == AF_INET ? 32 : 128;
	if (slash != NULL && !qbe_bits(slash + 1, len - alen - 1, r->bits, &r->bits))
		return false;
	if (r->family == AF_INET6 && r->bits >= 96)
	{
		qbe_unmap(&r->family, r->addr);
		if (r->family == AF_INET)
			r->bits -= 96;
	}
	qbe_mask(r->addr, r->family == AF_INET ? 4 : 16, r->bits);
	return true;
}

/* one entry into a rule; false with err */
static bool
qbe_rule(const char *s, size_t len, QbEgressRule *r, const char *setting, char *err, size_t errlen)
{
	unsigned char addr[16];
	char		shown[INET6_ADDRSTRLEN];
	int			family;

	memset(r, 0, sizeof(*r));
	if (qbe_rule_address(s, len, r))
		return true;
	if (memchr(s, '/', len) != NULL)
		goto bad;
	if (qbe_address_host(s, len, &family, addr))
	{
		inet_ntop(family, addr, shown, sizeof(shown));
		snprintf(err, errlen, "%s: \"%.*s\" is an address in an old spelling; write it as %s",
				 setting, (int) (len > 80 ? 80 : len), s, shown);
		return false;
	}
	/* a name: letters, digits, '-', '.', and "*." only in front */
	for (size_t i = 0; i < len; i++)
	{
		unsigned char c = (unsigned char) s[i];

		if (!(isalnum(c) || c == '-' || c == '.' || (c == '*' && i == 0 && len > 2 && s[1] == '.')))
			goto bad;
	}
	r->name = strndup(s, len);
	if (r->name == NULL)
	{
		snprintf(err, errlen, "out of memory");
		return false;
	}
	for (char *p = r->name; *p; p++)
		*p = (char) tolower((unsigned char) *p);
	return true;

bad:
	snprintf(err, errlen,
			 "%s: \"%.*s\" is neither a CIDR (10.0.0.0/8, fd00::/8, 192.0.2.7) nor a host name "
			 "(hooks.example.com, *.example.com)", setting, (int) (len > 80 ? 80 : len), s);
	return false;
}

/* qb_egress_parse: see qb_egress.h. */
bool
qb_egress_parse(const char *list, const char *setting, QbEgress **out, char *err, size_t errlen)
{
	QbEgress   *e = NULL;
	const char *p = list ? list : "";
	size_t		cap = 1;

	*out = NULL;
	for (const char *q = p; *q; q++)
		cap += strchr(", \t\n", *q) != NULL;	/* every separator the loop below splits on */
	e = calloc(1, sizeof(QbEgress));
	if (e == NULL || (e->rules = calloc(cap, sizeof(QbEgressRule))) == NULL ||
		(e->setting = strdup(setting)) == NULL || (e->list = strdup(p)) == NULL)
	{
		snprintf(err, errlen, "out of memory");
		goto err;
	}
	for (;;)
	{
		size_t		len;

		p += strspn(p, ", \t\n");
		if (*p == '\0')
			break;
		len = strcspn(p, ", \t\n");
		if (!qbe_rule(p, len, &e->rules[e->nrules], setting, err, errlen))
			goto err;
		if (e->rules[e->nrules].family != 0)
			e->ncidrs++;
		else
			e->nnames++;
		e->nrules++;
		p += len;
	}
	*out = e;
	return true;

err:
	qb_egress_free(e);
	return false;
}

/* qb_egress_free: see qb_egress.h. */
void
qb_egress_free(QbEgress *e)
{
	if (e == NULL)
		return;
	for (int i = 0; i < e->nrules; i++)
		free(e->rules[i].name);
	free(e->rules);
	free(e->setting);
	free(e->list);
	free(e);
}

/* qb_egress_copy: see qb_egress.h. */
QbEgress *
qb_egress_copy(const QbEgress *e)
{
	QbEgress   *c = NULL;
	char		err[QB_ERRLEN];

	if (e == NULL || !qb_egress_parse(e->list, e->setting, &c, err, sizeof(err)))
		return NULL;
	return c;
}

/* does the name (len bytes, a trailing dot ignored) match a name rule? */
static bool
qbe_name_listed(const QbEgress *e, const char *host, size_t len)
{
	if (len > 1 && host[len - 1] == '.')
		len--;					/* "example.com." is "example.com" */
	for (int i = 0; i < e->nrules; i++)
	{
		const char *n = e->rules[i].name;
		size_t		nlen;

		if (n == NULL)
			continue;
		nlen = strlen(n);
		if (n[0] == '*')
		{
			/* "*.x.com" matches "a.x.com": the suffix ".x.com" and more before it */
			if (len > nlen - 1 && strncasecmp(host + len - (nlen - 1), n + 1, nlen - 1) == 0)
				return true;
		}
		else if (len == nlen && strncasecmp(host, n, len) == 0)
			return true;
	}
	return false;
}

/* qbe_not_listed: the refusal of a name no rule lists; false */
static bool
qbe_not_listed(const QbEgress *e, const char *name, char *why, size_t whylen)
{
	snprintf(why, whylen, "egress refused: the host %s is not among the names of %s; add it there to allow it",
			 name, e->setting);
	return false;
}

/*
 * qbe_judge: one address (family and bytes, unmapped), shown as shown in
 * messages.  name: the name it was reached by; NULL when it was written as
 * an address (or is not known).  The rules of qb_egress.h, in their order.
 */
static bool
qbe_judge(const QbEgress *e, int family, const unsigned char *addr, const char *shown,
		  const char *name, char *why, size_t whylen)
{
	for (int i = 0; i < e->nrules; i++)
		if (e->rules[i].family == family && qbe_in(addr, e->rules[i].addr, e->rules[i].bits))
			return true;
	for (int i = 0; i < QBE_NREFUSED; i++)
	{
		unsigned char net[16];

		if (qbe_refused[i].family == family &&
			inet_pton(family, qbe_refused[i].addr, net) == 1 &&
			qbe_in(addr, net, qbe_refused[i].bits))
		{
			snprintf(why, whylen,
					 "egress refused: %s is a link-local or cloud metadata address; "
					 "list it in %s to allow it", shown, e->setting);
			return false;
		}
	}
	if (e->ncidrs > 0)
	{
		snprintf(why, whylen, "egress refused: %s is in no network of %s; add it there to allow it",
				 shown, e->setting);
		return false;
	}
	if (e->nnames == 0 || (name != NULL && qbe_name_listed(e, name, strlen(name))))
		return true;
	if (name == NULL)
		snprintf(why, whylen,
				 "egress refused: %s is an address, and %s lists names only; "
				 "add the address (or a network that holds it) there to allow it",
				 shown, e->setting);
	else
		qbe_not_listed(e, name, why, whylen);
	return false;
}

/*
 * qbe_via_host: the host of one URL or "host:port" (len bytes of s), as
 * the URL reader reads it for the connection (qb_url_host), into host.
 * false with why when no host can be read (why never repeats the URL: it
 * may hold a password).
 */
static bool
qbe_via_host(const char *s, size_t len, char *host, size_t hostlen, char *why, size_t whylen)
{
	char		err[QB_ERRLEN];

	if (qb_url_host(s, len, host, hostlen, err, sizeof(err)))
		return true;
	snprintf(why, whylen, "egress refused: no host can be read from a URL of the destination: %.*s",
			 (int) (whylen > 68 ? whylen - 68 : 0), err);
	return false;
}

/* a socket address into family, bytes (unmapped) and text; false: no host (a Unix socket) */
static bool
qbe_sockaddr(const struct sockaddr *sa, int *family, unsigned char *addr, char *shown, size_t len)
{
	memset(addr, 0, 16);
	*family = sa->sa_family;
	if (*family == AF_INET)
		memcpy(addr, &((const struct sockaddr_in *) sa)->sin_addr, 4);
	else if (*family == AF_INET6)
		memcpy(addr, &((const struct sockaddr_in6 *) sa)->sin6_addr, 16);
	else
		return false;
	qbe_unmap(family, addr);
	if (inet_ntop(*family, addr, shown, (socklen_t) len) == NULL)
		snprintf(shown, len, "?");
	return true;
}

/* qb_egress_addr_ok: see qb_egress.h. */
bool
qb_egress_addr_ok(const QbEgress *e, const char *via, const struct sockaddr *sa, char *why, size_t whylen)
{
	unsigned char addr[16];
	unsigned char scratch[16];
	int			family;
	char		shown[INET6_ADDRSTRLEN];
	char		host[256];
	char		ignored[160];
	const char *name = NULL;
	int			hfamily;

	if (e == NULL)
		e = &qbe_none;
	if (!qbe_sockaddr(sa, &family, addr, shown, sizeof(shown)))
		return true;			/* a Unix socket leaves no host */
	if (via != NULL && qbe_via_host(via, strlen(via), host, sizeof(host), ignored, sizeof(ignored)) &&
		!qbe_address_host(host, strlen(host), &hfamily, scratch))
		name = host;
	return qbe_judge(e, family, addr, shown, name, why, whylen);
}

/* one host, unbracketed, as written in a destination (configure time) */
static bool
qbe_host_ok(const QbEgress *e, const char *host, size_t len, char *why, size_t whylen)
{
	unsigned char addr[16];
	int			family;
	char		shown[300];
	char		text[INET6_ADDRSTRLEN];

	if (e == NULL)
		e = &qbe_none;
	snprintf(shown, sizeof(shown), "%.*s", (int) (len > 255 ? 255 : len), host);
	if (qbe_address_host(host, len, &family, addr))
	{
		/* an old spelling is shown with the address it stands for */
		inet_ntop(family, addr, text, sizeof(text));
		if (strcmp(text, shown) != 0)
			snprintf(shown + strlen(shown), sizeof(shown) - strlen(shown), " (%s)", text);
		return qbe_judge(e, family, addr, shown, NULL, why, whylen);
	}
	if (e->nnames > 0 && !qbe_name_listed(e, host, len))
		return qbe_not_listed(e, shown, why, whylen);
	return true;
}

/* what qbe_walk does with each host */
typedef bool (*QbeHostFn) (const QbEgress *e, const char *host, size_t len, char *why, size_t whylen);

/*
 * qbe_walk: each host of a URL, a list of URLs, or kafka's
 * "host:port,host:port" (entries separated by commas and blanks), read by
 * qbe_via_host.
 */
static bool
qbe_walk(const QbEgress *e, const char *urls, QbeHostFn fn, char *why, size_t whylen)
{
	const char *p = urls;
	char		host[256];

	for (;;)
	{
		size_t		len;

		p += strspn(p, ", \t\n");
		if (*p == '\0')
			return true;
		len = strcspn(p, ", \t\n");
		if (!qbe_via_host(p, len, host, sizeof(host), why, whylen) ||
			!fn(e, host, strlen(host), why, whylen))
			return false;
		p += len;
	}
}

/* qb_egress_hosts_ok: see qb_egress.h. */
bool
qb_egress_hosts_ok(const QbEgress *e, const char *urls, char *why, size_t whylen)
{
	return qbe_walk(e, urls, qbe_host_ok, why, whylen);
}

/* every address one host resolves to, judged as its connection's would be */
static bool
qbe_resolved_ok(const QbEgress *e, const char *host, size_t len, char *why, size_t whylen)
{
	struct addrinfo hints = {.ai_socktype = SOCK_STREAM};
	struct addrinfo *res = NULL;
	char		name[256];
	bool		ok = true;

	snprintf(name, sizeof(name), "%.*s", (int) (len < sizeof(name) ? len : sizeof(name) - 1), host);
	if (getaddrinfo(name, NULL, &hints, &res) != 0)
		return true;			/* the connect will fail and say why */
	for (struct addrinfo *ai = res; ai != NULL && ok; ai = ai->ai_next)
		ok = qb_egress_addr_ok(e, name, ai->ai_addr, why, whylen);
	freeaddrinfo(res);
	return ok;
}

/* qb_egress_resolve_ok: see qb_egress.h. */
bool
qb_egress_resolve_ok(const QbEgress *e, const char *urls, char *why, size_t whylen)
{
	return qbe_walk(e, urls, qbe_resolved_ok, why, whylen);
}
