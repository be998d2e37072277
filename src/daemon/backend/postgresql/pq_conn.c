/*-------------------------------------------------------------------------
 * pq_conn.c
 *	  The libpq store's connection (pq_store_int.h): connect, set up the
 *	  session as the extension's workers set up their backend, LISTEN,
 *	  notice a lost connection and drop it, and the store's life (new,
 *	  free).
 *
 * Over TCP each connect gives the server's end the keepalives and
 * tcp_user_timeout of its own (qbpq_server_tcp), so each end finds a
 * vanished peer in seconds.  Through a pooler the session settings are best
 * effort (README.md).
 *
 * Takeover (qb_sql_pg.h, "Takeover"): when the engine asks for it
 * (QbStore.claimer), each connect takes a session advisory lock on the
 * store's claimer id and the claims record that id; the lock is held for
 * the connection's life, so when the role dies (or loses its connection)
 * its rows are taken over at once by any peer.  Through a pooler in
 * transaction mode no lock is taken: the session that would hold it is the
 * pooler's, which outlives the role (or is closed under it); claims record
 * no claimer and are taken over by lease only (docs/operations.md).
 *
 * Secrets: messages name the server as user@host:port/dbname, never the
 * URL; the password is scrubbed from libpq's.
 *-------------------------------------------------------------------------
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pq_store_int.h"
#include "qb_store.h"

/* ---- messages ------------------------------------------------------------ */

/*
 * qbpq_scrub copies libpq's message into err after what, without its
 * trailing newline and with the password (if libpq ever echoed it) masked.
 */
static void
qbpq_scrub(const QbPqStore *s, const char *what, const char *msg, char *err, size_t errlen)
{
	char		buf[QB_ERRLEN];
	size_t		len;
	char	   *hit;

	snprintf(buf, sizeof(buf), "%s", msg && *msg ? msg : "no message from libpq");
	len = strlen(buf);
	while (len > 0 && (buf[len - 1] == '\n' || buf[len - 1] == ' '))
		buf[--len] = '\0';
	/* a short password would mask every such letter: too short to matter */
	while (s->password != NULL && strlen(s->password) >= 4 &&
		   (hit = strstr(buf, s->password)) != NULL)
	{
		size_t		plen = strlen(s->password);

		memset(hit, '*', 3);
		memmove(hit + 3, hit + plen, strlen(hit + plen) + 1);
	}
	snprintf(err, errlen, "%s: %s", what, buf);
}

/* qbpq_describe: s->where (user@host:port/dbname) and s->password, from the URL or conninfo. */
static bool
qbpq_describe(QbPqStore *s)
{
	char	   *perr = NULL;
	PQconninfoOption *opts = PQconninfoParse(s->url, &perr);
	const char *user = NULL,
			   *host = NULL,
			   *port = NULL,
			   *db = NULL;
	char		buf[512];

	PQfreemem(perr);
	if (opts == NULL)
	{
		/* libpq will refuse it at connect, with its reason */
		s->where = strdup("the PostgreSQL server (the connection string does not parse)");
		return s->where != NULL;
	}
	for (PQconninfoOption *o = opts; o->keyword != NULL; o++)
	{
		if (o->val == NULL || o->val[0] == '\0')
			continue;
		if (strcmp(o->keyword, "user") == 0)
			user = o->val;
		else if (strcmp(o->keyword, "host") == 0 || (strcmp(o->keyword, "hostaddr") == 0 && !host))
			host = o->val;
		else if (strcmp(o->keyword, "port") == 0)
			port = o->val;
		else if (strcmp(o->keyword, "dbname") == 0)
			db = o->val;
		else if (strcmp(o->keyword, "password") == 0 && (s->password = strdup(o->val)) == NULL)
			break;
	}
	snprintf(buf, sizeof(buf), "PostgreSQL at %s%s%s%s%s/%s", user ? user : "", user ? "@" : "",
			 host ? host : "(default host)", port ? ":" : "", port ? port : "",
			 db ? db : "(default database)");
	PQconninfoFree(opts);
	s->where = strdup(buf);
	return s->where != NULL;
}

/* ---- the connection --------------------------------------------------------- */

/* qbpq_drop closes a connection that is lost (or never became usable). */
void
qbpq_drop(QbPqStore *s)
{
	if (s->conn != NULL)
		PQfinish(s->conn);
	s->conn = NULL;
	memset(s->prepared, 0, sizeof(s->prepared));
	s->claimer_held = false;	/* the lock went with the session */
}

