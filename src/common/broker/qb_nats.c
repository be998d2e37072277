/*-------------------------------------------------------------------------
 * qb_nats.c
 *	  cnats helpers shared by the NATS publisher and the NATS source
 *	  consumer; see qb_nats.h for the thread rule they serve.
 *-------------------------------------------------------------------------
 */
#include <ctype.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "qb_nats.h"

void
qb_nats_block_signals(sigset_t *old)
{
	sigset_t	all;

	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, old);
}

void
qb_nats_restore_signals(const sigset_t *old)
{
	pthread_sigmask(SIG_SETMASK, old, NULL);
}

/*
 * qb_nats_open starts cnats's library threads once per process: a worker
 * may run the publisher and a consumer, and nats_Close would stop threads
 * the other still uses (§4).
 */
bool
qb_nats_open(char *err, size_t errlen)
{
	static bool opened = false;
	sigset_t	old;
	natsStatus	s;

	if (opened)
		return true;
	qb_nats_block_signals(&old);
	s = nats_Open(-1);
	qb_nats_restore_signals(&old);
	if (s != NATS_OK)
	{
		snprintf(err, errlen, "nats_Open: %s", natsStatus_GetText(s));
		return false;
	}
	opened = true;
	return true;
}

natsOptions *
qb_nats_options(const char *url, natsStatus *s)
{
	natsOptions *o = NULL;

	*s = natsOptions_Create(&o);
	if (*s == NATS_OK)
		*s = natsOptions_SetURL(o, url);
	if (*s == NATS_OK)
		*s = natsOptions_SetName(o, "queuebox");
	if (*s == NATS_OK)
		*s = natsOptions_SetTimeout(o, QB_NATS_CONNECT_MS);
	if (*s == NATS_OK)
		*s = natsOptions_SetMaxReconnect(o, -1);
	if (*s == NATS_OK)
		*s = natsOptions_SetReconnectWait(o, QB_NATS_RECONNECT_MS);
	if (*s != NATS_OK)
	{
		natsOptions_Destroy(o);
		return NULL;
	}
	return o;
}

/*
 * qb_nats_segment_end: where the server list's entry at p ends: at the
 * first comma that starts another URL (a scheme, then "://"), or at the
 * end.  A comma that does not (one inside a password) belongs to the
 * entry, so the entry's '@' is still found and its password hidden.
 */
static const char *
qb_nats_segment_end(const char *p)
{
	for (const char *c = strchr(p, ','); c != NULL; c = strchr(c + 1, ','))
	{
		const char *q = c + 1;

		while (isalpha((unsigned char) *q))
			q++;
		if (q > c + 1 && strncmp(q, "://", 3) == 0)
			return c;
	}
	return p + strlen(p);
}

void
qb_nats_redact(const char *url, char *out, size_t outlen)
{
	size_t		o = 0;

	for (const char *p = url; *p && o + 1 < outlen;)
	{
		const char *end = qb_nats_segment_end(p);
		const char *scheme = strstr(p, "://");
		const char *from = scheme != NULL && scheme < end ? scheme + 3 : p;
		const char *at = NULL;
		size_t		len = (size_t) (end - p);

		/* the last '@' of the entry: a password may hold one too */
		for (const char *q = from; q < end; q++)
			if (*q == '@')
				at = q;
		if (at != NULL)
			o += snprintf(out + o, outlen - o, "%.*s***%.*s",
						  (int) (from - p), p, (int) (end - at), at);
		else
			o += snprintf(out + o, outlen - o, "%.*s", (int) len, p);
		if (o >= outlen)
			break;
		p = end;
		if (*p == ',')
			out[o++] = *p++;
	}
	out[o < outlen ? o : outlen - 1] = '\0';
}

void
qb_nats_status_text(natsStatus s, char *out, size_t outlen)
{
	const char *last = nats_GetLastError(NULL);

	/* the detail often repeats the status after a source location: skip it */
	if (last != NULL && *last && strstr(last, natsStatus_GetText(s)) == NULL)
		snprintf(out, outlen, "%s (%s)", natsStatus_GetText(s), last);
	else
		snprintf(out, outlen, "%s", natsStatus_GetText(s));
}
