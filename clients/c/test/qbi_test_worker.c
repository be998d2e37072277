/*
 * qbi_test_worker.c
 *	  A worker process for TAP 032's process scenarios (two workers on one
 *	  source, kill -9 mid-handler): it runs libqueuebox-inbox on source
 *	  "jobs" until SIGTERM, its handler idempotent as the spec says: the
 *	  business row is keyed by (source, idempotency key), so a message run
 *	  twice (a lease taken over after a kill) applies once.
 *
 *	  qbi_test_worker CONNINFO NAME LEASE_MS HANDLER_MS [BATCH [SOURCE]]
 *
 *	  HANDLER_MS -1: a no-op handler (bench/pull measures the library's own
 *	  cost with it).
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "queuebox_inbox.h"

static QbiWorker *worker;
static const char *name;
static long handler_ms;

static void
on_term(int sig)
{
	qbi_worker_stop(worker);
}

static int
handle(void *arg, const QbiMessage *m, PGconn *tx, const volatile bool *cancelled,
	   char *err, size_t errlen)
{
	const char *v[3] = {m->source, m->idempotency_key, name};
	PGresult   *r;

	if (handler_ms < 0)
		return 0;

	/* the effect first, then the slow part: a kill in between leaves it uncommitted */
	r = PQexecParams(tx, "INSERT INTO effects (source, idempotency_key, worker) VALUES ($1, $2, $3)"
					 " ON CONFLICT (source, idempotency_key) DO NOTHING", 3, NULL, v, NULL, NULL, 0);
	if (PQresultStatus(r) != PGRES_COMMAND_OK)
	{
		snprintf(err, errlen, "%s", PQresultErrorMessage(r));
		PQclear(r);
		return -1;
	}
	PQclear(r);
	for (long t = 0; t < handler_ms && !*cancelled; t += 10)
		usleep(10 * 1000);
	return *cancelled ? -1 : 0;
}

int
main(int argc, char **argv)
{
	char		err[QBI_ERRLEN];
	QbiCounters c;

	if (argc < 5 || argc > 7)
	{
		fprintf(stderr, "usage: qbi_test_worker CONNINFO NAME LEASE_MS HANDLER_MS [BATCH [SOURCE]]\n");
		return 2;
	}
	name = argv[2];
	handler_ms = atol(argv[4]);
	worker = qbi_worker_new(&(QbiOptions) {.conninfo = argv[1], .source = argc > 6 ? argv[6] : "jobs",
		.batch_size = argc > 5 ? atoi(argv[5]) : 5,
		.lease_ms = atol(argv[3]), .idle_ms = 50, .shutdown_grace_ms = 5000}, err, sizeof(err));
	if (worker == NULL)
	{
		fprintf(stderr, "%s\n", err);
		return 2;
	}
	signal(SIGTERM, on_term);
	printf("ready\n");
	fflush(stdout);
	if (qbi_worker_run(worker, handle, NULL, err, sizeof(err)) != 0)
	{
		fprintf(stderr, "%s\n", err);
		return 1;
	}
	qbi_worker_counters(worker, &c);
	printf("%s: claimed %ld completed %ld retried %ld dead %ld lease_lost %ld\n", name, c.claimed,
		   c.completed, c.retried, c.dead, c.lease_lost);
	qbi_worker_free(worker);
	return 0;
}
