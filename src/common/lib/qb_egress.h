/*-------------------------------------------------------------------------
 * qb_egress.h
 *	  Egress rules: where a destination may connect (docs/operations.md,
 *	  "Egress rules").
 *
 * A policy is a list of entries, each a CIDR ("10.0.0.0/8", "fd00::/8", an
 * address alone is /32 or /128) or a host name ("hooks.example.com", or
 * "*.example.com" for the names under it).  An address is judged, in order:
 *	1. inside a listed CIDR: allowed;
 *	2. link-local or cloud metadata (169.254.0.0/16, fe80::/10,
 *	   fd00:ec2::254, 100.100.100.200): refused;
 *	3. the policy lists a CIDR: refused (it is in none);
 *	4. the policy lists names only: allowed when it was reached through a
 *	   listed name, refused when it was written as an address (a URL's
 *	   host of "10.1.2.3", "[::1]", or an old spelling such as "2130706433");
 *	5. no policy: allowed.
 * IPv4-mapped (::ffff:a.b.c.d) and NAT64 (64:ff9b::a.b.c.d) addresses are
 * judged as the IPv4 address they carry.  Two checks use it:
 *	- a destination's hosts, when the configuration is validated: an
 *	  address host is judged as above; a name must be listed when the
 *	  policy lists any name (names are not resolved then);
 *	- every address actually connected to (after DNS, so a name cannot be
 *	  re-pointed around the rules), with the URL or "host:port" it was
 *	  reached through (its via), so that rule 4 holds at connect time too
 *	  (a policy narrowed after the configuration was stored).
 * Hosts are read from URLs by the one URL reader (qb_url.h), which the
 * connections read them with: the host connected to is the one judged.
 *
 * Rules are plain values: which ones judge a connection (a document's
 * egress.allow, or the host's queuebox.allowed_destinations as it is now)
 * is the caller's to say (qb_egress_policy.h); NULL is the default rules
 * (no list).
 *-------------------------------------------------------------------------
 */
#ifndef QB_EGRESS_H
#define QB_EGRESS_H

#include <stdbool.h>
#include <stddef.h>

struct sockaddr;				/* <sys/socket.h>, not included: its names are
								 * common words (accept, connect) */

typedef struct QbEgressRule
{
	int			family;			/* AF_INET, AF_INET6, or 0 for a name */
	unsigned char addr[16];		/* network address, host bits zero */
	int			bits;			/* prefix length */
	char	   *name;			/* lower case; "*.x" matches names under x */
} QbEgressRule;

typedef struct QbEgress
{
	QbEgressRule *rules;
	int			nrules;
	int			ncidrs;			/* rules with a family */
	int			nnames;			/* rules that are names */
	char	   *setting;		/* what to change: the GUC or the key path */
	char	   *list;			/* the text parsed, for qb_egress_copy */
} QbEgress;

/*
 * Parse a list: entries separated by commas and/or blanks (a YAML list is
 * joined with commas first).  NULL or empty: a list of no entry (the
 * default rules), no error.  On a bad
 * entry returns false with err naming it and what is allowed.
 */
extern bool qb_egress_parse(const char *list, const char *setting, QbEgress **out,
							char *err, size_t errlen);
extern void qb_egress_free(QbEgress *e);

/*
 * A copy that outlives e's configuration (a broker connection kept across
 * reloads); NULL for NULL (the host's rules) or out of memory (then the
 * host's rules judge: never wider than the default).
 */
extern QbEgress *qb_egress_copy(const QbEgress *e);

/*
 * May a connection go to this address?  via: the URL, "host:port" or host
 * it was made for (its host is the name rule 4 looks for), NULL when not
 * known (then only an address listed in a CIDR passes a names-only
 * policy).  false with why set ("... 169.254.169.254 is a link-local or
 * cloud metadata address; list it in queuebox.allowed_destinations to
 * allow it").  e NULL: the default rules.
 */
extern bool qb_egress_addr_ok(const QbEgress *e, const char *via, const struct sockaddr *sa,
							  char *why, size_t whylen);

/*
 * The hosts of a URL ("scheme://[user@]host[:port][/...]"), of a list of
 * them (commas or blanks between), or of kafka's "host:port,host:port":
 * may a destination name each (a name or an address host, "[v6]" too)?
 * false with why naming the first refused host, or saying that a URL has
 * no host the reader (qb_url.h) can read.
 */
extern bool qb_egress_hosts_ok(const QbEgress *e, const char *urls, char *why, size_t whylen);

/*
 * Every address each host of urls resolves to, judged as a connection's
 * would be: for a client library that lets no one see the address it
 * connects to (cnats).  DNS may answer differently a moment later; a host
 * that does not resolve passes (its connect fails and says why).
 */
extern bool qb_egress_resolve_ok(const QbEgress *e, const char *urls, char *why, size_t whylen);

#endif							/* QB_EGRESS_H */
