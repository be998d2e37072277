/*-------------------------------------------------------------------------
 * qb_nats.c
 *	  cnats helpers shared by the NATS publisher and the NATS source
 *	  consumer; see qb_nats.h for the thread rule they serve.
 *-------------------------------------------------------------------------
 */
#define _GNU_SOURCE				/* asprintf */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qb_errlen.h"
#include "qb_nats.h"
#include "qb_url.h"

/* the schemes of a NATS server: tls:// asks for TLS */
static const char *const qb_nats_schemes[] = {"nats", "tls", NULL};

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

/*
 * qb_nats_server: see qb_nats.h.  One server of a list (len bytes of one)
 * as cnats is to read it, written again from what the URL reader read:
 * scheme://[user[:password]@]host:port with the user info decoded.  cnats
 * decodes nothing, and takes the last '@' of the whole text (a path's
 * too) and the first ':' before it, so what it reads from this is what
 * the reader read.  NULL with err when the entry does not read, or when
 * cnats could not read it back (a ':' in the user name).  It holds the
 * password: explicit_bzero it before it is freed.
 */
char *
qb_nats_server(const char *one, size_t len, char *err, size_t errlen)
{
	char	   *text = strndup(one, len);
	char	   *out = NULL;
	QbUrl		u;
	bool		v6;

	if (text == NULL)
	{
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	if (!qb_url_read(text, qb_nats_schemes, QB_URL_USERINFO, &u, err, errlen))
	{
		free(text);
		return NULL;
	}
	v6 = strchr(u.host, ':') != NULL;
	if (u.user != NULL && strchr(u.user, ':') != NULL)
		snprintf(err, errlen, "a NATS user name cannot hold ':' (%%3A): cnats ends the user there");
	else if (asprintf(&out, "%s://%s%s%s%s%s%s%s:%d", u.scheme, u.user ? u.user : "",
					  u.password ? ":" : "", u.password ? u.password : "",
					  u.user || u.password ? "@" : "", v6 ? "[" : "", u.host, v6 ? "]" : "", u.port) < 0)
	{
		out = NULL;
		snprintf(err, errlen, "out of memory");
	}
	qb_url_free(&u);
	free(text);
	return out;
}

/* qb_nats_free_server: a server written by qb_nats_server, its password wiped */
static void
qb_nats_free_server(char *server)
{
	if (server != NULL)
		explicit_bzero(server, strlen(server));
	free(server);
}

/* qb_nats_url_check: see qb_nats.h. */
bool
qb_nats_url_check(const char *list, char *err, size_t errlen)
{
	const char *next = list;
	const char *one;
	size_t		len;

	while ((one = qb_url_list_next(&next, &len)) != NULL)
	{
		char	   *server;

		if (len == 0)
		{
			snprintf(err, errlen, "empty entry in the server list; write nats://host:port[,nats://host:port]");
			return false;
		}
		if ((server = qb_nats_server(one, len, err, errlen)) == NULL)
			return false;
		qb_nats_free_server(server);
	}
	return true;
}

/* qb_nats_set_servers: the list's servers, as qb_nats_server writes them, in their order */
static natsStatus
qb_nats_set_servers(natsOptions *o, const char *list)
{
	const char *next = list;
	const char *one;
	size_t		len;
	char	   *servers[QB_NATS_MAX_SERVERS];
	char		err[QB_ERRLEN];
	int			n = 0;
	natsStatus	s = NATS_OK;

	while (s == NATS_OK && (one = qb_url_list_next(&next, &len)) != NULL)
	{
		if (n == QB_NATS_MAX_SERVERS || (servers[n] = qb_nats_server(one, len, err, sizeof(err))) == NULL)
			s = NATS_INVALID_ARG;
		else
			n++;
	}
	if (s == NATS_OK)
		s = natsOptions_SetServers(o, (const char **) servers, n);
	if (s == NATS_OK)
		s = natsOptions_SetNoRandomize(o, true);
	for (int i = 0; i < n; i++)
		qb_nats_free_server(servers[i]);
	return s;
}

natsOptions *
qb_nats_options(const char *url, natsStatus *s)
{
	natsOptions *o = NULL;

	*s = natsOptions_Create(&o);
	if (*s == NATS_OK)
		*s = qb_nats_set_servers(o, url);
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
 * qb_nats_redact: each server as the reader reads it, scheme, host and
 * port (when written), its user info (if any) shown as "***@"; "(a server URL that does
 * not read)" for one that does not (the configuration refuses those:
 * nothing of it is shown).
 */
void
qb_nats_redact(const char *url, char *out, size_t outlen)
{
	const char *next = url;
	const char *one;
	size_t		len;
	size_t		o = 0;

	out[0] = '\0';
	while ((one = qb_url_list_next(&next, &len)) != NULL && o + 1 < outlen)
	{
		char	   *text = strndup(one, len);
		char		err[QB_ERRLEN];
		QbUrl		u;

		if (text != NULL && qb_url_read(text, qb_nats_schemes, QB_URL_USERINFO, &u, err, sizeof(err)))
		{
			bool		v6 = strchr(u.host, ':') != NULL;
			char		port[16] = "";

			if (u.port_written)
				snprintf(port, sizeof(port), ":%d", u.port);
			o += snprintf(out + o, outlen - o, "%s%s://%s%s%s%s%s", o > 0 ? "," : "", u.scheme,
						  u.user || u.password ? "***@" : "", v6 ? "[" : "", u.host, v6 ? "]" : "", port);
			qb_url_free(&u);
		}
		else
			o += snprintf(out + o, outlen - o, "%s(a server URL that does not read)", o > 0 ? "," : "");
		free(text);
	}
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
