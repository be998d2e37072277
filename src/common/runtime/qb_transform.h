/*-------------------------------------------------------------------------
 * qb_transform.h
 *	  jq transforms (libjq 1.6): compiled once per configuration, run on one
 *	  payload at a time in a forked helper that a deadline can kill.
 *
 * Wording:
 *	- A transform is one `transform:` program of a route, a destination or
 *	  a source, compiled (QbTransform).  The payload is `.`; $topic, $key,
 *	  $headers, $source and $eventType are bound for each run (null when the
 *	  place has no such value).
 *	- A chain is the transforms one message passes through, in order (route
 *	  then destination); each one's output is the next one's input.
 *	- A rejection is a run whose message must not go on: error(v) with any
 *	  v (error(null) included), no output, more than one output, a runtime
 *	  error, or a limit hit.  A failure is a run that could not happen at all
 *	  (no fork, no memory in this process): the message is not to blame.
 *	- The helper is a child process, forked at the first run and kept, that
 *	  runs the chains under an RLIMIT_DATA cap; the parent SIGKILLs it when
 *	  a deadline passes.  libjq has no budget and cannot be interrupted, and
 *	  a jq_state that ran halt is corrupt (clibs.md §8; qb_transform.c).
 *
 * Plain C, malloc'd, no PostgreSQL header.  A QbTransform is immutable after
 * compile.  The helper is the process's: its host keeps one QbTransformHelper
 * (QbRuntime.jq, qb_runtime.h) and every run names it; one thread of a
 * process runs transforms.
 *-------------------------------------------------------------------------
 */
#ifndef QB_TRANSFORM_H
#define QB_TRANSFORM_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* Default limits of one run (of a whole chain). */
#define QB_TRANSFORM_TIMEOUT_MS		1000
#define QB_TRANSFORM_MAX_OUTPUT		(64L * 1024 * 1024)	/* bytes of JSON text */
#define QB_TRANSFORM_MAX_MEMORY		(512L * 1024 * 1024)	/* heap the helper may add */

typedef struct QbTransform QbTransform;

/*
 * The helper child of a process (qb_transform.c's; zeroed: none started).
 * Its host keeps it for the life of the process.
 */
typedef struct QbTransformHelper
{
	pid_t		pid;			/* 0: none */
	int			fd;				/* the socket to it */
	unsigned long serial;		/* when it was forked: it holds every
								 * transform compiled before */
	long		max_memory;
	long		runs;

	/*
	 * The index in the chain of the stage running, in a page shared with
	 * the child: written by the child before each stage, read when a
	 * deadline passes (-1: none yet).
	 */
	volatile int *stage;
} QbTransformHelper;

typedef struct QbTransformVars
{
	const char *topic;			/* NULL binds null */
	const char *key;
	const char *headers;		/* JSON object text; NULL (or not an object) binds null */
	const char *source;
	const char *event_type;
} QbTransformVars;

typedef struct QbTransformLimits
{
	long		timeout_ms;
	long		max_output;
	long		max_memory;
} QbTransformLimits;

typedef enum QbTransformResult
{
	QB_TRANSFORM_OK,
	QB_TRANSFORM_REJECTED,		/* err says why; the message must not go on */
	QB_TRANSFORM_FAILED			/* err says why; nothing was decided */
} QbTransformResult;

/*
 * Compile a jq program.  Returns NULL with jq's message in err (e.g. "not a
 * valid jq program: syntax error, unexpected INVALID_CHARACTER at
 * <top-level>, line 1").  Costs about 17 ms (libjq compiles its builtins).
 */
extern QbTransform *qb_transform_compile(const char *program, char *err, size_t errlen);
extern void qb_transform_free(QbTransform *t);

/*
 * Run a chain of n transforms on a payload (JSON text, len bytes), on the
 * helper h (started, or replaced, as needed; NULL: FAILED).  On OK,
 * *out is the new payload (malloc'd, NUL-terminated, compact JSON) and
 * *outlen its length.  On REJECTED, *at is the index in the chain that
 * rejected or was running when a limit was hit (-1: the payload itself is
 * not JSON) and err the reason.  limits NULL
 * uses the defaults above.
 */
extern QbTransformResult qb_transform_run_chain(QbTransformHelper *h,
												const QbTransform *const *chain, int n,
												const char *payload, size_t len,
												const QbTransformVars *vars,
												const QbTransformLimits *limits,
												char **out, size_t *outlen, int *at,
												char *err, size_t errlen);

/* One transform: qb_transform_run_chain with n = 1. */
extern QbTransformResult qb_transform_run(QbTransformHelper *h, const QbTransform *t,
										  const char *payload, size_t len,
										  const QbTransformVars *vars,
										  const QbTransformLimits *limits,
										  char **out, size_t *outlen,
										  char *err, size_t errlen);

/* The helper's pid, -1 when none runs (for tests). */
extern pid_t qb_transform_helper_pid(const QbTransformHelper *h);

#endif							/* QB_TRANSFORM_H */
