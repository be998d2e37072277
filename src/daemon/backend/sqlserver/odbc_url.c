/*-------------------------------------------------------------------------
 * odbc_url.c
 *	  sqlserver:// URLs into DSN-less FreeTDS connection strings.
 *
 * Wording:
 *	- The URL is read by the one URL reader (qb_url.h, libcurl's URL API),
 *	  its user, password, path and query values percent-decoded.  Query
 *	  keys: encrypt and odbcDriver;
 *	  any other key is refused by name, so a typo never silently weakens
 *	  the connection.
 *	- A connection string is KEY=value pairs separated by ';'.  A value that
 *	  holds ';', '{', '}' or '=' (or starts or ends with a space) goes in
 *	  braces with each '}' doubled, as ODBC says; a password is always
 *	  braced, so what it holds never matters.
 *	- FreeTDS before 1.4 reads braces its own way: a braced value ends at
 *	  the first "};" and "}}" stays two characters.  For such a driver
 *	  (qb_odbc_braces_for reads its version) a '}' is not doubled, and a
 *	  value holding "};" or ending in '}' cannot be written: refused with
 *	  what to do, never sent to be misread.
 *
 * Secrets: the password is only ever in the returned connection string;
 * error messages name the part that is wrong, never its value.
 *-------------------------------------------------------------------------
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>

#include "odbc_store.h"
#include "qb_url.h"

/* qbou_option: one name=value of the query (value "" when it has no '='); 0 or -1 */
static int
qbou_option(QbOdbcUrl *u, const char *key, char **val, char *err, size_t errlen)
{
	if (strcmp(key, "encrypt") == 0)
	{
		if (strcmp(*val, "true") == 0 || strcmp(*val, "require") == 0)
			u->encryption = "require";
		else if (strcmp(*val, "request") == 0)
			u->encryption = "request";
		else if (strcmp(*val, "false") == 0 || strcmp(*val, "off") == 0)
			u->encryption = "off";
		else
		{
			snprintf(err, errlen,
					 "database.url: encrypt=%.40s is not a choice: use encrypt=true (TLS required, the default), "
					 "encrypt=request (TLS when the server offers it) or encrypt=false", *val);
			return -1;
		}
		return 0;
	}
	if (strcmp(key, "odbcDriver") == 0 && (*val)[0] != '\0')
	{
		free(u->driver);
		u->driver = *val;
		*val = NULL;
		return 0;
	}
	snprintf(err, errlen,
			 "database.url: unknown option \"%.40s\" in the query; a sqlserver:// URL takes encrypt and odbcDriver, "
			 "e.g. sqlserver://queuebox:${MSSQL_PASSWORD}@db.internal:1433/app?encrypt=true", key);
	return -1;
}

/* qbou_query: the query's keys, one at a time (qb_url_query_next). */
static int
qbou_query(const char *q, QbOdbcUrl *u, char *err, size_t errlen)
{
	char	   *key;
	char	   *val;
	char		why[QB_ERRLEN];
	int			got;

	while (q != NULL && (got = qb_url_query_next(&q, &key, &val, why, sizeof(why))) != 0)
	{
		int			rc = -1;

		if (got < 0)
			snprintf(err, errlen, "database.url: %s", why);
		else if (val == NULL && (val = strdup("")) == NULL)
			snprintf(err, errlen, "database.url: out of memory");
		else
			rc = qbou_option(u, key, &val, err, errlen);
		free(key);
		free(val);
		if (rc != 0)
			return -1;
	}
	return 0;
}

/* qbou_parts: the URL's user, host and database, each needed */
static int
qbou_parts(QbOdbcUrl *u, QbUrl *parts, char *err, size_t errlen)
{
	const char *path = parts->path;

	u->user = parts->user;
	u->password = parts->password;
	u->host = parts->host;
	parts->user = parts->password = parts->host = NULL;
	u->port = parts->port;
	if (u->user == NULL || u->user[0] == '\0')
	{
		snprintf(err, errlen,
				 "database.url: no user; SQL Server logins need one: sqlserver://queuebox:${MSSQL_PASSWORD}@%s:%d/app",
				 u->host, u->port);
		return -1;
	}
	if (path[0] != '/' || path[1] == '\0' || strchr(path + 1, '/') != NULL)
	{
		snprintf(err, errlen,
				 "database.url: no database; name it as the path: sqlserver://%s@%s:%d/app",
				 u->user, u->host, u->port);
		return -1;
	}
	if ((u->database = strdup(path + 1)) == NULL)
	{
		snprintf(err, errlen, "database.url: out of memory");
		return -1;
	}
	return 0;
}

