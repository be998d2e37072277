/*-------------------------------------------------------------------------
 * qbd.h
 *	  queuebox-mssqld, the daemon host: its private declarations.
 *
 * Wording:
 *	- The supervisor is the process started from the command line.  It reads
 *	  and validates the configuration file, migrates the schema, and forks
 *	  one process per role; it never runs an engine, opens no HTTP client and
 *	  starts no thread, so every fork happens before any library starts one
 *	  (librdkafka and cnats start threads, the transform helper forks).
 *	- A role is one engine in one process: an outbox worker (one per
 *	  daemon.outboxWorkers), the relay, the ingress, and one consumer per
 *	  broker source (its slot).  A role that exits unasked is restarted after
 *	  a delay that doubles with each quick crash (qbd_restart_delay).
 *	- The shared block (QbdShared) is one anonymous shared mapping made
 *	  before the first fork: the metrics every role counts into, and the
 *	  configuration document in force, which only the supervisor writes.
 *	- The document generation counts the documents published; a role whose
 *	  generation is behind reloads.  It is a seqlock: odd while the
 *	  supervisor writes, and a reader copies again when it moved.
 *
 * Signals: the supervisor turns SIGHUP (reload), SIGTERM/SIGINT (stop) and
 * SIGCHLD into bytes on a self-pipe its loop polls; a role turns SIGTERM
 * into its stop flag and SIGHUP (sent by the supervisor after publishing a
 * document) into a wake, both through its own self-pipe.
 *-------------------------------------------------------------------------
 */
#ifndef QBD_H
#define QBD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "qb_config.h"
#include "qb_host.h"
#include "qb_metrics.h"

/* The largest configuration document the daemon takes (the shared slot). */
#define QBD_DOC_MAX			(1024 * 1024)
/* how long the supervisor waits for its probe NOTIFY (supervisor.c) */
#define QBD_PROBE_MS		3000
/* The schema of this build (the Makefile's EXTVERSION) */
extern const char qbd_schema_version[];

/*
 * The schemas the daemon installs, and its upgrade steps, one per
 * sql/schema/upgrade/<from>--<to>.sql (PostgreSQL) and
 * sql/sqlserver/upgrade/ (SQL Server), in version order, ended by a step
 * whose from is NULL: made by scripts/embed-schema.sh.
 */
typedef struct QbdUpgrade
{
	const char *from;
	const char *to;
	const char *sql;
} QbdUpgrade;

extern const char qbd_schema_pg[];
extern const char qbd_schema_mssql[];
extern const QbdUpgrade qbd_upgrades_pg[];
extern const QbdUpgrade qbd_upgrades_mssql[];

/* ---- log.c: one line per event on stderr, text or JSON ---------------- */
extern void qbd_log_init(const char *role, bool json);
extern void qbd_log_set_json(bool json);
extern void qbd_log(QbLogLevel level, const char *fmt,...)
			__attribute__((format(printf, 2, 3)));
/* one log line into buf (no newline): what qbd_log writes, for the tests */
extern size_t qbd_log_format(char *buf, size_t len, bool json, double epoch,
							 const char *role, int pid, QbLogLevel level,
							 const char *msg);
/*
 * The URL with its password replaced by "***", into buf: what the daemon
 * says of a database URL (log lines, --check).
 */
extern void qbd_redact_url(const char *url, char *buf, size_t len);

/* ---- ps_title.c: what ps and top show --------------------------------- */
/*
 * Move argv and environ aside so that titles may use their memory; main()
 * calls it first and uses the copy of argv it returns.
 */
extern char **qbd_ps_init(int argc, char **argv);
/* the process title "queuebox-mssqld: <role>" ("supervisor", "outbox 0", ...) */
extern void qbd_ps_set(const char *role);

/* ---- shared.c: the block the supervisor shares with every role -------- */
typedef struct QbdShared
{
	QbMetrics	metrics;
	/*
	 * 1: a NOTIFY did not reach a LISTEN through database.url (a pooler in
	 * transaction mode): the roles neither LISTEN nor prepare statements by
	 * name.  The supervisor writes it before it forks the roles that read it.
	 */
	volatile int pooled;
	uint64_t	doc_gen;		/* seqlock: odd while the supervisor writes */
	size_t		doc_len;
	char		doc[QBD_DOC_MAX];
} QbdShared;

extern QbdShared *qbd_shared_create(char *err, size_t errlen);
extern void qbd_shared_publish(QbdShared *sh, const char *doc, size_t len);
/* a malloc'd copy of the document in force, and its generation; NULL: none */
extern char *qbd_shared_read(QbdShared *sh, uint64_t *gen);
extern uint64_t qbd_shared_gen(const QbdShared *sh);

/* ---- roles and the supervisor (supervisor.c, role.c) ------------------ */
typedef enum QbdRoleKind
{
	QBD_ROLE_OUTBOX,
	QBD_ROLE_RELAY,
	QBD_ROLE_INGRESS,
	QBD_ROLE_CONSUMER
} QbdRoleKind;

typedef struct QbdRole
{
	QbdRoleKind kind;
	int			index;			/* outbox worker number, consumer slot */
	pid_t		pid;			/* 0: not running */
	long		started_ms;		/* qb_now_ms() at its fork */
	int			crashes;		/* quick exits in a row */
	long		restart_at_ms;	/* when not running: when to fork it again */
	bool		retired;		/* no longer wanted (a reload shrank the set) */
} QbdRole;

/* "outbox 0", "relay", "ingress", "consumer 1" */
extern void qbd_role_name(QbdRoleKind kind, int index, char *buf, size_t len);

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
/* What the daemon needs beyond the validator (database.url, its scheme). */
extern int	qbd_config_check_daemon(const QbConfig *cfg, char *err, size_t errlen);

extern int	qbd_supervise(const QbdOptions *opt, char *text, QbConfig *cfg);
/* --migrate: the schema and the config tables, then return (0 or -1) */
extern int	qbd_migrate_only(const QbConfig *cfg, char *err, size_t errlen);

/* role.c: the body of a forked role process; returns its exit status */
extern int	qbd_role_main(QbdShared *sh, QbdRoleKind kind, int index);

/* ---- migrate.c: the schema without the extension ---------------------- */
struct pg_conn;
extern int	qbd_migrate(struct pg_conn *conn, bool *installed, char *err, size_t errlen);
/*
 * What the daemon writes for the SQL functions that follow the
 * configuration (route_of, destination_status): its routes and
 * destinations, and whether the tables notify at commit (database.listen).
 */
extern int	qbd_publish_config(struct pg_conn *conn, const QbConfig *cfg,
							   char *err, size_t errlen);

/* ---- odbc_migrate.c: the SQL Server schema (docs/sqlserver.md) -------- */
struct QbOdbcConn;
/* as qbd_migrate, under sp_getapplock; one transaction, committed or rolled back */
extern int	qb_mssql_migrate(struct QbOdbcConn *c, bool *installed, char *err, size_t errlen);
/* as qbd_publish_config: the routes and destination names, one transaction */
extern int	qb_mssql_publish_config(struct QbOdbcConn *c, const QbConfig *cfg,
									char *err, size_t errlen);
/* split a T-SQL script on its GO lines; fn's first non-zero answer, or 0 */
extern int	qb_mssql_batches(const char *script, int (*fn) (void *arg, const char *batch), void *arg);

/* the database a URL names: true for sqlserver:// (the ODBC store), else PostgreSQL */
extern bool qbd_is_sqlserver(const char *url);

#endif							/* QBD_H */
