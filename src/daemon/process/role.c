/*-------------------------------------------------------------------------
 * role.c
 *	  The body of a role process: one engine, its libpq store and the
 *	  daemon's host, from the fork to the exit.
 *
 * A role reads the document in force from the shared block, opens its own
 * connection (application_name "queuebox-mssqld <role>", so pg_stat_activity
 * shows who is who), and runs its engine until SIGTERM.  It dies with the
 * supervisor (PR_SET_PDEATHSIG: SIGTERM, so rows in flight are released as
 * on a stop; a kill -9 of the supervisor leaves no worker behind that a new
 * daemon would race).  Exit status: 0 after a stop, 1 when the engine could
 * not start; the supervisor restarts it either way unless it is stopping.
 *
 * The engines commit their claims and settles asynchronously, as the
 * extension's workers do by default (queuebox.worker_async_commit): a crash
 * of the server can then lose a settle, and the row is delivered again
 * (at least once, as always), never lost.
 *-------------------------------------------------------------------------
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/prctl.h>

#include "daemon_host.h"
#include "qb_consume.h"
#include "qb_ingress.h"
#include "qb_outbox.h"
#include "qb_relay.h"

/* qbd_role_name: see qbd.h. */
void
qbd_role_name(QbdRoleKind kind, int index, char *buf, size_t len)
{
	switch (kind)
	{
		case QBD_ROLE_OUTBOX:
			snprintf(buf, len, "outbox %d", index);
			return;
		case QBD_ROLE_RELAY:
			snprintf(buf, len, "relay");
			return;
		case QBD_ROLE_INGRESS:
			snprintf(buf, len, "ingress");
			return;
		case QBD_ROLE_CONSUMER:
			break;
	}
	snprintf(buf, len, "consumer %d", index);
}

/* qbd_role_run: the engine of the role, with its stats logged at the end. */
static int
qbd_role_run(QbdShared *sh, QbdRoleKind kind, int index, const QbHost *host,
			 const QbStore *store, const char *name)
{
	char		err[QB_ERRLEN] = "";
	int			rc = -1;

	switch (kind)
	{
		case QBD_ROLE_OUTBOX:
			{
				QbOutboxStats s = {0};

				if ((rc = qb_outbox_run(host, store, index, &s, err, sizeof(err))) == 0)
					qbd_log(QB_LOG_INFO,
							"stopped: %ld claims, %ld sent, %ld retried, %ld dead, %ld released, %ld held, %ld parked",
							s.batches, s.sent, s.retried, s.dead, s.released, s.held, s.parked);
				break;
			}
		case QBD_ROLE_RELAY:
			{
				QbRelayStats s = {0};

				if ((rc = qb_relay_run(host, store, &s, err, sizeof(err))) == 0)
					qbd_log(QB_LOG_INFO, "stopped: %ld batches, %ld forwarded, %ld dead, %ld taken over",
							s.batches, s.forwarded, s.dead, s.taken_over);
				break;
			}
		case QBD_ROLE_INGRESS:
			{
				QbIngressStats s = {0};

				if ((rc = qb_ingress_run(host, store, &sh->metrics, &s, err, sizeof(err))) == 0)
					qbd_log(QB_LOG_INFO,
							"stopped: %ld accepted, %ld duplicates, %ld refused, %ld unavailable in %ld store calls",
							s.accepted, s.duplicates, s.refused, s.unavailable, s.batches);
				break;
			}
		case QBD_ROLE_CONSUMER:
			{
				QbConsumeStats s = {0};

				if ((rc = qb_consume_run(host, store, index, &s, err, sizeof(err))) == 0)
					qbd_log(QB_LOG_INFO,
							"stopped: %ld batches, %ld stored, %ld stored dead, %ld duplicates, %ld batches given back",
							s.batches, s.stored, s.dead, s.duplicates, s.store_failures);
				break;
			}
	}
	if (rc != 0)
		qbd_log(QB_LOG_ERROR, "%s could not start: %s", name, err);
	return rc == 0 ? 0 : 1;
}

