/*-------------------------------------------------------------------------
 * nats_fetch_check.c
 *	  TAP 015's check of the NATS consumer's fetch when messages already
 *	  wait in its subscription: the state in which cnats 3.4.1's
 *	  natsSubscription_Fetch(n) writes past its array (qb_src_nats.c,
 *	  "Fetching").
 *
 *	nats_fetch_check URL STREAM SUBJECT
 *
 * The stream must exist and be empty, capturing SUBJECT.* .  Through the
 * source's own consumer (qb_nats_consumer, batch 10):
 *	1. 8 messages are published and pulled into the subscription by a
 *	   request of ours (reply: the consumer's inbox), so 8 wait there;
 *	2. a second request of ours for 8 waits at the server (no message is
 *	   left to give it);
 *	3. fetch(10) runs while a thread publishes 10 more: the server gives 8
 *	   to our waiting request and the rest to the fetch's.  A Fetch(10)
 *	   would take the 8 waiting, ask for 2, then count past 10;
 *	4. fetch and ack until all 18 came.
 * Passes (exit 0, "ok ...") when no fetch returned more than its batch and
 * each of the 18 stream sequences came exactly once.  Run it with glibc's
 * malloc checks (TAP 015 does) so a write past an array aborts.
 *-------------------------------------------------------------------------
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <nats/nats.h>

#include "qb_consume.h"
#include "qb_src_nats.h"
#include "qb_src_nats_int.h"

#define BATCH	10
#define FIRST	8
#define LATER	10

static natsConnection *nc;
static const char *subject;

static void
die(const char *what)
{
	fprintf(stderr, "nats_fetch_check: %s (%s)\n", what,
			nats_GetLastError(NULL) ? nats_GetLastError(NULL) : "");
	exit(1);
}

static void
publish(int n)
{
	char		subj[256];

	snprintf(subj, sizeof(subj), "%s.m", subject);
	for (int i = 0; i < n; i++)
		if (natsConnection_PublishString(nc, subj, "{\"n\":1}") != NATS_OK)
			die("publish");
	if (natsConnection_Flush(nc) != NATS_OK)
		die("flush");
}

static void *
publish_later(void *arg)
{
	usleep(1000);				/* the fetch has taken what waited, and asked */
	publish(LATER);
	return NULL;
}

/* a request of ours, as if an earlier fetch had sent it and given up */
static void
request(const char *next, const char *inbox, int batch)
{
	char		body[64];

	snprintf(body, sizeof(body), "{\"batch\":%d,\"expires\":5000000000}", batch);
	if (natsConnection_PublishRequestString(nc, next, inbox, body) != NATS_OK ||
		natsConnection_Flush(nc) != NATS_OK)
		die("pull request");
}

int
main(int argc, char **argv)
{
	QbSource	src = {0};
	QbDelivery	d[BATCH];
	char		err[512];
	char		next[512];
	char		filter[256];
	int			seen[FIRST + LATER + 1] = {0};
	int			got = 0;
	int			most = 0;
	pthread_t	t;
	void	   *c;

	if (argc != 4)
	{
		fprintf(stderr, "usage: nats_fetch_check URL STREAM SUBJECT\n");
		return 2;
	}
	subject = argv[3];
	snprintf(filter, sizeof(filter), "%s.>", subject);
	src.name = "fetchcheck";
	src.type = QB_SOURCE_NATS;
	src.broker_url = argv[1];
	src.stream = argv[2];
	src.subject = filter;
	src.batch_size = BATCH;
	if (natsConnection_ConnectTo(&nc, argv[1]) != NATS_OK)
		die("connect");
	if ((c = qb_nats_consumer.open(&src, err, sizeof(err))) == NULL)
	{
		fprintf(stderr, "nats_fetch_check: open: %s\n", err);
		return 1;
	}
	snprintf(next, sizeof(next), "$JS.API.CONSUMER.MSG.NEXT.%s.queuebox-%s", src.stream, src.name);

	/* 1. FIRST messages waiting in the subscription */
	publish(FIRST);
	request(next, qbns_inbox(c), FIRST);
	for (int i = 0; i < 5000 && qbns_waiting(c) < FIRST; i++)
		usleep(1000);
	if (qbns_waiting(c) != FIRST)
		die("the first messages did not arrive in the subscription");
	/* 2. a request waiting at the server */
	request(next, qbns_inbox(c), FIRST);
	usleep(50000);
	/* 3. the fetch, while more come */
	if (pthread_create(&t, NULL, publish_later, NULL) != 0)
		die("pthread_create");
	for (int round = 0; round < 200 && got < FIRST + LATER; round++)
	{
		int			n = qb_nats_consumer.fetch(c, d, BATCH, err, sizeof(err));

		if (n < 0)
		{
			fprintf(stderr, "nats_fetch_check: fetch: %s\n", err);
			return 1;
		}
		if (n > BATCH)
			die("a fetch returned more than its batch");
		most = n > most ? n : most;
		for (int i = 0; i < n; i++)
		{
			long		seq = atol(strrchr(d[i].position, '/') + 1);

			if (seq < 1 || seq > FIRST + LATER || seen[seq]++)
			{
				fprintf(stderr, "nats_fetch_check: sequence %ld came %s\n", seq,
						seq < 1 || seq > FIRST + LATER ? "out of range" : "twice");
				return 1;
			}
			got++;
		}
		if (n > 0 && qb_nats_consumer.ack(c, d, n, err, sizeof(err)) != 0)
		{
			fprintf(stderr, "nats_fetch_check: ack: %s\n", err);
			return 1;
		}
		qb_deliveries_clear(d, n);
		if (round == 0)
			pthread_join(t, NULL);
	}
	if (got != FIRST + LATER)
	{
		fprintf(stderr, "nats_fetch_check: %d of %d messages came\n", got, FIRST + LATER);
		return 1;
	}
	qb_nats_consumer.close(c);
	natsConnection_Destroy(nc);
	printf("ok %d messages, at most %d a fetch\n", got, most);
	return 0;
}
