/*-------------------------------------------------------------------------
 * qb_egress.c
 *	  Egress rules: parse a policy, judge a host and an address (see
 *	  qb_egress.h for the rules).
 *
 * Vocabulary: an entry is one item of the list; a rule is its parsed form;
 * the refused set is the link-local and metadata networks refused unless a
 * listed CIDR contains them.  Thread safety: parsing and judging touch only
 * their arguments; qb_egress_set publishes a new policy with one atomic
 * store and never frees the old one (librdkafka's threads may be reading it).
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

static QbEgress qbe_none = {NULL, 0, 0, 0, (char *) "queuebox.allowed_destinations", (char *) ""};
static QbEgress *volatile qbe_current = &qbe_none;
static volatile bool qbe_owned = false;

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
 * An address literal ("10.1.2.3", "::1", "[::1]") into family and bytes;
 * an IPv4-mapped IPv6 address becomes its IPv4 address.
 */
static bool
qbe_literal(const char *s, size_t len, int *family, unsigned char *out)
{
	char		buf[64];

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
	{
		*family = AF_INET;
		return true;
	}
	if (inet_pton(AF_INET6, buf, out) != 1)
		return false;
	*family = AF_INET6;
	if (memcmp(out, "\0\0\0\0\0\0\0\0\0\0\xff\xff", 12) == 0)
	{
		memmove(out, out + 12, 4);
		*family = AF_INET;
	}
	return true;
}

/* one entry into a rule; false with err */
static bool
qbe_rule(const char *s, size_t len, QbEgressRule *r, const char *setting, char *err, size_t errlen)
{
	const char *slash = memchr(s, '/', len);
	size_t		alen = slash ? (size_t) (slash - s) : len;
	int			max;

	memset(r, 0, sizeof(*r));
	if (qbe_literal(s, alen, &r->family, r->addr))
	{
		max = r->family == AF_INET ? 32 : 128;
		r->bits = max;
		if (slash != NULL)
		{
			char	   *end;
			char		num[8];
			size_t		nlen = len - alen - 1;

			if (nlen == 0 || nlen >= sizeof(num))
				goto bad;
			memcpy(num, slash + 1, nlen);
			num[nlen] = '\0';
			r->bits = (int) strtol(num, &end, 10);
			if (*end != '\0' || !isdigit((unsigned char) num[0]) || r->bits > max)
				goto bad;
		}
		qbe_mask(r->addr, max / 8, r->bits);
		return true;
	}
	if (slash != NULL)
		goto bad;
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
		cap += (*q == ',' || *q == ' ');
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
	if (e == NULL || e == &qbe_none)
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
	char		err[300];

	if (e == NULL || !qb_egress_parse(e->list, e->setting, &c, err, sizeof(err)))
		return NULL;
	return c;
}

/* the address judged: family and bytes, already unmapped */
static bool
qbe_judge(const QbEgress *e, int family, const unsigned char *addr, const char *shown,
		  char *why, size_t whylen)
{
	bool		listed = false;

	if (e == NULL)
		e = qb_egress_current();
	for (int i = 0; i < e->nrules && !listed; i++)
		listed = e->rules[i].family == family && qbe_in(addr, e->rules[i].addr, e->rules[i].bits);
	if (listed)
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
	return true;
}

/* qb_egress_addr_ok: see qb_egress.h. */
bool
qb_egress_addr_ok(const QbEgress *e, const struct sockaddr *sa, char *why, size_t whylen)
{
	unsigned char addr[16];
	int			family = sa->sa_family;
	char		shown[INET6_ADDRSTRLEN];

	if (family == AF_INET)
		memcpy(addr, &((const struct sockaddr_in *) sa)->sin_addr, 4);
	else if (family == AF_INET6)
	{
		memcpy(addr, &((const struct sockaddr_in6 *) sa)->sin6_addr, 16);
		if (memcmp(addr, "\0\0\0\0\0\0\0\0\0\0\xff\xff", 12) == 0)
		{
			memmove(addr, addr + 12, 4);
			family = AF_INET;
		}
	}
	else
		return true;			/* a Unix socket leaves no host */
	if (inet_ntop(family, addr, shown, sizeof(shown)) == NULL)
		snprintf(shown, sizeof(shown), "?");
	return qbe_judge(e, family, addr, shown, why, whylen);
}

