/*-------------------------------------------------------------------------
 * fuzz_url.c
 *	  libFuzzer harness: URL and connection-string parsing: qb_url_check
 *	  (HTTP destinations), qb_url_check_scheme (the broker and database
 *	  families, with and without user info and a query), qb_expand_env
 *	  (${NAME} references), qbcf_brokers_check (Kafka's bootstrap list),
 *	  qb_amqp_url_parse (RabbitMQ), qb_nats_redact (NATS server lists in
 *	  messages), the daemon's SQL Server URL (qb_odbc_url_parse,
 *	  qb_odbc_conn_string in both brace styles, qb_odbc_quote), and the one
 *	  URL reader itself (qb_url_read, qb_url_host).
 *
 * Input: the whole input is one string (it ends at a NUL), given to each.
 *
 * What must hold: a refusal has a message that never holds the marker
 * QBF_MARK when the input has it as a password (messages never repeat a
 * URL's secret), nor a variable's value; the NATS redaction drops the
 * password of a server the configuration accepts; a string without '$'
 * expands to itself; an accepted sqlserver:// URL makes a connection string
 * that reads back, as ODBC (or FreeTDS 1.3) reads it, as exactly the
 * keywords QueueBox writes, each once, with the URL's values: no part of a
 * URL can add or change a keyword.  And the reader: an accepted URL has a
 * listed scheme, a host that is a name or an address (no brackets), a port
 * 1..65535 (the scheme's default when none is written), a path from '/';
 * a refused one leaves no part; and for each scheme the host egress
 * judges (qb_url_host) is the host the connection uses: the reader's,
 * librabbitmq's, cnats's (its reading of the server qb_nats_server
 * writes), libcurl's for http(s), the ODBC connection string's.
 *-------------------------------------------------------------------------
 */
#include <arpa/inet.h>
#include <curl/curl.h>

#include "fuzz_common.h"
#include "qb_amqp.h"
#include "qb_config.h"
#include "qb_config_int.h"
#include "qb_nats.h"
#include "qb_url.h"
#include "odbc_store.h"

int			LLVMFuzzerInitialize(int *argc, char ***argv);
int			LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define QBF_MARK "S3CR3T"
#define QBF_ENV_SECRET "envsecret-q7Zp"	/* ${QBF_SECRET} */

int
LLVMFuzzerInitialize(int *argc, char ***argv)
{
	setenv("QBF_SECRET", QBF_ENV_SECRET, 1);
	setenv("QBF_HOST", "db.internal", 1);
	setenv("QBF_EMPTY", "", 1);
	return 0;
}

/*
 * qbf_has_secret: is the marker in the URL's password as libcurl's URL parser
 * reads it, and nowhere else in the input?  Then a message holding the
 * marker holds the password.
 */
static bool
qbf_has_secret(const char *url)
{
	const char *mark = strstr(url, QBF_MARK);
	CURLU	   *h;
	char	   *pw = NULL;
	bool		yes = false;

	if (mark == NULL || strstr(mark + 1, QBF_MARK) != NULL || (h = curl_url()) == NULL)
		return false;
	if (curl_url_set(h, CURLUPART_URL, url, CURLU_NON_SUPPORT_SCHEME) == CURLUE_OK &&
		curl_url_get(h, CURLUPART_PASSWORD, &pw, 0) == CURLUE_OK && pw != NULL)
		yes = strstr(pw, QBF_MARK) != NULL;
	curl_free(pw);
	curl_url_cleanup(h);
	return yes;
}

static void
qbf_no_mark(const char *url, const char *err, size_t errlen, const char *who)
{
	qbf_err_ok(err, errlen, who);
	if (err[0] == '\0')
		qbf_fail("%s refused \"%.100s\" with an empty message", who, url);
	if (qbf_has_secret(url) && strstr(err, QBF_MARK))
		qbf_fail("%s repeats a password in \"%s\"", who, err);
}

/* ---- connection strings, read back ----------------------------------- */

#define QBF_MAX_KV 24