/* qbpq_lost: does this failure mean the connection is gone? */
static bool
qbpq_lost(const QbPqStore *s, const char *state)
{
	return s->conn == NULL || PQstatus(s->conn) != CONNECTION_OK ||
		state == NULL || state[0] == '\0' || strncmp(state, "08", 2) == 0 ||
		strcmp(state, "57P01") == 0 || strcmp(state, "57P02") == 0 ||
		strcmp(state, "57P03") == 0;
}

/*
 * qbpq_failed records a failed statement: err = what + libpq's message,
 * s->sqlstate its SQLSTATE; a lost connection is dropped.
 */
void
qbpq_failed(QbPqStore *s, const PGresult *res, const char *what, char *err, size_t errlen)
{
	const char *state = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
	const char *msg = res ? PQresultErrorMessage(res) : NULL;

	if ((msg == NULL || *msg == '\0') && s->conn != NULL)
		msg = PQerrorMessage(s->conn);
	snprintf(s->sqlstate, sizeof(s->sqlstate), "%s", state ? state : "");
	qbpq_scrub(s, what, msg, err, errlen);
	if (qbpq_lost(s, state))
		qbpq_drop(s);
}

/* qbpq_command runs SQL text with no parameter and no row (BEGIN, LISTEN ...). */
int
qbpq_command(QbPqStore *s, const char *sql, const char *what, char *err, size_t errlen)
{
	PGresult   *res = PQexec(s->conn, sql);
	int			rc = 0;

	if (PQresultStatus(res) != PGRES_COMMAND_OK)
	{
		qbpq_failed(s, res, what, err, errlen);
		rc = -1;
	}
	PQclear(res);
	return rc;
}

static int
qbpq_listen_one(QbPqStore *s, const char *channel, char *err, size_t errlen)
{
	/* LISTEN takes no parameter: the channel goes in as a quoted identifier */
	char	   *ident = PQescapeIdentifier(s->conn, channel, strlen(channel));
	char	   *sql;
	int			rc;

	if (ident == NULL)
	{
		qbpq_failed(s, NULL, "quoting a LISTEN channel", err, errlen);
		return -1;
	}
	sql = malloc(strlen(ident) + 8);
	if (sql == NULL)
	{
		PQfreemem(ident);
		snprintf(err, errlen, "LISTEN: out of memory");
		return -1;
	}
	sprintf(sql, "LISTEN %s", ident);
	rc = qbpq_command(s, sql, "LISTEN", err, errlen);
	free(sql);
	PQfreemem(ident);
	return rc;
}

/*
 * qbpq_server_tcp gives the server's end of the connection the keepalives
 * and tcp_user_timeout the connection has at this end (qbpq_tcp_keys or the
 * URL's): a backend whose client vanished mid-transaction would otherwise
 * hold its row locks until the server's kernel gives up (2 hours of
 * keepalive by default), and the claim skips locked rows.  Nothing on a
 * Unix socket, nor with keepalives=0.
 */
static int
qbpq_server_tcp(QbPqStore *s, char *err, size_t errlen)
{
	static const char *const map[][2] = {
		{"keepalives_idle", "tcp_keepalives_idle"},
		{"keepalives_interval", "tcp_keepalives_interval"},
		{"keepalives_count", "tcp_keepalives_count"},
		{"tcp_user_timeout", "tcp_user_timeout"},
	};
	const char *host = PQhost(s->conn);
	PQconninfoOption *opts;
	int			rc = 0;

	if (host == NULL || host[0] == '/' || host[0] == '@')
		return 0;
	if ((opts = PQconninfo(s->conn)) == NULL)
		return 0;
	for (PQconninfoOption *o = opts; o->keyword != NULL; o++)
		if (strcmp(o->keyword, "keepalives") == 0 && o->val != NULL && strcmp(o->val, "0") == 0)
			goto done;
	for (size_t i = 0; i < sizeof(map) / sizeof(map[0]) && rc == 0; i++)
		for (PQconninfoOption *o = opts; o->keyword != NULL; o++)
			if (strcmp(o->keyword, map[i][0]) == 0 && o->val != NULL && o->val[0] != '\0')
			{
				rc = qbpq_set(s, map[i][1], o->val, false, err, errlen);
				break;
			}
done:
	PQconninfoFree(opts);
	return rc;
}

