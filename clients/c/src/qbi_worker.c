/*-------------------------------------------------------------------------
 * qbi_worker.c
 *	  The pull worker of libqueuebox-inbox: claim, handle, complete, retry,
 *	  dead, with the lease renewed on a second connection.
 *
 * Wording (queuebox_inbox.h has the contract):
 *	- The work connection claims (its own transaction) and runs each
 *	  handler's transaction; the renewal connection belongs to the renewer
 *	  thread, which renews every held message every third of the lease.
 *	- Held: the messages of the current claim not finished yet; the
 *	  renewer reads them under the worker's mutex, and marks one lost
 *	  (cancelled) when its renewal changes no row.
 *	- The statements are the five of examples/pull/sql/postgresql, with
 *	  bound parameters.
 *
 * Transaction rules: a claim is committed before any handler starts; a
 * handler's writes and its completion commit together or not at all; a
 * retry or a dead letter is a transaction of its own after the rollback.
 * Nothing is left open across a wait.
 *-------------------------------------------------------------------------
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "queuebox_inbox.h"

typedef struct QbiHeld
{
	QbiMessage	msg;
	char	   *values[10];		/* the claim's columns, owned */
	volatile bool cancelled;
	bool		done;
} QbiHeld;

struct QbiWorker
{
	QbiOptions	opt;
	char	   *conninfo;
	char	   *source;
	volatile sig_atomic_t stop;
	int			wake[2];		/* stop writes a byte: waits end at once */
	pthread_mutex_t mu;
	QbiHeld    *held;			/* the current claim's messages */
	int			nheld;
	QbiCounters counters;
	long		stop_seen_ms;	/* when the renewer first saw the stop, 0: not yet */
	bool		quit_renewer;
	PGconn	   *conn;
};

static long
qbi_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000L + ts.tv_nsec / 1000000L;
}

static void
qbi_log(QbiWorker *w, QbiLogLevel level, const char *fmt,...)
{
	char		buf[QBI_ERRLEN * 2];
	va_list		ap;

	if (w->opt.logger == NULL)
		return;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	w->opt.logger(w->opt.logger_arg, level, buf);
}

/* ---- the policies ------------------------------------------------------- */

QbiDecision
qbi_retry_after(long delay_ms)
{
	return (QbiDecision) {.dead = false, .delay_ms = delay_ms < 0 ? 0 : delay_ms};
}

QbiDecision
qbi_dead_letter(void)
{
	return (QbiDecision) {.dead = true};
}

/* qbi_default_policy: see queuebox_inbox.h. */
QbiDecision
qbi_default_policy(void *arg, const QbiMessage *msg, const char *error)
{
	double		delay = 1000.0;
	double		jitter;

	if (msg->attempt + 1 >= 5)
		return qbi_dead_letter();
	for (int i = 0; i < msg->attempt && delay < 300000.0; i++)
		delay *= 2;
	if (delay > 300000.0)
		delay = 300000.0;
	/* +-20 %: a burst of failures does not come back as one burst */
	jitter = 0.8 + 0.4 * ((double) rand() / RAND_MAX);
	return qbi_retry_after((long) (delay * jitter));
}

/* ---- the worker ---------------------------------------------------------- */

QbiWorker *
qbi_worker_new(const QbiOptions *opt, char *err, size_t errlen)
{
	QbiWorker  *w;

	if (opt == NULL || opt->conninfo == NULL || opt->source == NULL || opt->source[0] == '\0')
	{
		snprintf(err, errlen, "qbi_worker_new: conninfo and source are required");
		return NULL;
	}
	if (opt->batch_size < 0 || opt->batch_size > 10000 || opt->lease_ms < 0 ||
		(opt->lease_ms > 0 && opt->lease_ms < 100) || opt->shutdown_grace_ms < 0 || opt->idle_ms < 0)
	{
		snprintf(err, errlen,
				 "qbi_worker_new: batch_size is 1 to 10000, lease_ms at least 100, shutdown_grace_ms and idle_ms 0 or more (0: the default)");
		return NULL;
	}
	if ((w = calloc(1, sizeof(*w))) == NULL)
	{
		snprintf(err, errlen, "qbi_worker_new: out of memory");
		return NULL;
	}
	w->opt = *opt;
	w->conninfo = strdup(opt->conninfo);
	w->source = strdup(opt->source);
	w->opt.conninfo = w->conninfo;
	w->opt.source = w->source;
	if (w->opt.batch_size == 0)
		w->opt.batch_size = 10;
	if (w->opt.lease_ms == 0)
		w->opt.lease_ms = 30000;
	if (w->opt.shutdown_grace_ms == 0)
		w->opt.shutdown_grace_ms = 30000;
	if (w->opt.idle_ms == 0)
		w->opt.idle_ms = 500;
	if (w->opt.policy == NULL)
		w->opt.policy = qbi_default_policy;
	w->wake[0] = w->wake[1] = -1;
	if (w->conninfo == NULL || w->source == NULL || pipe2(w->wake, O_NONBLOCK | O_CLOEXEC) != 0)
	{
		snprintf(err, errlen, "qbi_worker_new: %s", w->conninfo && w->source ? strerror(errno) : "out of memory");
		qbi_worker_free(w);
		return NULL;
	}
	pthread_mutex_init(&w->mu, NULL);
	return w;
}

