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
 * not start (its host or store table incomplete included); the supervisor
 * restarts it either way unless it is stopping.
 *
 * On PostgreSQL the role's store commits asynchronously (pq_backend.c), as
 * the extension's workers do by default (queuebox.worker_async_commit),
 * but for the relay's forward and the inbox insert: a crash of the server
 * can lose a settle, and the row is delivered again, never lost.  SQL
 * Server commits durably.
 *-------------------------------------------------------------------------
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/prctl.h>

#include "daemon_host.h"
#include "qb_otlp.h"
#include "qbd_backend.h"
#include "role.h"

/* qbd_role_run: the engine of the role, with its stop line logged at the end. */
static int
qbd_role_run(QbEngineKind kind, int index, const QbHost *host, const QbStore *store,
			 const char *name)
{
	const QbEngine *engine = qb_engine(kind);
	QbEngineStats stats;
	char		err[QB_ERRLEN] = "";
	char		line[256];
	char		detail[256];

	memset(&stats, 0, sizeof(stats));
	if (qb_engine_tables_check(host, store, name, err, sizeof(err)) != 0 ||
		engine->run(host, store, index, &stats, err, sizeof(err)) != 0)
	{
		qbd_log(QB_LOG_ERROR, "%s could not start: %s", name, err);
		return 1;
	}
	/* the spans of the last attempts, for up to 2 s (qb_otlp.h) */
	qb_otlp_shutdown(&qbd_runtime()->otlp, 2000);
	qb_worker_set(host->worker, QB_W_STOPPED);
	/* the daemon's line has no detail (the extension's outbox logs one) */
	engine->stats(&stats, line, sizeof(line), detail, sizeof(detail));
	qbd_log(QB_LOG_INFO, "stopped: %s", line);
	return 0;
}

/* qbd_role_main: see role.h. */
int
qbd_role_main(QbdShared *sh, QbEngineKind kind, int index)
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

	qb_engine_name(kind, index, name, sizeof(name));
	qbd_log_init(name, false);
	prctl(PR_SET_PDEATHSIG, SIGTERM);
	/* ps: "queuebox-mssqld: outbox 0"; top's comm keeps 15 bytes: "qb outbox 12" */
	qbd_ps_set(name);
	snprintf(title, sizeof(title), "qb %.12s", name);
	prctl(PR_SET_NAME, title);

	/* the supervisor published a valid document before it forked */
	doc = qbd_shared_read(sh, &gen);
	if (doc == NULL || qb_config_parse(doc, strlen(doc), &qbd_config_env, &cfg, err, sizeof(err)) != 0)
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
	if (cfg->database.listen && !sh->pooled && (kind == QB_ENGINE_OUTBOX || kind == QB_ENGINE_RELAY) &&
		qbd_host_listen(&dh, kind == QB_ENGINE_OUTBOX ? "queuebox_outbox" : "queuebox_inbox",
						err, sizeof(err)) != 0)
		qbd_log(QB_LOG_WARNING, "%s; LISTEN is tried again at the next connection", err);
	qb_config_free(cfg);

	qbd_log(QB_LOG_INFO, "started");
	host.worker = qb_metrics_worker(host.metrics, name, (int) getpid());
	/* the supervisor gives back its places when it reaps it (supervisor.c) */
	host.limit_holder = qb_limits_holder(host.limits, name, (int) getpid());
	rc = qbd_role_run(kind, index, &host, &store, name);
	db.ops->store_free(db.store);
	return rc;
}
