/*-------------------------------------------------------------------------
 * pq_backend.c
 *	  The daemon's ops for PostgreSQL (qbd_backend.h): the libpq store,
 *	  the migrations of pq_migrate.c, and the check that notifications
 *	  arrive through database.url.
 *
 * Every connection is made by qb_pq_connect (pq_conn.c); a failed one is
 * named by its redacted URL, with what to do (qbpb_connect_advice).  The
 * URL is read by libpq alone, here as at each connect: its host lists,
 * Unix-socket directories and options are libpq's.
 *-------------------------------------------------------------------------
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <libpq-fe.h>

#include "pq_store.h"
#include "qb_host.h"

/* qbpb_count: the items of one of libpq's comma lists (host, port); none is one, libpq's default */
static int
qbpb_count(const char *list)
{
	int			n = 1;

	for (const char *p = list; p != NULL && *p != '\0'; p++)
		n += *p == ',';
	return n;
}

/* qbpb_item: item i of such a list into buf ("" when the list is shorter) */
static void
qbpb_item(const char *list, int i, char *buf, size_t len)
{
	const char *p = list != NULL ? list : "";

	for (; i > 0 && p != NULL; i--)
		if ((p = strchr(p, ',')) != NULL)
			p++;
	snprintf(buf, len, "%.*s", p != NULL ? (int) strcspn(p, ",") : 0, p != NULL ? p : "");
}

/*
 * qbpb_check_hosts: the URL's hosts and ports as libpq read them (comma
 * lists, percent-decoded), so each form libpq takes passes: a host list
 * (db1:5432,db2:5432), a Unix-socket directory (?host=/run/postgresql, or
 * %2Frun%2Fpostgresql in the host's place), no host (libpq's default
 * socket).  A host is named by its place in the list, never by its value.
 */
static int
qbpb_check_hosts(const char *hosts, const char *ports, char *err, size_t errlen)
{
	int			nhosts = qbpb_count(hosts);
	int			nports = ports != NULL ? qbpb_count(ports) : 0;
	char		item[512];
	char		place[48] = "";

	if (nports > 1 && nports != nhosts)
	{
		snprintf(err, errlen, "database.url: %d ports for %d host%s; give each host its port, or one port for all",
				 nports, nhosts, nhosts == 1 ? "" : "s");
		return -1;
	}
	for (int i = 0; i < nhosts; i++)
	{
		if (nhosts > 1)
			snprintf(place, sizeof(place), "host %d of the host list", i + 1);
		qbpb_item(hosts, i, item, sizeof(item));
		if (item[0] == '\0' && nhosts > 1)
		{
			snprintf(err, errlen, "database.url: %s is empty; write postgres://host1[:port1],host2[:port2]/... "
					 "(a Unix-socket directory as %%2Fpath%%2Fto%%2Fdir)", place);
			return -1;
		}
		/* a socket directory (an absolute path) or an abstract socket (@name) is libpq's to find */
		if (item[0] != '/' && item[0] != '@' && strspn(item, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
													   "0123456789-._:%") != strlen(item))
		{
			snprintf(err, errlen, "database.url: %s%sinvalid character in the host name (letters, digits, '-', '.' "
					 "and '_'; a Unix-socket directory is an absolute path, %%2F-encoded in the host's place)",
					 place, place[0] ? ": " : "");
			return -1;
		}
		qbpb_item(ports, nports == 1 ? 0 : i, item, sizeof(item));
		if (item[0] != '\0' && (strspn(item, "0123456789") != strlen(item) || strlen(item) > 5 ||
								atoi(item) < 1 || atoi(item) > 65535))
		{
			snprintf(err, errlen, "database.url: %s%sthe port must be a number from 1 to 65535",
					 nports > 1 ? place : "", nports > 1 ? ": " : "");
			return -1;
		}
	}
	return 0;
}

/* qbpb_option: the value of keyword in PQconninfoParse's answer, NULL when unset */
static const char *
qbpb_option(const PQconninfoOption *opts, const char *keyword)
{
	for (const PQconninfoOption *o = opts; o->keyword != NULL; o++)
		if (strcmp(o->keyword, keyword) == 0)
			return o->val;
	return NULL;
}

/*
 * qbpb_check_config: what libpq cannot read (an unknown option in the
 * query, a bad %-escape) and a host or port it could never connect to are
 * refused now, not at each connect.  libpq's message is repeated only
 * where it names an option, never a value: the others may quote the
 * password.
 */
