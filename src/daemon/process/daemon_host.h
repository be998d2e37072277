/*-------------------------------------------------------------------------
 * daemon_host.h
 *	  The daemon's QbHost (daemon_host.c): one per role process.
 *-------------------------------------------------------------------------
 */
#ifndef DAEMON_HOST_H
#define DAEMON_HOST_H

#include "qb_host.h"
#include "qb_store.h"
#include "qbd.h"
#include "qbd_backend.h"
#include "role.h"

typedef struct QbdHost
{
	QbdShared  *shared;
	QbEngineKind kind;
	QbdDb		db;				/* the role's store and its backend; db.store NULL: none */
	bool		listening;
	uint64_t	loaded_gen;		/* the document generation last loaded */
	bool		loaded_once;
	long		poll_base_ms;	/* the engine's poll interval (0: no idle polling) */
	long		idle_max_ms;	/* database.idlePollMaxMs */
	int			idle_streak;	/* idle polls in a row that found nothing */
	bool		last_timed_out; /* the last wait was an idle one that ran out */
} QbdHost;

/*
 * Fill host (and store->config_load, when store is not NULL) for a role
 * whose database is db (NULL: none); installs the role's signal handlers.
 * 0, or -1 with err.
 */
extern int	qbd_host_start(QbdHost *h, QbdShared *sh, QbEngineKind kind, const QbdDb *db,
						   QbHost *host, QbStore *store, char *err, size_t errlen);
/* LISTEN on channel through the role's store; wakes come from then on */
extern int	qbd_host_listen(QbdHost *h, const char *channel, char *err, size_t errlen);
/* The timeout an engine's wait takes after idle polls (daemon_host.c). */
extern long qbd_host_idle_timeout(QbdHost *h, int fd, long timeout_ms);

#endif							/* DAEMON_HOST_H */
