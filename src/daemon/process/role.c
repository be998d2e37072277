/*-------------------------------------------------------------------------
 * role.c
 *	  The body of a role process: one engine, its store (from the backend
 *	  that serves database.url) and the daemon's host, from the fork to the
 *	  exit.
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
#include "qbd_backend.h"
#include "role.h"
#include "qb_consume.h"
#include "qb_ingress.h"
#include "qb_outbox.h"
#include "qb_relay.h"

/* qbd_role_name: see role.h. */
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

/* qbd_role_main: see role.h. */
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
	QbdDb		db;
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
	db.ops = qbd_backend_for(cfg->database.url);
	if ((db.store = db.ops->store_new(cfg, app, sh->pooled != 0, &store, err, sizeof(err))) == NULL)
	{
		qbd_log(QB_LOG_ERROR, "%s", err);
		qb_config_free(cfg);
		return 1;
	}
	if (qbd_host_start(&dh, sh, kind, &db, &host, &store, err, sizeof(err)) != 0)
	{
		qbd_log(QB_LOG_ERROR, "%s", err);
		db.ops->store_free(db.store);
		qb_config_free(cfg);
		return 1;
	}
	if (db.ops->store_connect(db.store, err, sizeof(err)) != 0)
		qbd_log(QB_LOG_WARNING, "%s; retrying", err);
	/*
	 * no LISTEN where notifications do not arrive (the supervisor said why;
	 * a backend without notifications refused database.listen)
	 */
	if (cfg->database.listen && !sh->pooled && (kind == QBD_ROLE_OUTBOX || kind == QBD_ROLE_RELAY) &&
		qbd_host_listen(&dh, kind == QBD_ROLE_OUTBOX ? "queuebox_outbox" : "queuebox_inbox",
						err, sizeof(err)) != 0)
		qbd_log(QB_LOG_WARNING, "%s; LISTEN is tried again at the next connection", err);
	qb_config_free(cfg);

	qbd_log(QB_LOG_INFO, "started");
	rc = qbd_role_run(sh, kind, index, &host, &store, name);
	db.ops->store_free(db.store);
	return rc;
}