typedef struct QbfKv
{
	int			n;
	char	   *key[QBF_MAX_KV];
	char	   *val[QBF_MAX_KV];
} QbfKv;

/*
 * qbf_kv_read: a connection string as a driver reads it: KEY=value pairs
 * separated by ';'; a value starting with '{' is braced: ODBC ends it at a
 * '}' not followed by another (and reads "}}" as '}'); FreeTDS 1.3 ends it
 * at the first "};" or a '}' at the end, keeping "}}" as it is.  false for
 * a string that does not read.
 */
static bool
qbf_kv_read(const char *s, QbOdbcBraces style, QbfKv *kv)
{
	kv->n = 0;
	while (*s)
	{
		const char *eq = strchr(s, '=');
		char	   *v;
		size_t		o = 0;

		if (eq == NULL || kv->n == QBF_MAX_KV)
			return false;
		kv->key[kv->n] = qbf_strndup((const uint8_t *) s, eq - s);
		v = malloc(strlen(eq) + 1);
		if (v == NULL)
			abort();
		kv->val[kv->n] = v;
		kv->n++;
		s = eq + 1;
		if (*s == '{')
		{
			s++;
			for (;;)
			{
				if (*s == '\0')
					return false;
				if (*s == '}')
				{
					if (style == QB_ODBC_BRACES_ODBC && s[1] == '}')
					{
						v[o++] = '}';
						s += 2;
						continue;
					}
					if (style == QB_ODBC_BRACES_ODBC || s[1] == ';' || s[1] == '\0')
					{
						s++;
						break;
					}
				}
				v[o++] = *s++;
			}
			v[o] = '\0';
			if (*s == ';')
				s++;
			else if (*s != '\0')
				return false;
		}
		else
		{
			while (*s && *s != ';')
				v[o++] = *s++;
			v[o] = '\0';
			if (*s == ';')
				s++;
		}
	}
	return true;
}

static void
qbf_kv_free(QbfKv *kv)
{
	for (int i = 0; i < kv->n; i++)
	{
		free(kv->key[i]);
		free(kv->val[i]);
	}
	kv->n = 0;
}

/* qbf_kv_expect: key is there exactly once, with value (NULL: any). */
static void
qbf_kv_expect(const QbfKv *kv, const char *key, const char *value, const char *cs)
{
	int			seen = 0;

	for (int i = 0; i < kv->n; i++)
		if (strcasecmp(kv->key[i], key) == 0)
		{
			seen++;
			if (value != NULL && strcmp(kv->val[i], value) != 0)
				qbf_fail("connection string \"%s\": %s reads \"%s\", the URL says \"%s\"",
						 cs, key, kv->val[i], value);
		}
	if (seen != 1)
		qbf_fail("connection string \"%s\": %s appears %d times", cs, key, seen);
}

static void
qbf_odbc(const char *url)
{
	QbOdbcUrl	u;
	char		err[512];

	memset(err, 'x', sizeof(err));
	if (qb_odbc_url_parse(url, &u, err, sizeof(err)) != 0)
	{
		qbf_no_mark(url, err, sizeof(err), "qb_odbc_url_parse");
		return;
	}
	for (int st = 0; st < 2; st++)
	{
		QbOdbcBraces style = st ? QB_ODBC_BRACES_FREETDS13 : QB_ODBC_BRACES_ODBC;
		char	   *cs;
		QbfKv		kv;
		char		port[16];

		memset(err, 'x', sizeof(err));
		cs = qb_odbc_conn_string(&u, "/usr/lib/x86_64-linux-gnu/odbc/libtdsodbc.so",
								 "queuebox-mssqld", style, err, sizeof(err));
		if (cs == NULL)
		{
			qbf_no_mark(url, err, sizeof(err), "qb_odbc_conn_string");
			continue;
		}
		if (!qbf_kv_read(cs, style, &kv))
			qbf_fail("connection string \"%s\" does not read back", cs);
		snprintf(port, sizeof(port), "%d", u.port);
		qbf_kv_expect(&kv, "DRIVER", NULL, cs);
		qbf_kv_expect(&kv, "SERVER", u.host, cs);
		qbf_kv_expect(&kv, "PORT", port, cs);
		qbf_kv_expect(&kv, "DATABASE", u.database, cs);
		qbf_kv_expect(&kv, "UID", u.user, cs);
		qbf_kv_expect(&kv, "PWD", u.password ? u.password : "", cs);
		qbf_kv_expect(&kv, "TDS_Version", "7.4", cs);
		qbf_kv_expect(&kv, "ClientCharset", "UTF-8", cs);
		qbf_kv_expect(&kv, "Encryption", u.encryption, cs);
		qbf_kv_expect(&kv, "APP", "queuebox-mssqld", cs);
		if (kv.n != 10)
			qbf_fail("connection string \"%s\" has %d keywords, not 10", cs, kv.n);
		qbf_kv_free(&kv);
		free(cs);
	}
	qb_odbc_url_free(&u);
}