static int
qbpb_check_config(const QbConfig *cfg, char *err, size_t errlen)
{
	char	   *perr = NULL;
	PQconninfoOption *opts = PQconninfoParse(cfg->database.url, &perr);
	int			rc;

	if (opts != NULL)
	{
		rc = qbpb_check_hosts(qbpb_option(opts, "host"), qbpb_option(opts, "port"), err, errlen);
		PQconninfoFree(opts);
		return rc;
	}
	if (perr != NULL && (strncmp(perr, "invalid URI query parameter", 27) == 0 ||
						 strncmp(perr, "invalid connection option", 25) == 0))
	{
		perr[strcspn(perr, "\n")] = '\0';
		snprintf(err, errlen, "database.url: libpq refuses it: %s; see libpq's \"Parameter Key Words\" "
				 "for the options a postgres:// URL takes", perr);
	}
	else
		snprintf(err, errlen, "database.url: libpq cannot read it%s; check its %%-escapes (%%XX, two hex "
				 "digits) and its query (key=value pairs joined by &)", perr ? "" : " (out of memory)");
	PQfreemem(perr);
	return -1;
}

/*
 * qbpb_connect_advice: what to do about a failed connect, from what libpq
 * knows of it.  The server's own words come in its language (lc_messages),
 * so they are repeated, never matched: the password the server asked for
 * was missing, or was given and the connection refused (a wrong password,
 * an unknown user, a database that does not exist), or the server was not
 * reached or turned the user away before asking (the host, the port,
 * pg_hba.conf).
 */
static const char *
qbpb_connect_advice(const PGconn *conn)
{
	if (conn == NULL)
		return "free some memory";
	if (PQconnectionNeedsPassword(conn))
		return "the server asks for a password and database.url gives none: add it, as "
			"postgres://user:${PGPASSWORD}@host/db (${NAME} reads the environment, ${file:PATH} a file)";
	if (PQconnectionUsedPassword(conn))
		return "check the user and the password in database.url (percent-encode @, : and / in them), "
			"and that its database exists";
	return "check database.url: that a server listens at its host and port, that the database exists, "
		"and that the server's pg_hba.conf lets this user in from here";
}

/*
 * qbpb_connect: the admin connection, or NULL with err naming the redacted
 * URL, libpq's first line and what to do.
 */
static void *
qbpb_connect(const QbConfig *cfg, const char *application_name, char *err, size_t errlen)
{
	char		safe[512];
	char		why[QB_ERRLEN];
	PGconn	   *conn = qb_pq_connect(cfg->database.url, application_name,
									 cfg->database.connect_timeout_ms);

	if (PQstatus(conn) == CONNECTION_OK)
		return conn;
	qbd_redact_url(cfg->database.url, safe, sizeof(safe));
	/* one line per event: libpq's later lines (its hint, the other hosts tried) give way to the advice */
	snprintf(why, sizeof(why), "%s", conn ? PQerrorMessage(conn) : "out of memory");
	why[strcspn(why, "\n")] = '\0';
	snprintf(err, errlen, "could not connect to %s: %s; %s", safe, why, qbpb_connect_advice(conn));
	PQfinish(conn);
	return NULL;
}

static int
qbpb_migrate(void *conn, char *done, size_t donelen, char *err, size_t errlen)
{
	return qb_pq_migrate(conn, done, donelen, err, errlen);
}

static int
qbpb_publish_config(void *conn, const QbConfig *cfg, char *err, size_t errlen)
{
	return qb_pq_publish_config(conn, cfg, err, errlen);
}

static void
qbpb_disconnect(void *conn)
{
	PQfinish(conn);
}

/*
 * qbpb_probe_notify: does a NOTIFY that another session commits reach a
 * session that LISTENs, through database.url?  Not through a pooler in
 * transaction or statement mode: the LISTEN stays with a server connection
 * the pool hands to other clients between transactions.
 */