/* qb_odbc_url_parse: see odbc_store.h; the URL read by qb_url_read. */
int
qb_odbc_url_parse(const char *url, QbOdbcUrl *u, char *err, size_t errlen)
{
	static const char *const schemes[] = {"sqlserver", NULL};
	QbUrl		parts;
	char		why[QB_ERRLEN];
	int			rc = -1;

	memset(u, 0, sizeof(*u));
	u->port = 1433;
	u->encryption = "require";
	if (url == NULL || strncmp(url, "sqlserver://", 12) != 0)
	{
		snprintf(err, errlen, "database.url: not a sqlserver:// URL");
		return -1;
	}
	if (!qb_url_read(url, schemes, QB_URL_USERINFO | QB_URL_QUERY, &parts, why, sizeof(why)))
		snprintf(err, errlen, "database.url: %s", why);
	else if (qbou_parts(u, &parts, err, errlen) == 0 && qbou_query(parts.query, u, err, errlen) == 0)
		rc = 0;
	qb_url_free(&parts);
	if (rc != 0)
		qb_odbc_url_free(u);
	return rc;
}

void
qb_odbc_url_free(QbOdbcUrl *u)
{
	free(u->user);
	free(u->password);
	free(u->host);
	free(u->database);
	free(u->driver);
	memset(u, 0, sizeof(*u));
}

/* qb_odbc_quote: see odbc_store.h. */
size_t
qb_odbc_quote(const char *value, QbOdbcBraces style, bool always, char *out, size_t outlen)
{
	size_t		n = strlen(value);
	bool		brace = always || (n > 0 && (value[0] == ' ' || value[n - 1] == ' '));
	size_t		need = 0;

	for (const char *p = value; *p; p++)
		brace |= *p == ';' || *p == '{' || *p == '}' || *p == '=';
	if (!brace)
	{
		if (outlen > 0)
			snprintf(out, outlen, "%s", value);
		return n;
	}
	/* FreeTDS 1.3 ends a braced value at the first "};" and reads "}}" as two */
	if (style == QB_ODBC_BRACES_FREETDS13 && (strstr(value, "};") != NULL || (n > 0 && value[n - 1] == '}')))
		return (size_t) -1;
#define QBOU_PUT(ch) do { if (need + 1 < outlen) out[need] = (ch); need++; } while (0)
	QBOU_PUT('{');
	for (const char *p = value; *p; p++)
	{
		QBOU_PUT(*p);
		if (*p == '}' && style == QB_ODBC_BRACES_ODBC)
			QBOU_PUT('}');
	}
	QBOU_PUT('}');
#undef QBOU_PUT
	if (outlen > 0)
		out[need < outlen ? need : outlen - 1] = '\0';
	return need;
}

/*
 * qbou_add: ";KEY=value" (the first without ';'), the value quoted in
 * style (always braced with always).  0, -1 out of memory, -2 when the
 * style cannot write the value.
 */
static int
qbou_add(char **buf, size_t *len, const char *key, const char *value, QbOdbcBraces style,
		 bool always)
{
	size_t		vlen = qb_odbc_quote(value, style, always, NULL, 0);
	size_t		klen = strlen(key);
	char	   *nb;
	char	   *p;

	if (vlen == (size_t) -1)
		return -2;
	if ((nb = realloc(*buf, *len + klen + vlen + 3)) == NULL)
		return -1;
	*buf = nb;
	p = nb + *len;
	if (*len > 0)
		*p++ = ';';
	memcpy(p, key, klen);
	p += klen;
	*p++ = '=';
	qb_odbc_quote(value, style, always, p, vlen + 1);
	*len = strlen(nb);
	return 0;
}

/* qbou_registered: one braced name ("{FreeTDS}"): no brace inside, '}' last */
static bool
qbou_registered(const char *driver)
{
	size_t		n = strlen(driver);

	return n >= 2 && driver[0] == '{' && driver[n - 1] == '}' &&
		strpbrk(driver + 1, "{}") == driver + n - 1;
}

