/*-------------------------------------------------------------------------
 * transform_bench.c
 *	  What one transform run costs, three ways, in one process:
 *
 *	  inproc  libjq on this process's own compiled state: jq_start, jq_next,
 *	          dump (the floor: what a run costs with no isolation at all)
 *	  helper  qb_transform_run: the request to the kept helper process and
 *	          its answer (what QueueBox pays per message)
 *	  fork    fork, _exit, waitpid from a process holding HEAP_MB of touched
 *	          heap (the least a fork per message costs: the design before
 *	          the kept helper)
 *
 *	  transform_bench MODE RUNS HEAP_MB   prints "MODE us_per_run"
 *-------------------------------------------------------------------------
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/wait.h>

#include <jq.h>

#include "qb_transform.h"

#define PROGRAM "{id: .order.id, total: (.order.lines | map(.qty * .price) | add), topic: $topic}"
#define PAYLOAD "{\"order\":{\"id\":\"o-1\",\"lines\":[{\"qty\":2,\"price\":3.5},{\"qty\":1,\"price\":10}]}," \
	"\"note\":\"a payload of about three hundred bytes, like the outbox benchmark's rows; " \
	"the text pads it out so that parsing and dumping cost what they would in production\"}"

static double
now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

int
main(int argc, char **argv)
{
	const char *mode;
	long		runs;
	long		heap_mb;
	char	   *heap;
	double		t0;

	if (argc != 4)
	{
		fprintf(stderr, "usage: transform_bench inproc|helper|fork RUNS HEAP_MB\n");
		return 2;
	}
	mode = argv[1];
	runs = atol(argv[2]);
	heap_mb = atol(argv[3]);
	/* touched, so that fork has page tables to copy, as a worker's heap does */
	heap = malloc((size_t) heap_mb << 20);
	if (heap == NULL)
		return 1;
	memset(heap, 1, (size_t) heap_mb << 20);

	if (strcmp(mode, "inproc") == 0)
	{
		jq_state   *jq = jq_init();
		jv			vars = jv_object_set(jv_object(), jv_string("topic"), jv_string("orders.created"));

		if (jq == NULL || !jq_compile_args(jq, PROGRAM, vars))
			return 1;
		t0 = now();
		for (long i = 0; i < runs; i++)
		{
			jv			r;

			jq_start(jq, jv_parse(PAYLOAD), 0);
			r = jq_next(jq);
			if (!jv_is_valid(r))
				return 1;
			jv_free(jv_dump_string(r, 0));
			jv_free(jq_next(jq));
		}
	}
	else if (strcmp(mode, "helper") == 0)
	{
		char		err[512];
		QbTransform *t = qb_transform_compile(PROGRAM, err, sizeof(err));
		QbTransformHelper jq = {0};
		QbTransformVars v = {.topic = "orders.created", .key = "k1", .headers = "{}"};

		if (t == NULL)
		{
			fprintf(stderr, "%s\n", err);
			return 1;
		}
		t0 = now();
		for (long i = 0; i < runs; i++)
		{
			char	   *out;
			size_t		len;

			if (qb_transform_run(&jq, t, PAYLOAD, strlen(PAYLOAD), &v, NULL, &out, &len, err,
								 sizeof(err)) != QB_TRANSFORM_OK)
			{
				fprintf(stderr, "%s\n", err);
				return 1;
			}
			free(out);
		}
	}
	else if (strcmp(mode, "fork") == 0)
	{
		t0 = now();
		for (long i = 0; i < runs; i++)
		{
			pid_t		pid = fork();

			if (pid < 0)
				return 1;
			if (pid == 0)
				_exit(heap[i % ((size_t) heap_mb << 20 | 1)] == 1 ? 0 : 1);
			waitpid(pid, NULL, 0);
		}
	}
	else
		return 2;
	printf("%s %.1f\n", mode, (now() - t0) / runs * 1e6);
	free(heap);
	return 0;
}