void
qbi_worker_stop(QbiWorker *w)
{
	char		c = 1;

	w->stop = 1;
	if (write(w->wake[1], &c, 1) < 0)
	{
		/* the pipe is full: a wake is pending already */
	}
}

void
qbi_worker_counters(const QbiWorker *w, QbiCounters *out)
{
	pthread_mutex_lock((pthread_mutex_t *) &w->mu);
	*out = w->counters;
	pthread_mutex_unlock((pthread_mutex_t *) &w->mu);
}

void
qbi_worker_free(QbiWorker *w)
{
	if (w == NULL)
		return;
	if (w->wake[0] >= 0)
		close(w->wake[0]);
	if (w->wake[1] >= 0)
		close(w->wake[1]);
	PQfinish(w->conn);
	free(w->conninfo);
	free(w->source);
	free(w);
}

/* qbi_wait: up to ms, or until a stop; true when stopping. */
static bool
qbi_wait(QbiWorker *w, long ms)
{
	struct pollfd p = {.fd = w->wake[0], .events = POLLIN};

	if (!w->stop)
		(void) poll(&p, 1, (int) ms);
	return w->stop;
}

static void
qbi_count(QbiWorker *w, long *counter)
{
	pthread_mutex_lock(&w->mu);
	(*counter)++;
	pthread_mutex_unlock(&w->mu);
}

/* qbi_exec: one statement with text parameters; the result when it went well, else NULL with err. */
static PGresult *
qbi_exec(PGconn *c, const char *sql, int n, const char *const *v, char *err, size_t errlen)
{
	PGresult   *r = PQexecParams(c, sql, n, NULL, v, NULL, NULL, 0);

	if (PQresultStatus(r) == PGRES_TUPLES_OK || PQresultStatus(r) == PGRES_COMMAND_OK)
		return r;
	snprintf(err, errlen, "%s", r ? PQresultErrorMessage(r) : PQerrorMessage(c));
	err[strcspn(err, "\n")] = '\0';
	PQclear(r);
	return NULL;
}

static bool
qbi_command(PGconn *c, const char *sql, char *err, size_t errlen)
{
	PGresult   *r = qbi_exec(c, sql, 0, NULL, err, errlen);

	PQclear(r);
	return r != NULL;
}

/* qbi_flag: the one boolean answer of a statement, false on failure too (err set) */
static bool
qbi_flag(PGconn *c, const char *sql, int n, const char *const *v, char *err, size_t errlen)
{
	PGresult   *r = qbi_exec(c, sql, n, v, err, errlen);
	bool		t = r != NULL && PQntuples(r) == 1 && strcmp(PQgetvalue(r, 0, 0), "t") == 0;

	PQclear(r);
	return t;
}

/* ---- the renewer ------------------------------------------------------------- */

