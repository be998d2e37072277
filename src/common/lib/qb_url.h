/*-------------------------------------------------------------------------
 * qb_url.h
 *	  The one URL reader: every URL of the configuration and of a
 *	  connection (amqp[s], nats and tls, http[s], sqlserver, the OTLP
 *	  endpoint, egress's hosts) is read here, by libcurl's URL API
 *	  (CURLU), so that the configuration's check, the egress check and
 *	  the connection name the same host.
 *
 * Wording:
 *	- scheme://[user[:password]@]host[:port][/path][?query]: the scheme is
 *	  ours to check (letters, digits, '+', '-', '.', one of a list); the
 *	  rest is libcurl's to read, always as "tcp://" + rest, so that no
 *	  scheme can change how its host is read.
 *	- The host: a name (letters, digits, '-', '.', '_'), an IPv4 address
 *	  in any spelling libcurl reads (it writes it back as a.b.c.d), or an
 *	  IPv6 address in brackets (returned without them; no zone id).
 *	- User, password and path are percent-decoded (%00 and a '%' without
 *	  two hex digits are refused, naming the part); the query is returned
 *	  as written, for qb_url_query_next to take apart.
 *	- A postgres:// URL's authority is libpq's to read (host lists,
 *	  Unix-socket directories, no host): with QB_URL_ANY_AUTHORITY only
 *	  the scheme and the characters are checked, and no host is returned.
 *
 * Messages name the part that is wrong and what to do, and never repeat
 * the URL (it may hold a password).  Thread safety: none needed; each
 * call touches only its arguments.
 *-------------------------------------------------------------------------
 */
#ifndef QB_URL_H
#define QB_URL_H

#include <stdbool.h>
#include <stddef.h>

/* what a URL may hold besides scheme://host[:port][/path] */
#define QB_URL_USERINFO		0x01	/* user[:password]@ */
#define QB_URL_QUERY		0x02	/* ?query */
#define QB_URL_ANY_AUTHORITY 0x04	/* the authority is the client library's
									 * (libpq): not read, no host returned */

typedef struct QbUrl
{
	char	   *scheme;			/* lower case, one of the list */
	char	   *user;			/* decoded; NULL when the URL has no '@' */
	char	   *password;		/* decoded; NULL when the user info has no ':' */
	char	   *host;			/* decoded, without brackets; NULL with
								 * QB_URL_ANY_AUTHORITY */
	int			port;			/* as written, else the scheme's default
								 * (qb_url_default_port), 0 if it has none */
	bool		port_written;
	char	   *path;			/* decoded; "/" when the URL has none */
	bool		path_one_segment;	/* no '/' after the first, as written */
	char	   *query;			/* as written; NULL when the URL has none */
} QbUrl;

/*
 * Read url, whose scheme must be one of schemes (NULL-terminated; the
 * first is the one messages show), with what flags allow.  false with err
 * naming the part that is wrong; u is then empty.  Free with qb_url_free
 * (after a failure too).
 */
extern bool qb_url_read(const char *url, const char *const *schemes, int flags,
						QbUrl *u, char *err, size_t errlen);
extern void qb_url_free(QbUrl *u);

/* The port a scheme's client uses when the URL names none; 0 if unknown. */
extern int	qb_url_default_port(const char *scheme);

/*
 * The host of one entry of a destination (len bytes of s): a URL of any
 * scheme (librdkafka's "sasl_ssl://b:9093" too), a "host[:port]" or a bare
 * IPv6 address ("::1"), read as qb_url_read reads it, into host (without
 * brackets).  false with err saying why no host can be read.
 */
extern bool qb_url_host(const char *s, size_t len, char *host, size_t hostlen,
						char *err, size_t errlen);

/*
 * Kafka's bootstrap entry (len bytes of s): [proto://]host[:port] and
 * nothing else, checked as a URL's host and port are.
 */
extern bool qb_url_hostport_check(const char *s, size_t len, char *err, size_t errlen);

/*
 * The next name=value of a query (*p moves past it and its '&'; empty
 * items are skipped): 1 with name and value decoded and malloc'd (value
 * NULL when the item has no '='), 0 at the end, -1 with err naming a bad
 * percent-encoding or out of memory.
 */
extern int	qb_url_query_next(const char **p, char **name, char **value,
							  char *err, size_t errlen);

/*
 * The next entry of a comma-separated list of URLs (a NATS server list),
 * from *next (start with the list): its start, with *len its length, or
 * NULL after the last.  An empty entry ("a,,b", "") has length 0.
 */
extern const char *qb_url_list_next(const char **next, size_t *len);

/*
 * The checks of the configuration: qb_url_read's, the URL not kept.
 * qb_url_check: an http or https URL with no user info and no query.
 */
extern bool qb_url_check_scheme(const char *url, const char *const *schemes, int flags,
								char *err, size_t errlen);
extern bool qb_url_check(const char *url, char *err, size_t errlen);

#endif							/* QB_URL_H */
