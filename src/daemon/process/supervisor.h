/*-------------------------------------------------------------------------
 * supervisor.h
 *	  The daemon's first process (supervisor.c): the configuration file,
 *	  the schema, and the role table; main.c's entry points and the
 *	  policy the unit tests check.
 *-------------------------------------------------------------------------
 */
#ifndef QBD_SUPERVISOR_H
#define QBD_SUPERVISOR_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "qbd.h"
#include "role.h"

/* one entry of the role table */
typedef struct QbdRole
{
	QbEngineKind kind;
	int			index;			/* outbox worker number, consumer slot */
	pid_t		pid;			/* 0: not running */
	long		started_ms;		/* qb_now_ms() at its fork */
	int			crashes;		/* quick exits in a row */
	long		restart_at_ms;	/* when not running: when to fork it again */
	bool		retired;		/* no longer wanted (a reload shrank the set) */
} QbdRole;

/*
 * The roles a configuration wants: daemon.outboxWorkers outbox workers, the
 * relay, the ingress, one consumer per broker source, in that order.
 * Returns how many were written (at most max).
 */
extern int	qbd_roles_wanted(const QbConfig *cfg, QbdRole *roles, int max);

/*
 * How long to wait before forking a role again after it exited: 0 for its
 * first exit after a long run, then 1 s doubling to 60 s for exits that
 * come quickly after a start (a crash loop: a wrong password, a port in
 * use), so the daemon neither spins nor gives up.
 */
#define QBD_RESTART_MIN_MS	1000L
#define QBD_RESTART_MAX_MS	60000L
#define QBD_RESTART_STABLE_MS 30000L	/* ran this long: not a crash loop */
extern long qbd_restart_delay(int crashes);
/* after an exit at now_ms: count the crash and set the role's restart time */
extern void qbd_role_exited(QbdRole *r, long now_ms);

/*
 * Two configurations that need the roles restarted to go from one to the
 * other (another database, other timeouts): the roles open their store
 * with these at start.
 */
extern bool qbd_database_changed(const QbConfig *a, const QbConfig *b);

/* Threads of this process, from /proc/self/status (-1: unknown). */
extern int	qbd_thread_count(void);

typedef struct QbdOptions
{
	const char *config_path;
} QbdOptions;

/* Read and validate the file: 0 and *text / *cfg, or -1 with err. */
extern int	qbd_config_read(const char *path, char **text, QbConfig **cfg,
							char *err, size_t errlen);
/* What the daemon needs beyond the validator: database.url, and what its backend checks. */
extern int	qbd_config_check_daemon(const QbConfig *cfg, char *err, size_t errlen);

extern int	qbd_supervise(const QbdOptions *opt, char *text, QbConfig *cfg);
/* --migrate: the schema and the config tables, then return (0 or -1) */
extern int	qbd_migrate_only(const QbConfig *cfg, char *err, size_t errlen);

#endif							/* QBD_SUPERVISOR_H */