static void *
qbi_renewer(void *arg)
{
	QbiWorker  *w = arg;
	PGconn	   *c = NULL;
	long		every = w->opt.lease_ms / 3;
	long		next = qbi_now_ms() + every;
	char		err[QBI_ERRLEN];

	for (;;)
	{
		bool		quit;
		long		now = qbi_now_ms();

		pthread_mutex_lock(&w->mu);
		quit = w->quit_renewer;
		/* past the shutdown grace the running handler is cancelled */
		if (w->stop && w->stop_seen_ms == 0)
			w->stop_seen_ms = now;
		if (w->stop && now - w->stop_seen_ms >= w->opt.shutdown_grace_ms)
			for (int i = 0; i < w->nheld; i++)
				w->held[i].cancelled = true;
		pthread_mutex_unlock(&w->mu);
		if (quit)
			break;
		if (now >= next)
		{
			next = now + every;
			if (c == NULL || PQstatus(c) != CONNECTION_OK)
			{
				PQfinish(c);
				c = PQconnectdb(w->conninfo);
			}
			pthread_mutex_lock(&w->mu);
			for (int i = 0; i < w->nheld && PQstatus(c) == CONNECTION_OK; i++)
			{
				QbiHeld    *h = &w->held[i];
				char		id[24];
				char		lease[24];
				const char *v[3] = {id, h->msg.claim_token, lease};

				if (h->done || h->cancelled)
					continue;
				snprintf(id, sizeof(id), "%lld", (long long) h->msg.id);
				snprintf(lease, sizeof(lease), "%ld", w->opt.lease_ms);
				err[0] = '\0';
				if (!qbi_flag(c, "SELECT queuebox.inbox_renew($1, $2, $3)", 3, v, err, sizeof(err)))
				{
					/* a failed statement is not a lost lease: the next round tries again */
					if (err[0] != '\0')
						continue;
					h->cancelled = true;
				}
			}
			pthread_mutex_unlock(&w->mu);
		}
		usleep(20 * 1000);
	}
	PQfinish(c);
	return NULL;
}

/* ---- one message ------------------------------------------------------------- */

static void
qbi_handle(QbiWorker *w, QbiHeld *h, QbiHandler handler, void *arg)
{
	char		err[QBI_ERRLEN] = "";
	char		serr[QBI_ERRLEN];
	char		id[24];
	const char *v2[2] = {id, h->msg.claim_token};
	int			rc;

	snprintf(id, sizeof(id), "%lld", (long long) h->msg.id);
	if (!qbi_command(w->conn, "BEGIN", serr, sizeof(serr)))
	{
		qbi_log(w, QBI_LOG_WARNING, "message %s: could not begin: %s", id, serr);
		return;
	}
	rc = handler(arg, &h->msg, w->conn, &h->cancelled, err, sizeof(err));
	if (rc == 0 && !h->cancelled)
	{
		if (qbi_flag(w->conn, "SELECT queuebox.inbox_complete($1, $2)", 2, v2, serr, sizeof(serr)) &&
			qbi_command(w->conn, "COMMIT", serr, sizeof(serr)))
		{
			qbi_count(w, &w->counters.completed);
			return;
		}
		/* another worker owns it: none of the handler's writes stay */
		qbi_command(w->conn, "ROLLBACK", serr, sizeof(serr));
		qbi_count(w, &w->counters.lease_lost);
		qbi_log(w, QBI_LOG_WARNING, "message %s: the completion changed no row (the lease was lost); rolled back", id);
		return;
	}
	qbi_command(w->conn, "ROLLBACK", serr, sizeof(serr));
	if (h->cancelled)
	{
		/* lost, or past the shutdown grace: nothing completed, no attempt spent */
		if (!w->stop)
			qbi_count(w, &w->counters.lease_lost);
		qbi_log(w, QBI_LOG_WARNING, "message %s: cancelled (%s); rolled back",
				id, w->stop ? "the shutdown grace ran out" : "the lease was lost");
		return;
	}
	{
		QbiDecision d = w->opt.policy(w->opt.policy_arg, &h->msg, err[0] ? err : "the handler failed");
		char		delay[24];
		const char *v4[4] = {id, h->msg.claim_token, delay, err[0] ? err : "the handler failed"};
		const char *v3[3] = {id, h->msg.claim_token, v4[3]};

		snprintf(delay, sizeof(delay), "%ld", d.delay_ms);
		if (d.dead ? qbi_flag(w->conn, "SELECT queuebox.inbox_dead($1, $2, $3)", 3, v3, serr, sizeof(serr)) :
			qbi_flag(w->conn, "SELECT queuebox.inbox_retry($1, $2, $3, $4)", 4, v4, serr, sizeof(serr)))
			qbi_count(w, d.dead ? &w->counters.dead : &w->counters.retried);
		else
			qbi_log(w, QBI_LOG_WARNING, "message %s: the %s changed no row (the lease was lost)", id,
					d.dead ? "dead letter" : "retry");
	}
}

/* ---- the loop -------------------------------------------------------------------- */