/* qb_odbc_conn_string: see odbc_store.h. */
char *
qb_odbc_conn_string(const QbOdbcUrl *u, const char *default_driver, const char *application_name,
					QbOdbcBraces style, char *err, size_t errlen)
{
	char	   *buf = NULL;
	size_t		len = 0;
	char		port[16];
	const char *driver = u->driver ? u->driver : default_driver;
	struct
	{
		const char *key;
		const char *value;
		bool		always;
	}			kv[] = {
		{"SERVER", u->host, false},
		{"PORT", port, false},
		{"DATABASE", u->database, false},
		{"UID", u->user, false},
		/* braced whatever it holds: no password can add a keyword */
		{"PWD", u->password ? u->password : "", true},
		{"TDS_Version", "7.4", false},
		{"ClientCharset", "UTF-8", false},
		{"Encryption", u->encryption, false},
		{"APP", application_name, false},
	};

	snprintf(port, sizeof(port), "%d", u->port);
	/*
	 * a registered driver name comes braced already ("{FreeTDS}"): as it is.
	 * Anything else is quoted: "{FreeTDS" as it is would brace every
	 * keyword after it into the driver's name (fuzz_url).
	 */
	if (qbou_registered(driver))
	{
		if ((buf = malloc(strlen(driver) + 8)) == NULL)
			goto oom;
		snprintf(buf, strlen(driver) + 8, "DRIVER=%s", driver);
		len = strlen(buf);
	}
	else if (style == QB_ODBC_BRACES_FREETDS13 && strchr(driver, '}') != NULL)
	{
		/*
		 * the driver manager reads DRIVER as ODBC says, FreeTDS 1.3 its own
		 * way: with a '}' in it no spelling reads the same to both (fuzz_url)
		 */
		snprintf(err, errlen,
				 "database.url: the odbcDriver holds \"}\", which FreeTDS before 1.4 and the ODBC driver manager "
				 "read differently in a connection string; use a path without braces, or FreeTDS 1.4 or later");
		return NULL;
	}
	else if (qbou_add(&buf, &len, "DRIVER", driver, QB_ODBC_BRACES_ODBC, false) != 0)
		goto oom;
	for (size_t i = 0; i < sizeof(kv) / sizeof(kv[0]); i++)
	{
		int			rc;

		if (kv[i].value == NULL)
			continue;
		if ((rc = qbou_add(&buf, &len, kv[i].key, kv[i].value, style, kv[i].always)) == -1)
			goto oom;
		if (rc == -2)
		{
			snprintf(err, errlen,
					 "database.url: the %s holds \"};\" or ends with \"}\", which FreeTDS before 1.4 cannot read "
					 "in a connection string; choose another, or install FreeTDS 1.4 or later",
					 strcmp(kv[i].key, "PWD") == 0 ? "password" : kv[i].key);
			free(buf);
			return NULL;
		}
	}
	return buf;
oom:
	free(buf);
	snprintf(err, errlen, "out of memory");
	return NULL;
}

/*
 * qb_odbc_freetds_version: the version a FreeTDS library says it is, from
 * the "freetds vX.Y" text every build carries (it exports no function that
 * tells); 0 when it is not FreeTDS, or unreadable.
 */
int
qb_odbc_freetds_version(const char *path, int *major, int *minor)
{
	static const char needle[] = "freetds v";
	FILE	   *f = fopen(path, "rb");
	char		buf[65536 + 32];
	size_t		keep = 0;
	int			found = 0;

	*major = *minor = 0;
	if (f == NULL)
		return 0;
	for (;;)
	{
		size_t		n = fread(buf + keep, 1, sizeof(buf) - keep - 1, f);
		char	   *p;

		if (n == 0)
			break;
		n += keep;
		buf[n] = '\0';
		for (p = buf; p + sizeof(needle) < buf + n; p++)
			if (memcmp(p, needle, sizeof(needle) - 1) == 0 &&
				sscanf(p + sizeof(needle) - 1, "%d.%d", major, minor) == 2)
			{
				found = 1;
				break;
			}
		if (found)
			break;
		/* a needle cut at the end of this piece is whole in the next */
		keep = n < 32 ? n : 32;
		memmove(buf, buf + n - keep, keep);
	}
	fclose(f);
	return found;
}

/*
 * qb_odbc_braces_for: the brace style the driver at path reads.  The
 * library is read once per file and process (a reconnect reads nothing).
 */
QbOdbcBraces
qb_odbc_braces_for(const char *driver)
{
	static char last_path[512];
	static struct stat last_st;
	static QbOdbcBraces last_style;
	struct stat st;
	int			major,
				minor;

	if (driver[0] == '{')
		return QB_ODBC_BRACES_ODBC;
	/* the same file as last time (path, inode, size, change time): its answer */
	if (stat(driver, &st) == 0 && strcmp(last_path, driver) == 0 && st.st_ino == last_st.st_ino &&
		st.st_size == last_st.st_size && st.st_mtim.tv_sec == last_st.st_mtim.tv_sec &&
		st.st_mtim.tv_nsec == last_st.st_mtim.tv_nsec)
		return last_style;
	last_style = qb_odbc_freetds_version(driver, &major, &minor) &&
		(major < 1 || (major == 1 && minor < 4)) ? QB_ODBC_BRACES_FREETDS13 : QB_ODBC_BRACES_ODBC;
	snprintf(last_path, sizeof(last_path), "%s", driver);
	last_st = st;
	return last_style;
}

/* qb_odbc_default_driver: see odbc_store.h. */
const char *
qb_odbc_default_driver(void)
{
	static const char *const paths[] = {
		"/usr/lib/x86_64-linux-gnu/odbc/libtdsodbc.so",
		"/usr/lib/aarch64-linux-gnu/odbc/libtdsodbc.so",
		"/usr/lib64/libtdsodbc.so.0",
		"/usr/local/lib/libtdsodbc.so",
	};

	for (size_t i = 0; i < sizeof(paths) / sizeof(paths[0]); i++)
		if (access(paths[i], R_OK) == 0)
			return paths[i];
	return "{FreeTDS}";
}