/* qbd_role_main: see qbd.h. */
int
qbd_role_main(QbdShared *sh, QbdRoleKind kind, int index)
{
	char		name[64];
	char		app[96];
	char		title[16];
	char		err[QB_ERRLEN];
	char	   *doc;
	uint64_t	gen = 0;
	QbConfig   *cfg = NULL;
	QbPqStore  *pq = NULL;
	QbOdbcStore *odbc = NULL;
	QbdHost		dh;
	QbHost		host;
	QbStore		store;
	int			rc;

	qbd_role_name(kind, index, name, sizeof(name));
	qbd_log_init(name, false);
	prctl(PR_SET_PDEATHSIG, SIGTERM);
	/* ps: "queuebox-mssqld: outbox 0"; top's comm keeps 15 bytes: "qb outbox 12" */
	qbd_ps_set(name);
	snprintf(title, sizeof(title), "qb %.12s", name);
	prctl(PR_SET_NAME, title);

	/* the supervisor published a valid document before it forked */
	doc = qbd_shared_read(sh, &gen);
	if (doc == NULL || qb_config_parse(doc, strlen(doc), &cfg, err, sizeof(err)) != 0)
	{
		qbd_log(QB_LOG_ERROR, "could not read the configuration in force: %s",
				doc ? err : "none published");
		free(doc);
		return 1;
	}
	free(doc);
	qbd_log_set_json(cfg->daemon.log_json);

	snprintf(app, sizeof(app), "queuebox-mssqld %s", name);
	if (qbd_is_sqlserver(cfg->database.url))
		odbc = qb_odbc_store_new(&(QbOdbcConf) {
			.url = cfg->database.url,
			.application_name = app,
			.connect_timeout_ms = cfg->database.connect_timeout_ms,
			.statement_timeout_ms = cfg->database.statement_timeout_ms,
		}, err, sizeof(err));
	else
		pq = qb_pq_store_new(&(QbPqConf) {
			.url = cfg->database.url,
			.application_name = app,
			.connect_timeout_ms = cfg->database.connect_timeout_ms,
			.statement_timeout_ms = cfg->database.statement_timeout_ms,
			.async_commit = true,
			.unnamed_statements = sh->pooled != 0,
		});
	if (pq == NULL && odbc == NULL)
	{
		qbd_log(QB_LOG_ERROR, "%s", odbc == NULL && qbd_is_sqlserver(cfg->database.url) ? err : "out of memory");
		qb_config_free(cfg);
		return 1;
	}
	if (pq != NULL)
		qb_pq_store_ops(pq, &store);
	else
		qb_odbc_store_ops(odbc, &store);
	if (qbd_host_start(&dh, sh, kind, pq, &host, &store, err, sizeof(err)) != 0)
	{
		qbd_log(QB_LOG_ERROR, "%s", err);
		qb_pq_store_free(pq);
		qb_odbc_store_free(odbc);
		qb_config_free(cfg);
		return 1;
	}
	dh.odbc = odbc;
	if ((pq ? qb_pq_store_connect(pq, err, sizeof(err)) : qb_odbc_store_connect(odbc, err, sizeof(err))) != 0)
		qbd_log(QB_LOG_WARNING, "%s; retrying", err);
	/* no LISTEN where notifications do not arrive (the supervisor said why) */
	if (pq != NULL && cfg->database.listen && !sh->pooled && (kind == QBD_ROLE_OUTBOX || kind == QBD_ROLE_RELAY) &&
		qbd_host_listen(&dh, kind == QBD_ROLE_OUTBOX ? "queuebox_outbox" : "queuebox_inbox",
						err, sizeof(err)) != 0)
		qbd_log(QB_LOG_WARNING, "%s; LISTEN is tried again at the next connection", err);
	qb_config_free(cfg);

	qbd_log(QB_LOG_INFO, "started");
	rc = qbd_role_run(sh, kind, index, &host, &store, name);
	qb_pq_store_free(pq);
	qb_odbc_store_free(odbc);
	return rc;
}