static void
qbi_held_free(QbiWorker *w)
{
	pthread_mutex_lock(&w->mu);
	for (int i = 0; i < w->nheld; i++)
		for (int k = 0; k < 10; k++)
			free(w->held[i].values[k]);
	free(w->held);
	w->held = NULL;
	w->nheld = 0;
	pthread_mutex_unlock(&w->mu);
}

/* qbi_claim: one claim, committed; the messages into w->held.  -1 with err. */
static int
qbi_claim(QbiWorker *w, char *err, size_t errlen)
{
	char		batch[16];
	char		lease[24];
	const char *v[3] = {w->source, batch, lease};
	PGresult   *r;
	QbiHeld    *held;
	int			n;

	snprintf(batch, sizeof(batch), "%d", w->opt.batch_size);
	snprintf(lease, sizeof(lease), "%ld", w->opt.lease_ms);
	if (!qbi_command(w->conn, "BEGIN", err, errlen))
		return -1;
	if ((r = qbi_exec(w->conn,
					  "SELECT id, claim_token, source, idempotency_key, event_type, aggregate_id,"
					  " payload, headers, attempt, created_at FROM queuebox.inbox_claim($1, $2, $3)",
					  3, v, err, errlen)) == NULL ||
		!qbi_command(w->conn, "COMMIT", err, errlen))
	{
		PQclear(r);
		qbi_command(w->conn, "ROLLBACK", err + strlen(err), 0);
		return -1;
	}
	n = PQntuples(r);
	held = calloc(n + 1, sizeof(QbiHeld));
	if (held == NULL)
	{
		PQclear(r);
		snprintf(err, errlen, "out of memory (the claimed messages come back when their lease ends)");
		return -1;
	}
	for (int i = 0; i < n; i++)
	{
		QbiHeld    *h = &held[i];

		for (int k = 0; k < 10; k++)
			h->values[k] = PQgetisnull(r, i, k) ? NULL : strdup(PQgetvalue(r, i, k));
		h->msg = (QbiMessage) {
			.id = strtoll(h->values[0], NULL, 10), .claim_token = h->values[1],
			.source = h->values[2], .idempotency_key = h->values[3], .event_type = h->values[4],
			.aggregate_id = h->values[5], .payload = h->values[6], .headers = h->values[7],
			.attempt = atoi(h->values[8]), .created_at = h->values[9],
		};
	}
	PQclear(r);
	pthread_mutex_lock(&w->mu);
	w->held = held;
	w->nheld = n;
	w->counters.claimed += n;
	pthread_mutex_unlock(&w->mu);
	return n;
}

/* qbi_worker_run: see queuebox_inbox.h. */
int
qbi_worker_run(QbiWorker *w, QbiHandler handler, void *arg, char *err, size_t errlen)
{
	pthread_t	renewer;

	w->conn = PQconnectdb(w->conninfo);
	if (PQstatus(w->conn) != CONNECTION_OK)
	{
		snprintf(err, errlen, "could not connect: %s", PQerrorMessage(w->conn));
		err[strcspn(err, "\n")] = '\0';
		return -1;
	}
	w->quit_renewer = false;
	if (pthread_create(&renewer, NULL, qbi_renewer, w) != 0)
	{
		snprintf(err, errlen, "could not start the renewal thread");
		return -1;
	}
	while (!w->stop)
	{
		char		cerr[QBI_ERRLEN] = "";
		int			n = qbi_claim(w, cerr, sizeof(cerr));

		if (n < 0)
		{
			qbi_log(w, QBI_LOG_WARNING, "claim failed: %s; claiming again in %ld ms", cerr, w->opt.idle_ms);
			if (PQstatus(w->conn) != CONNECTION_OK)
				PQreset(w->conn);
			qbi_wait(w, w->opt.idle_ms);
			continue;
		}
		for (int i = 0; i < n && !w->stop; i++)
		{
			QbiHeld    *h = &w->held[i];

			if (h->cancelled)
				qbi_count(w, &w->counters.lease_lost);
			else
				qbi_handle(w, h, handler, arg);
			pthread_mutex_lock(&w->mu);
			h->done = true;
			pthread_mutex_unlock(&w->mu);
		}
		/* on a stop, the messages not started are left to their lease */
		qbi_held_free(w);
		if (n == 0)
			qbi_wait(w, w->opt.idle_ms);
	}
	pthread_mutex_lock(&w->mu);
	w->quit_renewer = true;
	pthread_mutex_unlock(&w->mu);
	pthread_join(renewer, NULL);
	return 0;
}