/* qbf_quote: qb_odbc_quote's value reads back as itself. */
static void
qbf_quote(const char *value)
{
	for (int st = 0; st < 2; st++)
	{
		QbOdbcBraces style = st ? QB_ODBC_BRACES_FREETDS13 : QB_ODBC_BRACES_ODBC;
		size_t		need = qb_odbc_quote(value, style, st == 0, NULL, 0);
		char	   *q;
		char	   *cs;
		QbfKv		kv;

		if (need == (size_t) -1)
			continue;
		q = malloc(need + 1);
		if (q == NULL)
			abort();
		if (qb_odbc_quote(value, style, st == 0, q, need + 1) != need || strlen(q) != need)
			qbf_fail("qb_odbc_quote: the length it says is not the length it writes");
		cs = malloc(need + 16);
		if (cs == NULL)
			abort();
		snprintf(cs, need + 16, "K=%s;Z=z", q);
		if (!qbf_kv_read(cs, style, &kv) || kv.n != 2 || strcmp(kv.val[0], value) != 0 ||
			strcmp(kv.key[1], "Z") != 0)
			qbf_fail("qb_odbc_quote(\"%s\") = \"%s\" does not read back as itself (style %d)",
					 value, q, st);
		qbf_kv_free(&kv);
		free(cs);
		free(q);
	}
}

/* ---- the one URL reader (qb_url.h): its invariants, and one host ------ */

/* qbf_cnats_host: the host cnats 3.4 reads from a server URL (its url.c, in brief) */
static void
qbf_cnats_host(const char *server, char *host, size_t hostlen)
{
	const char *p = strstr(server, "://");
	const char *at;
	const char *rb;
	const char *colon;

	p = p != NULL ? p + 3 : server;
	if ((at = strrchr(p, '@')) != NULL)
		p = at + 1;
	rb = strrchr(p, ']');
	colon = strrchr(rb != NULL ? rb : p, ':');
	snprintf(host, hostlen, "%.*s", (int) (colon != NULL ? colon - p : (long) strlen(p)), p);
	if (host[0] == '[' && host[strlen(host) - 1] == ']')
	{
		memmove(host, host + 1, strlen(host));
		host[strlen(host) - 1] = '\0';
	}
}

/* qbf_curl_host: libcurl's own host of an http(s) URL, as it connects (brackets dropped) */
static bool
qbf_curl_host(const char *url, char *host, size_t hostlen)
{
	CURLU	   *h = curl_url();
	char	   *v = NULL;
	bool		ok = false;

	if (h != NULL && curl_url_set(h, CURLUPART_URL, url, 0) == CURLUE_OK &&
		curl_url_get(h, CURLUPART_HOST, &v, CURLU_URLDECODE) == CURLUE_OK)
	{
		size_t		n = strlen(v);

		if (n >= 2 && v[0] == '[')
			snprintf(host, hostlen, "%.*s", (int) n - 2, v + 1);
		else
			snprintf(host, hostlen, "%s", v);
		ok = true;
	}
	curl_free(v);
	curl_url_cleanup(h);
	return ok;
}