static QbdProbe
qbpb_probe_notify(const QbConfig *cfg, char *err, size_t errlen)
{
	PGconn	   *listener;
	PGconn	   *sender = NULL;
	PGresult   *res;
	char		channel[64];
	char		sql[96];
	const char *v[1] = {channel};
	long		deadline;
	QbdProbe	rc = QBD_PROBE_FAILED;

	if ((listener = qbpb_connect(cfg, "queuebox-mssqld supervisor", err, errlen)) == NULL)
		return QBD_PROBE_FAILED;
	/* a channel of its own: no role is woken by the probe */
	snprintf(channel, sizeof(channel), "queuebox_probe_%d", (int) getpid());
	snprintf(sql, sizeof(sql), "LISTEN %s", channel);
	res = PQexec(listener, sql);
	if (PQresultStatus(res) != PGRES_COMMAND_OK)
	{
		snprintf(err, errlen, "LISTEN failed: %s", PQerrorMessage(listener));
		PQclear(res);
		goto done;
	}
	PQclear(res);
	if ((sender = qbpb_connect(cfg, "queuebox-mssqld supervisor", err, errlen)) == NULL)
		goto done;
	res = PQexecParams(sender, "SELECT pg_notify($1, 'probe')", 1, NULL, v, NULL, NULL, 0);
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		snprintf(err, errlen, "pg_notify failed: %s", PQerrorMessage(sender));
		PQclear(res);
		goto done;
	}
	PQclear(res);
	rc = QBD_PROBE_LOST;
	deadline = qb_now_ms() + QBD_PROBE_MS;
	while (rc == QBD_PROBE_LOST)
	{
		struct pollfd p = {.fd = PQsocket(listener), .events = POLLIN};
		PGnotify   *n;
		long		left;

		if (!PQconsumeInput(listener))
		{
			snprintf(err, errlen, "the listening connection failed: %s", PQerrorMessage(listener));
			rc = QBD_PROBE_FAILED;
			break;
		}
		while ((n = PQnotifies(listener)) != NULL)
		{
			if (strcmp(n->relname, channel) == 0)
				rc = QBD_PROBE_ARRIVED;
			PQfreemem(n);
		}
		if (rc != QBD_PROBE_LOST || (left = deadline - qb_now_ms()) <= 0)
			break;
		if (poll(&p, 1, (int) left) < 0 && errno != EINTR)
			break;
	}
done:
	if (rc == QBD_PROBE_FAILED)
		err[strcspn(err, "\n")] = '\0';
	PQfinish(sender);
	PQfinish(listener);
	return rc;
}

/* qbpb_store_new: a role's libpq store; its engines commit asynchronously (role.c). */
static void *
qbpb_store_new(const QbConfig *cfg, const char *application_name, bool pooled,
			   QbStore *store, char *err, size_t errlen)
{
	QbPqStore  *pq = qb_pq_store_new(&(QbPqConf) {
		.url = cfg->database.url,
		.application_name = application_name,
		.connect_timeout_ms = cfg->database.connect_timeout_ms,
		.statement_timeout_ms = cfg->database.statement_timeout_ms,
		.async_commit = true,
		.unnamed_statements = pooled,
	});

	if (pq == NULL)
	{
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	qb_pq_store_ops(pq, store);
	return pq;
}

static int
qbpb_store_connect(void *db, char *err, size_t errlen)
{
	return qb_pq_store_connect(db, err, errlen);
}

static void
qbpb_store_set_config(void *db, const QbConfig *cfg)
{
	qb_pq_store_set_config(db, cfg);
}

static int
qbpb_store_listen(void *db, const char *channel, char *err, size_t errlen)
{
	return qb_pq_store_listen(db, channel, err, errlen);
}

static int
qbpb_store_socket(void *db)
{
	return qb_pq_store_socket(db);
}

static int
qbpb_store_notified(void *db)
{
	return qb_pq_store_notified(db);
}

static void
qbpb_store_free(void *db)
{
	qb_pq_store_free(db);
}

const QbdBackend qbd_backend_postgresql = {
	.name = "postgresql",
	.check_config = qbpb_check_config,
	.connect = qbpb_connect,
	.migrate = qbpb_migrate,
	.publish_config = qbpb_publish_config,
	.disconnect = qbpb_disconnect,
	.probe_notify = qbpb_probe_notify,
	.store_new = qbpb_store_new,
	.store_connect = qbpb_store_connect,
	.store_set_config = qbpb_store_set_config,
	.store_listen = qbpb_store_listen,
	.store_socket = qbpb_store_socket,
	.store_notified = qbpb_store_notified,
	.store_free = qbpb_store_free,
};
