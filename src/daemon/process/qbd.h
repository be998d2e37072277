/*-------------------------------------------------------------------------
 * qbd.h
 *	  queuebox-mssqld's process: what every part of it shares (the log,
 *	  the process title, the shared block).  role.h and supervisor.h have
 *	  the roles and the supervisor; backend/qbd_backend.h the databases.
 *
 * Wording:
 *	- The supervisor is the process started from the command line: it
 *	  validates the configuration, migrates the schema and forks one
 *	  process per role; it never runs an engine nor starts a thread, so
 *	  every fork comes before a library starts one.
 *	- A role is one engine in one process: an outbox worker (one per
 *	  daemon.outboxWorkers), the relay, the ingress, one consumer per broker
 *	  source.  One that exits unasked is restarted after a delay that
 *	  doubles with each quick crash (qbd_restart_delay).
 *	- The shared block (QbdShared) is one anonymous shared mapping made
 *	  before the first fork: the metrics, the destinations' limits (a role
 *	  takes its holder by name when it starts, which gives back what its
 *	  predecessor held; the supervisor gives back a dead role's at once,
 *	  when it reaps it), and the document in force, which only the
 *	  supervisor writes.  Its generation counts the documents
 *	  published (a seqlock: odd while written); a role behind reloads.
 *
 * Signals: the supervisor turns SIGHUP (reload), SIGTERM/SIGINT (stop) and
 * SIGCHLD into bytes on a self-pipe its loop polls; a role turns SIGTERM
 * into its stop flag and SIGHUP into a wake, through its own self-pipe.
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
#include "qb_limits.h"
#include "qb_metrics.h"

/* The largest configuration document the daemon takes (the shared slot): either host's. */
#define QBD_DOC_MAX			QB_CONFIG_DOC_MAX

/* ---- log.c: one line per event on stderr, text or JSON ---------------- */
extern void qbd_log_init(const char *role, bool json);
extern void qbd_log_set_json(bool json);
extern void qbd_log(QbLogLevel level, const char *fmt,...)
			__attribute__((format(printf, 2, 3)));
/* one log line into buf (no newline): what qbd_log writes, for the tests */
extern size_t qbd_log_format(char *buf, size_t len, bool json, double epoch,
							 const char *role, int pid, QbLogLevel level,
							 const char *msg);

/* ---- ps_title.c: what ps and top show --------------------------------- */
/*
 * Move argv and environ aside so that titles may use their memory; main()
 * calls it first and uses the copy of argv it returns.
 */
extern char **qbd_ps_init(int argc, char **argv);
/* the process title "queuebox-mssqld: <role>" ("supervisor", "outbox 0", ...) */
extern void qbd_ps_set(const char *role);

/* ---- daemon_host.c: what every daemon process gives the core ----------- */

/*
 * What the daemon allows a document, at every parse (main, supervisor,
 * roles): ${file:PATH} may read any file this process can (its operator
 * chose the user it runs as; the extension restricts the directories
 * instead); no host egress policy: the document's egress: section gives
 * the rules.
 */
extern const QbConfigEnv qbd_config_env;

/* This process's runtime (qb_runtime.h): a role's engine's, via QbHost. */
extern QbRuntime *qbd_runtime(void);

/* ---- shared.c: the block the supervisor shares with every role -------- */
typedef struct QbdShared
{
	QbMetrics	metrics;
	QbLimits	limits;			/* the destinations' limits, every role's (qb_limits.h) */
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

#endif							/* QBD_H */
