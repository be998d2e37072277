/*-------------------------------------------------------------------------
 * latency.c
 *	  Phase D of bench/outbox-http: insert outbox rows one per transaction at
 *	  a low, fixed rate and record when each transaction was committed.
 *
 * Build:
 *	cc -std=gnu11 -O2 -Wall -Wextra -o latency bench/latency.c \
 *		-I$(pg_config --includedir) -L$(pg_config --libdir) -lpq
 *
 * Usage:
 *	latency CONNINFO [COUNT=200] [RATE_PER_S=50] [TOPIC=latency.event]
 *
 * For seq = 0 .. COUNT-1, at start + seq / RATE seconds:
 *	BEGIN;
 *	INSERT INTO queuebox.outbox (topic, key, payload) VALUES (TOPIC, 'lat-' || seq % 100, '{"seq": seq}');
 *	t_before_commit = CLOCK_REALTIME in microseconds
 *	COMMIT;
 * and prints one line per row on stdout: "seq t_before_commit_us commit_us"
 * (commit_us: how long the COMMIT round trip took).  The caller joins these
 * lines with the sink's log (t_us at receipt of the body) by seq.
 *
 * Bounded: COUNT <= 100000, RATE in 1..10000, and the run stops after
 * COUNT / RATE + 60 seconds whatever happens.
 *-------------------------------------------------------------------------
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <libpq-fe.h>

static int64_t
now_us(clockid_t clk)
{
	struct timespec ts;

	clock_gettime(clk, &ts);
	return (int64_t) ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static void
sleep_until_us(int64_t target_mono_us)
{
	struct timespec ts;

	ts.tv_sec = target_mono_us / 1000000;
	ts.tv_nsec = (target_mono_us % 1000000) * 1000;
	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) != 0)
		;
}

static int
exec_ok(PGconn *c, const char *sql, ExecStatusType want)
{
	PGresult   *r = PQexec(c, sql);
	int			ok = PQresultStatus(r) == want;

	if (!ok)
		fprintf(stderr, "latency: %s: %s", sql, PQerrorMessage(c));
	PQclear(r);
	return ok;
}

int
main(int argc, char **argv)
{
	if (argc < 2)
	{
		fprintf(stderr, "usage: latency CONNINFO [COUNT=200] [RATE_PER_S=50] [TOPIC=latency.event]\n");
		return 2;
	}
	const char *conninfo = argv[1];
	long		count = argc > 2 ? strtol(argv[2], NULL, 10) : 200;
	long		rate = argc > 3 ? strtol(argv[3], NULL, 10) : 50;
	const char *topic = argc > 4 ? argv[4] : "latency.event";

	if (count < 1 || count > 100000 || rate < 1 || rate > 10000)
	{
		fprintf(stderr, "latency: COUNT must be 1..100000 and RATE 1..10000\n");
		return 2;
	}

	PGconn	   *c = PQconnectdb(conninfo);

	if (PQstatus(c) != CONNECTION_OK)
	{
		fprintf(stderr, "latency: connect: %s", PQerrorMessage(c));
		PQfinish(c);
		return 1;
	}

	const char *ins =
		"INSERT INTO queuebox.outbox (topic, key, payload) "
		"VALUES ($1, 'lat-' || ($2::int % 100), jsonb_build_object('seq', $2::int))";
	PGresult   *pr = PQprepare(c, "ins", ins, 0, NULL);

	if (PQresultStatus(pr) != PGRES_COMMAND_OK)
	{
		fprintf(stderr, "latency: prepare: %s", PQerrorMessage(c));
		PQclear(pr);
		PQfinish(c);
		return 1;
	}
	PQclear(pr);

	int64_t		start = now_us(CLOCK_MONOTONIC) + 10000;
	int64_t		hard_stop = start + (count * 1000000LL) / rate + 60 * 1000000LL;
	int			rc = 0;

	for (long seq = 0; seq < count; seq++)
	{
		sleep_until_us(start + (seq * 1000000LL) / rate);
		if (now_us(CLOCK_MONOTONIC) > hard_stop)
		{
			fprintf(stderr, "latency: time limit reached at seq %ld\n", seq);
			rc = 1;
			break;
		}

		char		seqbuf[32];
		const char *params[2] = {topic, seqbuf};

		snprintf(seqbuf, sizeof(seqbuf), "%ld", seq);
		if (!exec_ok(c, "BEGIN", PGRES_COMMAND_OK))
		{
			rc = 1;
			break;
		}
		PGresult   *r = PQexecPrepared(c, "ins", 2, params, NULL, NULL, 0);

		if (PQresultStatus(r) != PGRES_COMMAND_OK)
		{
			fprintf(stderr, "latency: insert: %s", PQerrorMessage(c));
			PQclear(r);
			rc = 1;
			break;
		}
		PQclear(r);

		int64_t		t_before = now_us(CLOCK_REALTIME);
		int64_t		m0 = now_us(CLOCK_MONOTONIC);

		if (!exec_ok(c, "COMMIT", PGRES_COMMAND_OK))
		{
			rc = 1;
			break;
		}
		printf("%ld %lld %lld\n", seq, (long long) t_before,
			   (long long) (now_us(CLOCK_MONOTONIC) - m0));
	}
	fflush(stdout);
	PQfinish(c);
	return rc;
}