/*
 * qbpq_claimer_lock takes the lock of the store's claimer id on this
 * session: after a reconnect the same id, so rows claimed before the
 * connection was lost stay this role's unless a peer took them over
 * meanwhile; a fresh id when there is none yet or another session holds
 * it.  Not through a pooler.
 */
int
qbpq_claimer_lock(QbPqStore *s, char *err, size_t errlen)
{
	for (int tries = 0; tries < 8 && !s->claimer_held && !s->unnamed; tries++)
	{
		int64_t		id = s->claimer_id != 0 && tries == 0 ? s->claimer_id : qb_claimer_id();
		QbpqArgs	a = {0};
		PGresult   *res;
		bool		got;

		if (id == 0)
		{
			snprintf(err, errlen, "no random bytes for a claimer id");
			return -1;
		}
		qbpq_args_int(&a, 0, id);
		if ((res = qbpq_run(s, QB_PG_S_CLAIMER_LOCK, &a, PGRES_TUPLES_OK, "taking the claimer lock",
							err, errlen)) == NULL)
			return -1;
		got = PQntuples(res) == 1 && strcmp(PQgetvalue(res, 0, 0), "t") == 0;
		PQclear(res);
		if (got)
		{
			s->claimer_id = id;
			s->claimer_held = true;
		}
	}
	return 0;
}

/*
 * qbpq_session sets up a new connection as the extension's workers set up
 * their backend, then issues the LISTENs and takes the claimer lock.
 */
static int
qbpq_session(QbPqStore *s, char *err, size_t errlen)
{
	char		ms[24];

	for (int i = 0; i < QB_PG_NSETTINGS; i++)
		if (qbpq_set(s, qb_pg_session_settings[i].name, qb_pg_session_settings[i].value,
					 false, err, errlen) != 0)
			return -1;
	if (s->statement_timeout_ms > 0)
	{
		snprintf(ms, sizeof(ms), "%ld", s->statement_timeout_ms);
		if (qbpq_set(s, "statement_timeout", ms, false, err, errlen) != 0)
			return -1;
	}
	if (s->async_commit && qbpq_set(s, "synchronous_commit", "off", false, err, errlen) != 0)
		return -1;
	if (qbpq_server_tcp(s, err, errlen) != 0)
		return -1;
	for (int i = 0; i < s->nchannels; i++)
		if (qbpq_listen_one(s, s->channels[i], err, errlen) != 0)
			return -1;
	return s->takeover ? qbpq_claimer_lock(s, err, errlen) : 0;
}

/*
 * The TCP settings every daemon connection starts from, so a peer that went
 * silent (a partition, a host gone without a FIN or RST) is found in about
 * 25 s instead of the kernel's 2 hours of keepalive or 15 minutes of
 * retransmission: probes after 10 s idle, every 5 s, and no byte left
 * unacknowledged for more than 25 s.  They come before the URL in
 * qb_pq_connect's arrays, so the URL's own keepalives* or tcp_user_timeout
 * win (libpq keeps the last value of a key).  libpq ignores them on a Unix
 * socket.  docs/daemon.md "Dead peers" has the same figures.
 */
static const char *const qbpq_tcp_keys[] = {
	"keepalives", "keepalives_idle", "keepalives_interval", "keepalives_count", "tcp_user_timeout",
};
static const char *const qbpq_tcp_vals[] = {"1", "10", "5", "3", "25000"};

#define QBPQ_NTCP (sizeof(qbpq_tcp_keys) / sizeof(qbpq_tcp_keys[0]))
_Static_assert(QBPQ_NTCP == sizeof(qbpq_tcp_vals) / sizeof(qbpq_tcp_vals[0]), "a value per TCP key");

/* qb_pq_connect: see pq_store.h. */
PGconn *
qb_pq_connect(const char *url, const char *application_name, long connect_timeout_ms)
{
	const char *keys[QBPQ_NTCP + 4];
	const char *vals[QBPQ_NTCP + 4];
	size_t		n = 0;
	char		secs[24];

	for (size_t i = 0; i < QBPQ_NTCP; i++, n++)
	{
		keys[n] = qbpq_tcp_keys[i];
		vals[n] = qbpq_tcp_vals[i];
	}
	keys[n] = "dbname";
	vals[n++] = url;
	keys[n] = "application_name";
	vals[n++] = application_name;
	if (connect_timeout_ms > 0)
	{
		/* libpq counts whole seconds: round up, never to 0 (no limit) */
		snprintf(secs, sizeof(secs), "%ld", (connect_timeout_ms + 999) / 1000);
		keys[n] = "connect_timeout";
		vals[n++] = secs;
	}
	keys[n] = NULL;
	vals[n] = NULL;
	return PQconnectdbParams(keys, vals, 1);
}

