/*-------------------------------------------------------------------------
 * log.c
 *	  The daemon's log: one line per event on stderr, as text or JSON.
 *
 * Wording:
 *	- text:  2026-12-01T13:40:00.123Z LOG outbox 0[4242]: the message
 *	- json:  {"ts":"2026-12-01T13:40:00.123Z","level":"info","role":"outbox 0",
 *	          "pid":4242,"msg":"the message"}
 *	  (daemon.logFormat; the level words are the extension's: DEBUG, LOG,
 *	  WARNING, ERROR in text, lower case in JSON).
 *
 * DEBUG lines are written only with QUEUEBOX_MSSQLD_DEBUG=1 in the
 * environment.  A line is written with one write(2) so lines of several processes sharing
 * stderr do not interleave (lines stay below PIPE_BUF in practice: messages
 * are cut at 2 KiB).  Nothing here logs a secret by itself; callers name a
 * database URL only through qbd_redact_url.
 *-------------------------------------------------------------------------
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/time.h>

#include <jansson.h>

#include "qbd.h"

static char qbd_log_role[64] = "supervisor";
static bool qbd_log_json = false;

void
qbd_log_init(const char *role, bool json)
{
	snprintf(qbd_log_role, sizeof(qbd_log_role), "%s", role);
	qbd_log_json = json;
}

void
qbd_log_set_json(bool json)
{
	qbd_log_json = json;
}

static const char *
qbd_level_word(QbLogLevel level, bool json)
{
	switch (level)
	{
		case QB_LOG_DEBUG:
			return json ? "debug" : "DEBUG";
		case QB_LOG_INFO:
			return json ? "info" : "LOG";
		case QB_LOG_WARNING:
			return json ? "warning" : "WARNING";
		case QB_LOG_ERROR:
			break;
	}
	return json ? "error" : "ERROR";
}

/* qbd_log_format: see qbd.h. */
size_t
qbd_log_format(char *buf, size_t len, bool json, double epoch, const char *role,
			   int pid, QbLogLevel level, const char *msg)
{
	char		ts[40];
	time_t		sec = (time_t) epoch;
	struct tm	tm;
	int			n;

	gmtime_r(&sec, &tm);
	n = (int) strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%S", &tm);
	snprintf(ts + n, sizeof(ts) - n, ".%03dZ", (int) ((epoch - (double) sec) * 1000.0) % 1000);

	if (json)
	{
		json_t	   *o = json_pack("{s:s, s:s, s:s, s:i, s:s}", "ts", ts,
								  "level", qbd_level_word(level, true), "role", role,
								  "pid", pid, "msg", msg);
		char	   *text = o ? json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII) : NULL;
		size_t		w = 0;

		if (text != NULL)
			w = (size_t) snprintf(buf, len, "%s", text);
		else
			w = (size_t) snprintf(buf, len, "{\"ts\":\"%s\",\"level\":\"error\",\"msg\":\"log line not encodable\"}", ts);
		free(text);
		json_decref(o);
		return w < len ? w : len - 1;
	}
	n = snprintf(buf, len, "%s %s %s[%d]: %s", ts, qbd_level_word(level, false), role, pid, msg);
	return (size_t) n < len ? (size_t) n : len - 1;
}

void
qbd_log(QbLogLevel level, const char *fmt,...)
{
	static int	debug = -1;
	char		msg[2048];
	char		line[4096];
	struct timeval tv;
	va_list		ap;
	size_t		n;

	/* DEBUG lines only with QUEUEBOX_MSSQLD_DEBUG=1, as the server hides DEBUG1 */
	if (debug < 0)
	{
		const char *v = getenv("QUEUEBOX_MSSQLD_DEBUG");

		debug = v != NULL && strcmp(v, "1") == 0;
	}
	if (level == QB_LOG_DEBUG && !debug)
		return;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	gettimeofday(&tv, NULL);
	n = qbd_log_format(line, sizeof(line) - 1, qbd_log_json,
					   (double) tv.tv_sec + tv.tv_usec / 1e6, qbd_log_role,
					   (int) getpid(), level, msg);
	line[n++] = '\n';
	if (write(STDERR_FILENO, line, n) < 0)
		return;					/* nowhere else to say it */
}
