/*-------------------------------------------------------------------------
 * test_sink.h
 *	  The project's loopback HTTP sink (test/sink/qb_sink, built by `make
 *	  sink`) for the unit tests that publish over real HTTP: started once
 *	  per test binary in a temp dir, stopped and removed at the end.
 *
 * Header-only (static functions): each unit test is one .c file linked
 * with the core library.
 *-------------------------------------------------------------------------
 */
#ifndef TEST_SINK_H
#define TEST_SINK_H

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define TEST_SINK_BIN "test/sink/qb_sink"

typedef struct TestSink
{
	pid_t		pid;
	char		dir[64];		/* the temp dir: its port file, its log */
	char		log[256];		/* the request log, "" when not asked for */
	char		base[128];		/* http://127.0.0.1:PORT */
} TestSink;

/*
 * test_sink_start: run the sink on a free port; with_log makes it log every
 * request (JSON lines) to s->log.  Returns 0, or -1 with the reason on
 * stderr.
 */
static int
test_sink_start(TestSink *s, const char *name, bool with_log)
{
	char		port_file[128];
	char		port[16] = "";

	memset(s, 0, sizeof(*s));
	s->pid = -1;
	if (access(TEST_SINK_BIN, X_OK) != 0)
	{
		fprintf(stderr, "%s: %s is missing: run `make sink` first\n", name, TEST_SINK_BIN);
		return -1;
	}
	snprintf(s->dir, sizeof(s->dir), "/tmp/qb-%s.XXXXXX", name);
	if (mkdtemp(s->dir) == NULL)
		return -1;
	snprintf(port_file, sizeof(port_file), "%s/port", s->dir);
	if (with_log)
		snprintf(s->log, sizeof(s->log), "%s/log.jsonl", s->dir);
	s->pid = fork();
	if (s->pid == 0)
	{
		if (freopen("/dev/null", "w", stdout) == NULL)
			_exit(127);
		if (with_log)
			execl(TEST_SINK_BIN, TEST_SINK_BIN, "--port", "0", "--port-file", port_file,
				  "--log", s->log, "--quiet", (char *) NULL);
		else
			execl(TEST_SINK_BIN, TEST_SINK_BIN, "--port", "0", "--port-file", port_file,
				  "--quiet", (char *) NULL);
		_exit(127);
	}
	for (int i = 0; i < 200 && !port[0]; i++)
	{
		FILE	   *f = fopen(port_file, "r");

		if (f != NULL)
		{
			if (fgets(port, sizeof(port), f) == NULL)
				port[0] = '\0';
			fclose(f);
		}
		if (!port[0])
			usleep(25000);
	}
	if (!port[0])
	{
		fprintf(stderr, "%s: the sink wrote no port within 5 s\n", name);
		return -1;
	}
	port[strcspn(port, "\n")] = '\0';
	snprintf(s->base, sizeof(s->base), "http://127.0.0.1:%s", port);
	return 0;
}

/* test_sink_stop: stop the sink and remove its dir. */
static int
test_sink_stop(TestSink *s)
{
	char		cmd[128];

	if (s->pid > 0)
	{
		kill(s->pid, SIGTERM);
		waitpid(s->pid, NULL, 0);
		s->pid = -1;
	}
	if (!s->dir[0])
		return 0;
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", s->dir);
	return system(cmd) == 0 ? 0 : -1;
}

#endif							/* TEST_SINK_H */