static int
qbpq_open(void *ctx, char *err, size_t errlen)
{
	QbPqStore  *s = ctx;
	char		what[600];

	snprintf(what, sizeof(what), "connecting to %s", s->where);
	s->conn = qb_pq_connect(s->url, s->application_name, s->connect_timeout_ms);
	if (s->conn == NULL || PQstatus(s->conn) != CONNECTION_OK)
	{
		qbpq_scrub(s, what, s->conn ? PQerrorMessage(s->conn) : "out of memory", err, errlen);
		qbpq_drop(s);
		return -1;
	}
	memset(s->prepared, 0, sizeof(s->prepared));
	if (qbpq_session(s, err, errlen) != 0)
	{
		qbpq_drop(s);
		return -1;
	}
	return 0;
}

/*
 * qbpq_ensure: a usable connection, or -1.  Connects when there is none,
 * unless the backoff of the last failed connect is still running.
 */
int
qbpq_ensure(QbPqStore *s, char *err, size_t errlen)
{
	if (s->conn != NULL && PQstatus(s->conn) == CONNECTION_OK)
		return 0;
	qbpq_drop(s);
	return qb_store_connect(&s->backoff, qbpq_open, s, err, errlen);
}

/* ---- the API ----------------------------------------------------------------------- */

QbPqStore *
qb_pq_store_new(const QbPqConf *conf)
{
	QbPqStore  *s = calloc(1, sizeof(QbPqStore));

	if (s == NULL)
		return NULL;
	s->url = strdup(conf->url ? conf->url : "");
	s->application_name = strdup(conf->application_name ? conf->application_name : "queuebox");
	s->connect_timeout_ms = conf->connect_timeout_ms;
	s->statement_timeout_ms = conf->statement_timeout_ms;
	s->async_commit = conf->async_commit;
	s->unnamed = conf->unnamed_statements;
	if (s->url == NULL || s->application_name == NULL || !qbpq_describe(s))
	{
		qb_pq_store_free(s);
		return NULL;
	}
	return s;
}

int
qb_pq_store_connect(QbPqStore *s, char *err, size_t errlen)
{
	return qbpq_ensure(s, err, errlen);
}

int
qb_pq_store_socket(const QbPqStore *s)
{
	return s->conn != NULL ? PQsocket(s->conn) : -1;
}

int
qb_pq_store_listen(QbPqStore *s, const char *channel, char *err, size_t errlen)
{
	bool		connected = s->conn != NULL && PQstatus(s->conn) == CONNECTION_OK;
	bool		known = false;

	for (int i = 0; i < s->nchannels; i++)
		known |= strcmp(s->channels[i], channel) == 0;
	if (!known)
	{
		char	  **c = realloc(s->channels, sizeof(char *) * (s->nchannels + 1));

		if (c == NULL || (c[s->nchannels] = strdup(channel)) == NULL)
		{
			if (c != NULL)
				s->channels = c;
			snprintf(err, errlen, "LISTEN: out of memory");
			return -1;
		}
		s->channels = c;
		s->nchannels++;
	}
	/* a new connection issues every channel's LISTEN itself */
	if (!connected)
		return qbpq_ensure(s, err, errlen);
	return qbpq_listen_one(s, channel, err, errlen);
}

int
qb_pq_store_notified(QbPqStore *s)
{
	PGnotify   *n;
	int			count = 0;

	if (s->conn == NULL)
		return 0;
	if (!PQconsumeInput(s->conn))
	{
		/* the next op connects again (and says why if it cannot) */
		qbpq_drop(s);
		return 0;
	}
	while ((n = PQnotifies(s->conn)) != NULL)
	{
		count++;
		PQfreemem(n);
	}
	return count;
}

void
qb_pq_store_set_config(QbPqStore *s, const QbConfig *cfg)
{
	s->cfg = cfg;
}

void
qb_pq_store_free(QbPqStore *s)
{
	if (s == NULL)
		return;
	qbpq_drop(s);
	for (int i = 0; i < s->nchannels; i++)
		free(s->channels[i]);
	free(s->channels);
	free(s->url);
	free(s->application_name);
	free(s->where);
	free(s->password);
	free(s);
}