/* qbf_reader_parts: what qb_url_read promises of an accepted URL */
static void
qbf_reader_parts(const char *url, const QbUrl *u, const char *const *schemes)
{
	unsigned char addr[16];
	bool		known = false;

	for (int i = 0; schemes[i] != NULL; i++)
		known |= strcmp(u->scheme, schemes[i]) == 0;
	if (!known)
		qbf_fail("qb_url_read(\"%s\"): scheme \"%s\" is not one of the list", url, u->scheme);
	if (u->host == NULL || u->host[0] == '\0' || u->host[0] == '[')
		qbf_fail("qb_url_read(\"%s\"): host \"%s\"", url, u->host ? u->host : "(null)");
	if (strspn(u->host, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._") != strlen(u->host) &&
		inet_pton(AF_INET6, u->host, addr) != 1)
		qbf_fail("qb_url_read(\"%s\"): host \"%s\" is neither a name nor an address", url, u->host);
	if (u->port < 1 || u->port > 65535 || (!u->port_written && u->port != qb_url_default_port(u->scheme)))
		qbf_fail("qb_url_read(\"%s\"): port %d", url, u->port);
	if (u->path == NULL || u->path[0] != '/')
		qbf_fail("qb_url_read(\"%s\"): path \"%s\"", url, u->path ? u->path : "(null)");
	if (u->password != NULL && u->user == NULL)
		qbf_fail("qb_url_read(\"%s\"): a password without a user", url);
}

/*
 * qbf_one_host: egress's host of url (qb_url_host) is the host the
 * connection of its scheme uses: the reader's, librabbitmq's (from
 * qb_amqp_url_parse), cnats's (from the server qb_nats_server writes),
 * libcurl's for http(s), the ODBC connection string's SERVER.
 */
static void
qbf_one_host(const char *url, const QbUrl *u)
{
	char		egress[256];
	char		conn[256] = "";
	char		err[512];
	const char *who = "qb_url_read";

	if (!qb_url_host(url, strlen(url), egress, sizeof(egress), err, sizeof(err)))
		qbf_fail("egress reads no host from \"%s\" (%s), the reader reads \"%s\"", url, err, u->host);
	snprintf(conn, sizeof(conn), "%s", u->host);
	if (strncmp(u->scheme, "amqp", 4) == 0)
	{
		QbAmqpUrl	au;

		who = "qb_amqp_url_parse";
		if (qb_amqp_url_parse(url, &au, err, sizeof(err)))
			snprintf(conn, sizeof(conn), "%s", au.host);
		qb_amqp_url_free(&au);
	}
	else if (strcmp(u->scheme, "nats") == 0 || strcmp(u->scheme, "tls") == 0)
	{
		char	   *server = qb_nats_server(url, strlen(url), err, sizeof(err));

		who = "cnats";
		if (server != NULL)
			qbf_cnats_host(server, conn, sizeof(conn));
		free(server);
	}
	else if (strncmp(u->scheme, "http", 4) == 0)
	{
		who = "libcurl";
		if (!qbf_curl_host(url, conn, sizeof(conn)))
			qbf_fail("libcurl refuses \"%s\", which the reader reads", url);
	}
	else if (strcmp(u->scheme, "sqlserver") == 0)
	{
		QbOdbcUrl	ou;

		who = "qb_odbc_url_parse";
		if (qb_odbc_url_parse(url, &ou, err, sizeof(err)) == 0)
			snprintf(conn, sizeof(conn), "%s", ou.host);
		qb_odbc_url_free(&ou);
	}
	if (strcmp(egress, conn) != 0 || strcmp(egress, u->host) != 0)
		qbf_fail("\"%s\": egress judges host \"%s\", %s connects to \"%s\" (the reader: \"%s\")",
				 url, egress, who, conn, u->host);
}

static void
qbf_reader(const char *url)
{
	static const char *const all[] = {"amqp", "amqps", "nats", "tls", "http", "https", "sqlserver", NULL};
	QbUrl		u;
	char		err[512];

	memset(err, 'x', sizeof(err));
	if (!qb_url_read(url, all, QB_URL_USERINFO | QB_URL_QUERY, &u, err, sizeof(err)))
	{
		qbf_no_mark(url, err, sizeof(err), "qb_url_read");
		if (u.scheme != NULL || u.host != NULL || u.user != NULL || u.password != NULL)
			qbf_fail("qb_url_read refused \"%s\" but left parts", url);
		return;
	}
	qbf_reader_parts(url, &u, all);
	qbf_one_host(url, &u);
	qb_url_free(&u);
}

/* ---- the rest --------------------------------------------------------- */

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const char *const amqp[] = {"amqp", "amqps", NULL};
	static const char *const nats[] = {"nats", "tls", NULL};
	static const char *const db[] = {"postgres", "postgresql", "sqlserver", NULL};
	char	   *url = qbf_strndup(data, size);
	char		err[512];
	char	   *x;
	QbAmqpUrl	au;
	bool		nats_ok = false;

	memset(err, 'x', sizeof(err));
	if (!qb_url_check(url, err, sizeof(err)))
		qbf_no_mark(url, err, sizeof(err), "qb_url_check");
	for (int f = 0; f < 4; f++)
	{
		memset(err, 'x', sizeof(err));
		if (!qb_url_check_scheme(url, f & 1 ? nats : amqp, f, err, sizeof(err)))
			qbf_no_mark(url, err, sizeof(err), "qb_url_check_scheme");
		else if (f == 1)
			nats_ok = true;		/* a server the configuration accepts */
	}
	/* the database URL: sqlserver:// (one host), postgres:// (its hosts are libpq's) */
	for (int f = 0; f < 2; f++)
	{
		memset(err, 'x', sizeof(err));
		if (!qb_url_check_scheme(url, db, QB_URL_USERINFO | QB_URL_QUERY | (f ? QB_URL_ANY_AUTHORITY : 0),
								 err, sizeof(err)))
			qbf_no_mark(url, err, sizeof(err), "qb_url_check_scheme");
	}

	memset(err, 'x', sizeof(err));
	x = qb_expand_env(url, NULL, err, sizeof(err));
	if (x == NULL)
	{
		qbf_err_ok(err, sizeof(err), "qb_expand_env");
		if (strstr(err, QBF_ENV_SECRET) && !strstr(url, QBF_ENV_SECRET))
			qbf_fail("qb_expand_env repeats a variable's value in \"%s\"", err);
	}
	else if (strchr(url, '$') == NULL && strcmp(x, url) != 0)
		qbf_fail("qb_expand_env(\"%s\") = \"%s\" without a reference", url, x);
	free(x);

	memset(err, 'x', sizeof(err));
	if (!qbcf_brokers_check(url, err, sizeof(err)))
		qbf_no_mark(url, err, sizeof(err), "qbcf_brokers_check");

	memset(&au, 0, sizeof(au));
	memset(err, 'x', sizeof(err));
	if (!qb_amqp_url_parse(url, &au, err, sizeof(err)))
		qbf_no_mark(url, err, sizeof(err), "qb_amqp_url_parse");
	else if (au.host == NULL || au.port < 1 || au.port > 65535 || au.vhost == NULL)
		qbf_fail("qb_amqp_url_parse accepted \"%s\" without a host, port or vhost", url);
	qb_amqp_url_free(&au);

	{
		char		red[256];
		const char *at = strchr(url, '@');

		qb_nats_redact(url, red, sizeof(red));
		if (memchr(red, '\0', sizeof(red)) == NULL)
			qbf_fail("qb_nats_redact: not NUL-terminated");
		if (nats_ok && at != NULL && strchr(at + 1, '@') == NULL && qbf_has_secret(url) &&
			strstr(red, QBF_MARK))
			qbf_fail("qb_nats_redact(\"%s\") keeps the password: \"%s\"", url, red);
	}

	qbf_odbc(url);
	qbf_quote(url);
	qbf_reader(url);
	free(url);
	return 0;
}