/* does the name match a name rule? */
static bool
qbe_name_listed(const QbEgress *e, const char *host, size_t len)
{
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

/* one host (len bytes, maybe "[v6]") */
static bool
qbe_host_ok(const QbEgress *e, const char *host, size_t len, char *why, size_t whylen)
{
	unsigned char addr[16];
	int			family;
	char		shown[270];

	if (e == NULL)
		e = qb_egress_current();
	snprintf(shown, sizeof(shown), "%.*s", (int) (len > 255 ? 255 : len), host);
	if (qbe_literal(host, len, &family, addr))
		return qbe_judge(e, family, addr, shown, why, whylen);
	if (len > 0 && host[len - 1] == '.')
		len--;					/* "example.com." is "example.com" */
	if (e->nnames > 0 && !qbe_name_listed(e, host, len))
	{
		snprintf(why, whylen, "egress refused: the host %s is not among the names of %s; add it there to allow it",
				 shown, e->setting);
		return false;
	}
	return true;
}

/* qb_egress_host_ok: see qb_egress.h. */
bool
qb_egress_host_ok(const QbEgress *e, const char *host, char *why, size_t whylen)
{
	return qbe_host_ok(e, host, strlen(host), why, whylen);
}

/* what qbe_walk does with each host */
typedef bool (*QbeHostFn) (const QbEgress *e, const char *host, size_t len, char *why, size_t whylen);

/*
 * qbe_walk: each host of a URL, a comma list of URLs, or kafka's
 * "host:port,host:port" (user info, port and path dropped, "[v6]" kept).
 */
static bool
qbe_walk(const QbEgress *e, const char *urls, QbeHostFn fn, char *why, size_t whylen)
{
	const char *p = urls;

	for (;;)
	{
		size_t		len = strcspn(p, ",");
		const char *end = p + len;
		const char *h = p;
		const char *sep;
		const char *at = NULL;
		size_t		hlen;

		sep = strstr(h, "://");
		if (sep != NULL && sep < end)
			h = sep + 3;
		/* userinfo ends at the last '@' before the path */
		hlen = strcspn(h, "/?#,");
		for (const char *q = h; q < h + hlen; q++)
			if (*q == '@')
				at = q;
		if (at != NULL)
		{
			hlen -= (size_t) (at + 1 - h);
			h = at + 1;
		}
		if (hlen > 0 && h[0] == '[')
		{
			const char *close = memchr(h, ']', hlen);

			hlen = close ? (size_t) (close - h + 1) : hlen;
		}
		else
		{
			const char *colon = memchr(h, ':', hlen);

			if (colon != NULL)
				hlen = (size_t) (colon - h);
		}
		if (hlen > 0 && !fn(e, h, hlen, why, whylen))
			return false;
		if (*end == '\0')
			return true;
		p = end + 1;
	}
}

/* qb_egress_hosts_ok: see qb_egress.h. */
bool
qb_egress_hosts_ok(const QbEgress *e, const char *urls, char *why, size_t whylen)
{
	return qbe_walk(e, urls, qbe_host_ok, why, whylen);
}

/* every address one host resolves to */
static bool
qbe_resolved_ok(const QbEgress *e, const char *host, size_t len, char *why, size_t whylen)
{
	struct addrinfo hints = {.ai_socktype = SOCK_STREAM};
	struct addrinfo *res = NULL;
	char		name[256];
	bool		ok = true;
	int			rc;

	if (len >= 2 && host[0] == '[')
	{
		host++;
		len -= 2;
	}
	snprintf(name, sizeof(name), "%.*s", (int) (len < sizeof(name) ? len : sizeof(name) - 1), host);
	if ((rc = getaddrinfo(name, NULL, &hints, &res)) != 0)
		return true;			/* the connect will fail and say why */
	for (struct addrinfo *ai = res; ai != NULL && ok; ai = ai->ai_next)
		ok = qb_egress_addr_ok(e, ai->ai_addr, why, whylen);
	freeaddrinfo(res);
	return ok;
}

/* qb_egress_resolve_ok: see qb_egress.h. */
bool
qb_egress_resolve_ok(const QbEgress *e, const char *urls, char *why, size_t whylen)
{
	return qbe_walk(e, urls, qbe_resolved_ok, why, whylen);
}

/* qb_egress_set: see qb_egress.h. */
bool
qb_egress_set(const char *list, const char *setting, char *err, size_t errlen)
{
	QbEgress   *e;

	if (!qb_egress_parse(list, setting, &e, err, errlen))
		return false;
	__atomic_store_n(&qbe_current, e, __ATOMIC_RELEASE);
	qbe_owned = true;
	return true;
}

/* qb_egress_host_owned: see qb_egress.h. */
bool
qb_egress_host_owned(void)
{
	return qbe_owned;
}

/* qb_egress_current: see qb_egress.h. */
const QbEgress *
qb_egress_current(void)
{
	return __atomic_load_n(&qbe_current, __ATOMIC_ACQUIRE);
}
