/*-------------------------------------------------------------------------
 * qb_http.c
 *	  The HTTP publisher: libcurl multi, socket API, a private epoll set.
 *
 * Wording: see qb_http.h.  A transfer is an easy handle in flight; finished
 * transfers go back to a free list so their buffers are reused.
 *
 * Outcomes: 2xx is ok; any other answer is a failed attempt carrying its
 * status.  An answer is read up to QBH_READ_MAX bytes, no further: once the
 * status and the kept start are in, a longer (or endless) body only costs
 * time, so the transfer is cut there and judged on its status like a whole
 * one (the connection is closed; a shorter answer keeps it for reuse).
 * 410 Gone also sets gone (the engine parks the row and stops the
 * destination: no retry will change the receiver's mind), and 429 or 503
 * carry the Retry-After delay when the answer has one.  Never permanent:
 * an HTTP answer says nothing about the row itself.
 *
 * Threads: libcurl's threaded resolver may start a thread inside
 * curl_multi_socket_action(); its resolver-start callback blocks every
 * signal just before the thread is made, and the action restores the mask
 * when it returns, so the thread inherits a full mask (PostgreSQL's signal
 * handlers must only ever run on the worker's own thread).  A request on a
 * kept connection resolves nothing and costs no sigprocmask.
 *
 * The epoll set: libcurl asks us to watch a socket while a transfer uses it
 * and to forget it when the transfer ends, so a kept connection would cost
 * an EPOLL_CTL_DEL at every answer and an EPOLL_CTL_ADD at every request.
 * A connection socket we opened (qbh_open_socket) stays in the set, read
 * interest only, while it idles in libcurl's cache ("kept"); the first event
 * on a kept socket that no transfer uses takes it out (lazy removal: a peer
 * that closes an idle connection wakes us once, not at every wait), and its
 * close (qbh_close_socket, which libcurl calls for every socket it opened
 * through us) forgets it.  Sockets we did not open (the resolver's) are
 * added and removed as libcurl says.  libcurl 7.88 closes a socket that is
 * still connecting (an attempt that timed out or was aborted, the slower
 * of two addresses) itself, without qbh_close_socket, so its fd keeps our
 * mark; a socket libcurl reports for a transfer that is resolving is the
 * resolver's, and that mark is dropped then (else the resolver's socket,
 * taken for a kept one, stays "in" the set after its close, and the next
 * resolve's socket on that fd is never added: libcurl finds its answer
 * only by its own polling timer, up to 250 ms later).
 *-------------------------------------------------------------------------
 */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/sockios.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>
#include <jansson.h>

#include "qb_headers.h"
#include "qb_clock.h"
#include "qb_http.h"
#include "qb_http_int.h"
#include "qb_sign.h"

#ifndef QB_VERSION
#define QB_VERSION "dev"
#endif

#define QBH_ERRBODY 200			/* bytes of an error answer kept for last_error */
#define QBH_READ_MAX 65536		/* bytes of any answer read before it is cut */

/* qbh_fds[fd]: what the epoll set holds for a socket (QbHttp.fds) */
#define QBH_FD_OURS		0x80000000u	/* opened by qbh_open_socket, not yet closed */
#define QBH_FD_USED		0x40000000u	/* a transfer uses it (libcurl watches it) */
#define QBH_FD_EVENTS	(EPOLLIN | EPOLLOUT)	/* registered in the set; 0: not in it */

typedef struct QbhTransfer
{
	QbHttp	   *h;				/* the publisher it belongs to */
	CURL	   *easy;
	struct curl_slist *headers;
	int			tag;
	char		errbuf[CURL_ERROR_SIZE];
	char		refused[QB_ERRLEN];	/* why the egress rules refused an address */
	const QbEgress *egress;		/* the destination's rules; NULL: the host's */
	const QbEgressPolicy *host_egress;	/* the host's, or NULL: none */
	char		body[QBH_ERRBODY + 1];	/* the start of the answer */
	size_t		body_len;
	size_t		read;			/* bytes of the answer's body read so far */
	bool		cut;			/* we stopped reading at QBH_READ_MAX */
	bool		resolving;		/* a resolve began, no socket opened since */
	struct QbhTransfer *next;	/* free list, or the in-flight list */
	struct QbhTransfer *prev;	/* in-flight list */
} QbhTransfer;

struct QbHttp
{
	CURLM	   *multi;
	int			epfd;
	long		timer_ms;		/* libcurl's requested timeout; -1 none */
	long		timer_set_at;	/* qb_now_ms() when it was set */
	int			in_flight;
	QbhTransfer *active;		/* in flight, doubly linked */
	QbhTransfer *free_list;
	uint32_t   *fds;			/* per fd: QBH_FD_* (see the banner) */
	int			nfds;			/* entries in fds */
	bool		sig_blocked;	/* a resolve started in this action: sig_old restores */
	sigset_t	sig_old;
};

static int	qbh_socket_cb(CURL *e, curl_socket_t s, int what, void *userp, void *socketp);
static int	qbh_timer_cb(CURLM *m, long timeout_ms, void *userp);
static size_t qbh_write_cb(char *ptr, size_t size, size_t nmemb, void *userdata);
static curl_socket_t qbh_open_socket(void *arg, curlsocktype purpose, struct curl_sockaddr *a);
static int	qbh_close_socket(void *arg, curl_socket_t fd);
static int	qbh_resolver_start(void *resolver_state, void *reserved, void *userdata);
static void qbh_action(QbHttp *h, curl_socket_t s, int ev_bitmask);

/*
 * qb_http_new creates the multi handle and its epoll set.  curl_global_init
 * is idempotent per process after the first call; the host calls it once
 * before creating threads (libcurl requires that).
 */
QbHttp *
qb_http_new(char *err, size_t errlen)
{
	QbHttp	   *h = calloc(1, sizeof(QbHttp));

	if (h == NULL)
		goto err;
	h->epfd = -1;
	h->timer_ms = -1;
	if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
	{
		snprintf(err, errlen, "curl_global_init failed");
		goto err;
	}
	h->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (h->epfd < 0)
	{
		snprintf(err, errlen, "epoll_create1: %s", strerror(errno));
		goto err;
	}
	h->multi = curl_multi_init();
	if (h->multi == NULL)
	{
		snprintf(err, errlen, "curl_multi_init failed");
		goto err;
	}
	curl_multi_setopt(h->multi, CURLMOPT_SOCKETFUNCTION, qbh_socket_cb);
	curl_multi_setopt(h->multi, CURLMOPT_SOCKETDATA, h);
	curl_multi_setopt(h->multi, CURLMOPT_TIMERFUNCTION, qbh_timer_cb);
	curl_multi_setopt(h->multi, CURLMOPT_TIMERDATA, h);
	/* Keep a connection per concurrent post alive between batches. */
	curl_multi_setopt(h->multi, CURLMOPT_MAXCONNECTS, 512L);
	return h;

err:
	if (h != NULL)
	{
		if (h->epfd >= 0)
			close(h->epfd);
		free(h);
	}
	else
		snprintf(err, errlen, "out of memory");
	return NULL;
}

/* qb_http_free ends every transfer and closes every connection. */
void
qb_http_free(QbHttp *h)
{
	if (h == NULL)
		return;
	qb_http_abort_all(h);
	while (h->free_list)
	{
		QbhTransfer *t = h->free_list;

		h->free_list = t->next;
		curl_easy_cleanup(t->easy);
		free(t);
	}
	curl_multi_cleanup(h->multi);	/* closes the kept connections: reads h->fds */
	close(h->epfd);
	free(h->fds);
	free(h);
}

int
qb_http_fd(const QbHttp *h)
{
	return h->epfd;
}

int
qb_http_in_flight(const QbHttp *h)
{
	return h->in_flight;
}

/* qbh_fd_slot: h->fds[s], the table grown to hold it; NULL when out of memory */
static uint32_t *
qbh_fd_slot(QbHttp *h, curl_socket_t s)
{
	if (s < 0)
		return NULL;
	if (s >= h->nfds)
	{
		int			n = h->nfds ? h->nfds : 64;
		uint32_t   *fds;

		while (n <= s)
			n *= 2;
		if ((fds = realloc(h->fds, n * sizeof(uint32_t))) == NULL)
			return NULL;
		memset(fds + h->nfds, 0, (n - h->nfds) * sizeof(uint32_t));
		h->fds = fds;
		h->nfds = n;
	}
	return &h->fds[s];
}

/*
 * qbh_epoll_put: s in our set with these events, by ADD or MOD as in_set
 * says.  in_set is only a hint for a socket we did not open: a closed socket
 * leaves epoll silently, and its fd number can come back as a new socket that
 * libcurl still knows by the old entry: a MOD then fails with ENOENT, and the
 * answer on that socket would never be seen (the request times out with 0
 * bytes received although the endpoint answered).  So fall back from MOD to
 * ADD and from ADD to MOD.
 */
static void
qbh_epoll_put(QbHttp *h, curl_socket_t s, bool in_set, uint32_t events)
{
	struct epoll_event ev = {.events = events,.data.fd = s};

	if (!in_set)
	{
		if (epoll_ctl(h->epfd, EPOLL_CTL_ADD, s, &ev) != 0 && errno == EEXIST)
			epoll_ctl(h->epfd, EPOLL_CTL_MOD, s, &ev);
	}
	else if (epoll_ctl(h->epfd, EPOLL_CTL_MOD, s, &ev) != 0 && errno == ENOENT)
		epoll_ctl(h->epfd, EPOLL_CTL_ADD, s, &ev);
}

/*
 * qbh_watch_ours: a socket we opened, watched as libcurl now asks (want:
 * its epoll events, 0 for CURL_POLL_REMOVE).  One that no transfer uses any
 * more stays in the set when it has read interest only (kept: the banner
 * says why); epoll_ctl runs only when the set must change.
 */
static void
qbh_watch_ours(QbHttp *h, curl_socket_t s, uint32_t *fd, uint32_t want)
{
	uint32_t	have = *fd & QBH_FD_EVENTS;

	if (want == 0)
	{
		if (have != 0 && have != EPOLLIN)
		{
			epoll_ctl(h->epfd, EPOLL_CTL_DEL, s, NULL);
			have = 0;
		}
		*fd = QBH_FD_OURS | have;
		return;
	}
	if (have != want)
		qbh_epoll_put(h, s, have != 0, want);
	*fd = QBH_FD_OURS | QBH_FD_USED | want;
}

/*
 * qbh_socket_cb mirrors libcurl's interest in a socket into our epoll set:
 * qbh_watch_ours for the sockets we opened; any other is added and removed
 * as libcurl says, socketp (non-NULL once we have added it) telling ADD
 * from MOD.
 */
static int
qbh_socket_cb(CURL *e, curl_socket_t s, int what, void *userp, void *socketp)
{
	QbHttp	   *h = userp;
	uint32_t	want = 0;

	if (what & CURL_POLL_IN)
		want |= EPOLLIN;
	if (what & CURL_POLL_OUT)
		want |= EPOLLOUT;
	if (s >= 0 && s < h->nfds && (h->fds[s] & QBH_FD_OURS) && what != CURL_POLL_REMOVE)
	{
		QbhTransfer *t = NULL;

		/* the resolver's socket on the fd of one closed without us (banner) */
		curl_easy_getinfo(e, CURLINFO_PRIVATE, (char **) &t);
		if (t != NULL && t->resolving)
			h->fds[s] = 0;
	}
	if (s >= 0 && s < h->nfds && (h->fds[s] & QBH_FD_OURS))
	{
		qbh_watch_ours(h, s, &h->fds[s], what == CURL_POLL_REMOVE ? 0 : want);
		return 0;
	}
	if (what == CURL_POLL_REMOVE)
	{
		epoll_ctl(h->epfd, EPOLL_CTL_DEL, s, NULL);
		curl_multi_assign(h->multi, s, NULL);
		return 0;
	}
	qbh_epoll_put(h, s, socketp != NULL, want);
	if (socketp == NULL)
		curl_multi_assign(h->multi, s, h);
	return 0;
}

static int
qbh_timer_cb(CURLM *m, long timeout_ms, void *userp)
{
	QbHttp	   *h = userp;

	h->timer_ms = timeout_ms;
	h->timer_set_at = qb_now_ms();
	return 0;
}

/*
 * qbh_write_cb keeps the first bytes of an answer for the error message, and
 * cuts the transfer once QBH_READ_MAX bytes have come: returning less than n
 * makes libcurl end it with CURLE_WRITE_ERROR, which t->cut tells from a
 * failure (an endless body would otherwise be read until the timeout).
 */
static size_t
qbh_write_cb(char *ptr, size_t size, size_t nmemb, void *userdata)
{
	QbhTransfer *t = userdata;
	size_t		n = size * nmemb;
	size_t		room = QBH_ERRBODY - t->body_len;

	if (room > 0)
	{
		size_t		k = n < room ? n : room;

		memcpy(t->body + t->body_len, ptr, k);
		t->body_len += k;
		t->body[t->body_len] = '\0';
	}
	if (n > QBH_READ_MAX - t->read)
	{
		t->cut = true;
		return 0;
	}
	t->read += n;
	return n;
}

/*
 * qbh_resolver_start: libcurl is about to resolve a name, which may start
 * the threaded resolver's thread: every signal is blocked first, so that
 * thread inherits a full mask; qbh_action restores the worker's mask when
 * its action returns.
 */
static int
qbh_resolver_start(void *resolver_state, void *reserved, void *userdata)
{
	QbhTransfer *t = userdata;
	QbHttp	   *h = t->h;
	sigset_t	all;

	t->resolving = true;		/* until it opens a socket: qbh_socket_cb */
	if (!h->sig_blocked)
	{
		sigfillset(&all);
		pthread_sigmask(SIG_BLOCK, &all, &h->sig_old);
		h->sig_blocked = true;
	}
	return 0;
}

/*
 * qbh_action runs one curl_multi_socket_action, then gives back the signals
 * a resolve started in it blocked (qbh_resolver_start).
 */
static void
qbh_action(QbHttp *h, curl_socket_t s, int ev_bitmask)
{
	int			running;

	curl_multi_socket_action(h->multi, s, ev_bitmask, &running);
	if (h->sig_blocked)
	{
		h->sig_blocked = false;
		pthread_sigmask(SIG_SETMASK, &h->sig_old, NULL);
	}
}

/*
 * qbh_append: "name: value" at the end of list; false when out of memory.
 * Any length: the ingress stores a header of up to its 64 KiB head, and a
 * row must not die of a header it was given (the receiver may refuse it).
 */
static bool
qbh_append(struct curl_slist **list, const char *name, const char *value)
{
	size_t		size = strlen(name) + strlen(value) + 3;
	char	   *line = malloc(size);
	struct curl_slist *n;

	if (line == NULL)
		return false;
	snprintf(line, size, "%s: %s", name, value);
	n = curl_slist_append(*list, line);
	free(line);
	if (n == NULL)
		return false;
	*list = n;
	return true;
}

/* qbh_add: qbh_append as the header rule's and qb_sign_request's callback. */
static bool
qbh_add(void *list, const char *name, const char *value)
{
	return qbh_append(list, name, value);
}

/* qbh_build_headers: see qb_http_int.h. */
QbHdrResult
qbh_build_headers(struct curl_slist **list, const QbDestination *dest,
				  const char *message_id, const json_t *row_headers,
				  const char *body, size_t body_len, char *err, size_t errlen)
{
	QbHdrResult r = qb_hdr_each(QB_HDR_HTTP, dest, row_headers, qbh_add, list, err, errlen);

	if (r != QB_HDR_OK)
		return r;
	for (int i = 0; i < dest->nheaders; i++)
	{
		if (qb_config_header_reserved(dest->headers[i].name))
			continue;
		if (!qbh_append(list, dest->headers[i].name, dest->headers[i].value))
			goto oom;
	}
	if (!qbh_append(list, "Content-Type", "application/json") ||
		!qbh_append(list, QB_HDR_MESSAGE_ID_HTTP, message_id) ||
		!qbh_append(list, "Expect", ""))	/* no 100-continue round trip */
		goto oom;
	if (!qb_sign_request(&dest->signing, message_id, (long long) time(NULL), body, body_len,
						 qbh_add, list, err, errlen))
		return QB_HDR_FAILED;
	return QB_HDR_OK;

oom:
	snprintf(err, errlen, "out of memory building headers");
	return QB_HDR_FAILED;
}

/* qbh_transfer_get: a transfer off the free list, or a new one; NULL: no memory */
static QbhTransfer *
qbh_transfer_get(QbHttp *h)
{
	QbhTransfer *t = h->free_list;

	if (t != NULL)
	{
		h->free_list = t->next;
		curl_easy_reset(t->easy);
	}
	else
	{
		t = calloc(1, sizeof(QbhTransfer));
		if (t == NULL || (t->easy = curl_easy_init()) == NULL)
		{
			free(t);
			return NULL;
		}
		t->h = h;
	}
	t->errbuf[0] = '\0';
	t->refused[0] = '\0';
	t->body_len = 0;
	t->body[0] = '\0';
	t->read = 0;
	t->cut = false;
	t->resolving = false;
	t->next = t->prev = NULL;
	return t;
}

/* qbh_transfer_setopt: the request of one POST on t's easy handle */
static void
qbh_transfer_setopt(QbhTransfer *t, const QbDestination *dest, const char *body, size_t body_len)
{
	curl_easy_setopt(t->easy, CURLOPT_URL, dest->url);
	curl_easy_setopt(t->easy, CURLOPT_POST, 1L);
	curl_easy_setopt(t->easy, CURLOPT_POSTFIELDS, body);
	curl_easy_setopt(t->easy, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t) body_len);
	curl_easy_setopt(t->easy, CURLOPT_HTTPHEADER, t->headers);
	curl_easy_setopt(t->easy, CURLOPT_USERAGENT, "queuebox/" QB_VERSION);
	curl_easy_setopt(t->easy, CURLOPT_TIMEOUT_MS, dest->timeout_ms);
	curl_easy_setopt(t->easy, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(t->easy, CURLOPT_ERRORBUFFER, t->errbuf);
	curl_easy_setopt(t->easy, CURLOPT_WRITEFUNCTION, qbh_write_cb);
	curl_easy_setopt(t->easy, CURLOPT_WRITEDATA, t);
	curl_easy_setopt(t->easy, CURLOPT_PRIVATE, t);
	curl_easy_setopt(t->easy, CURLOPT_PROTOCOLS_STR, "http,https");
	curl_easy_setopt(t->easy, CURLOPT_TCP_NODELAY, 1L);
	curl_easy_setopt(t->easy, CURLOPT_OPENSOCKETFUNCTION, qbh_open_socket);
	curl_easy_setopt(t->easy, CURLOPT_OPENSOCKETDATA, t);
	/* a connection outlives its transfer: its close reads only h, which outlives it */
	curl_easy_setopt(t->easy, CURLOPT_CLOSESOCKETFUNCTION, qbh_close_socket);
	curl_easy_setopt(t->easy, CURLOPT_CLOSESOCKETDATA, t->h);
	curl_easy_setopt(t->easy, CURLOPT_RESOLVER_START_FUNCTION, qbh_resolver_start);
	curl_easy_setopt(t->easy, CURLOPT_RESOLVER_START_DATA, t);
	/*
	 * timeoutMs bounds each attempt; keepalive probes (10 s idle, then every
	 * 5 s) find a kept-alive connection whose peer went away between
	 * attempts, so the next one opens a fresh connection.
	 */
	curl_easy_setopt(t->easy, CURLOPT_TCP_KEEPALIVE, 1L);
	curl_easy_setopt(t->easy, CURLOPT_TCP_KEEPIDLE, 10L);
	curl_easy_setopt(t->easy, CURLOPT_TCP_KEEPINTVL, 5L);
	/* A redirect of a POST is not a delivery; report it as a failure. */
	curl_easy_setopt(t->easy, CURLOPT_FOLLOWLOCATION, 0L);
}

QbHttpStart
qb_http_post(QbHttp *h, const QbDestination *dest,
			 const char *message_id, const json_t *row_headers,
			 const char *body, size_t body_len, int tag,
			 char *err, size_t errlen)
{
	QbhTransfer *t;
	struct curl_slist *headers = NULL;

	switch (qbh_build_headers(&headers, dest, message_id, row_headers, body, body_len,
							  err, errlen))
	{
		case QB_HDR_OK:
			break;
		case QB_HDR_ROW_INVALID:
			curl_slist_free_all(headers);
			return QB_HTTP_ROW_INVALID;
		case QB_HDR_FAILED:
			curl_slist_free_all(headers);
			return QB_HTTP_NOT_STARTED;
	}
	if ((t = qbh_transfer_get(h)) == NULL)
	{
		curl_slist_free_all(headers);
		snprintf(err, errlen, "out of memory");
		return QB_HTTP_NOT_STARTED;
	}
	t->headers = headers;
	t->tag = tag;
	t->egress = dest->egress;
	t->host_egress = dest->host_egress;
	qbh_transfer_setopt(t, dest, body, body_len);
	if (curl_multi_add_handle(h->multi, t->easy) != CURLM_OK)
	{
		curl_slist_free_all(t->headers);
		t->headers = NULL;
		t->next = h->free_list;
		h->free_list = t;
		snprintf(err, errlen, "curl_multi_add_handle failed");
		return QB_HTTP_NOT_STARTED;
	}
	t->prev = NULL;
	t->next = h->active;
	if (h->active)
		h->active->prev = t;
	h->active = t;
	h->in_flight++;
	return QB_HTTP_STARTED;
}

long
qb_http_timeout_ms(QbHttp *h)
{
	long		elapsed;

	if (h->timer_ms < 0)
		return h->in_flight > 0 ? 1000 : -1;
	elapsed = qb_now_ms() - h->timer_set_at;
	return h->timer_ms > elapsed ? h->timer_ms - elapsed : 0;
}

/* qbh_recycle takes a transfer out of the multi and onto the free list. */
static void
qbh_recycle(QbHttp *h, QbhTransfer *t)
{
	curl_multi_remove_handle(h->multi, t->easy);
	curl_slist_free_all(t->headers);
	t->headers = NULL;
	if (t->prev)
		t->prev->next = t->next;
	else
		h->active = t->next;
	if (t->next)
		t->next->prev = t->prev;
	t->prev = NULL;
	t->next = h->free_list;
	h->free_list = t;
	h->in_flight--;
}

/*
 * qb_http_retry_after_ms: see qb_http.h.  The date form goes through
 * curl_getdate, libcurl's own parser (the one CURLINFO_RETRY_AFTER uses);
 * that info itself reads 0 for an absent header, a garbled one and "now"
 * alike, which the engine must tell apart.
 */
long
qb_http_retry_after_ms(const char *value, long long now)
{
	const char *p = value;
	long long	secs = 0;
	time_t		date;

	if (value == NULL)
		return -1;
	while (*p == ' ' || *p == '\t')
		p++;
	if (*p >= '0' && *p <= '9')
	{
		for (; *p >= '0' && *p <= '9'; p++)
			secs = secs < LONG_MAX / 10000 ? secs * 10 + (*p - '0') : LONG_MAX / 10000;
		while (*p == ' ' || *p == '\t')
			p++;
		return *p == '\0' ? (long) secs * 1000 : -1;
	}
	if (*p == '\0' || (date = curl_getdate(p, NULL)) == -1)
		return -1;
	if ((long long) date <= now)
		return 0;
	/* a date in year 10^9 is as far as the largest delta-seconds, not an overflow */
	secs = (long long) date - now;
	if (secs > LONG_MAX / 10000)
		secs = LONG_MAX / 10000;
	return (long) secs * 1000;
}

/* qbh_retry_after: the Retry-After delay of a 429 or 503 answer, or -1. */
static long
qbh_retry_after(CURL *easy, long status)
{
	struct curl_header *hdr = NULL;

	if (status != 429 && status != 503)
		return -1;
	if (curl_easy_header(easy, "Retry-After", 0, CURLH_HEADER, -1, &hdr) != CURLHE_OK)
		return -1;
	return qb_http_retry_after_ms(hdr->value, (long long) time(NULL));
}

/*
 * qbh_open_socket: libcurl's socket for each address it is about to connect
 * to, after DNS: the egress rules judge the address actually used, so a
 * name re-pointed after configure() cannot lead anywhere the rules refuse,
 * and an address host is refused by names-only rules set after it.
 * A refused address gives no socket; libcurl tries the next one, and the
 * attempt fails with the reason kept for last_error.
 */
static curl_socket_t
qbh_open_socket(void *arg, curlsocktype purpose, struct curl_sockaddr *a)
{
	QbhTransfer *t = arg;
	char	   *url = NULL;
	curl_socket_t s;
	uint32_t   *fd;

	t->resolving = false;		/* the name is resolved: see qbh_socket_cb */
	/* the URL names the host the rules look for among their names */
	curl_easy_getinfo(t->easy, CURLINFO_EFFECTIVE_URL, &url);
	if (purpose == CURLSOCKTYPE_IPCXN &&
		!qb_egress_addr_ok(qb_egress_in_force(t->egress, t->host_egress), url, &a->addr,
						   t->refused, sizeof(t->refused)))
		return CURL_SOCKET_BAD;
	s = socket(a->family, a->socktype, a->protocol);
	/* ours: not in the set yet; without room in the table, watched as libcurl says */
	if (s >= 0 && (fd = qbh_fd_slot(t->h, s)) != NULL)
		*fd = QBH_FD_OURS;
	return s;
}

/*
 * qbh_close_socket: a connection closed with bytes its peer has not
 * acknowledged (an attempt that timed out into a partition) is reset, not
 * closed.  Closed, the kernel would go on sending the request after the
 * partition heals, and the receiver would get this attempt after the retry
 * and after later rows of its key (bench/chaos, "Findings").  A reset
 * drops the bytes; a connection closed with nothing pending ends as usual.
 * A socket still in our set (kept) leaves it first: close alone would not
 * take it out while another process shares the socket.
 */
static int
qbh_close_socket(void *arg, curl_socket_t fd)
{
	QbHttp	   *h = arg;
	int			pending = 0;

	if (fd >= 0 && fd < h->nfds)
	{
		if (h->fds[fd] & QBH_FD_EVENTS)
			epoll_ctl(h->epfd, EPOLL_CTL_DEL, fd, NULL);
		h->fds[fd] = 0;
	}

	if (ioctl(fd, SIOCOUTQ, &pending) == 0 && pending > 0)
	{
		struct linger abort_now = {.l_onoff = 1,.l_linger = 0};

		(void) setsockopt(fd, SOL_SOCKET, SO_LINGER, &abort_now, sizeof(abort_now));
	}
	return close(fd);
}

/* qbh_finish turns one finished transfer into an outcome and recycles it. */
static void
qbh_finish(QbHttp *h, CURL *easy, CURLcode code, QbHttpDone done, void *arg)
{
	QbhTransfer *t = NULL;
	QbHttpOutcome out = {.retry_after_ms = -1};
	char	   *url = NULL;
	char		why[80] = "";

	curl_easy_getinfo(easy, CURLINFO_PRIVATE, (char **) &t);
	curl_easy_getinfo(easy, CURLINFO_EFFECTIVE_URL, &url);
	curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &out.status);
	if (code == CURLE_WRITE_ERROR && t->cut)
		code = CURLE_OK;		/* our cut, not a failure: judge the status */
	if (code != CURLE_OK)
	{
		out.ok = false;
		snprintf(out.error, sizeof(out.error), "POST %s failed: %.255s",
				 url ? url : "?", t->refused[0] ? t->refused :
				 t->errbuf[0] ? t->errbuf : curl_easy_strerror(code));
	}
	else if (out.status >= 200 && out.status < 300)
		out.ok = true;
	else
	{
		/* keep the answer printable: stop at the first control byte */
		for (size_t i = 0; i < t->body_len; i++)
			if ((unsigned char) t->body[i] < 0x20)
			{
				t->body[i] = '\0';
				break;
			}
		out.gone = out.status == 410;
		out.retry_after_ms = qbh_retry_after(easy, out.status);
		if (out.gone)
			snprintf(why, sizeof(why), " (Gone: the receiver asks not to be sent more)");
		else if (out.retry_after_ms >= 0)
			snprintf(why, sizeof(why), " (Retry-After: %ld ms)", out.retry_after_ms);
		snprintf(out.error, sizeof(out.error), "POST %s answered HTTP %ld%s%s%s",
				 url ? url : "?", out.status, why, t->body[0] ? ": " : "", t->body);
	}
	qbh_recycle(h, t);
	done(arg, t->tag, &out);
}

void
qb_http_perform(QbHttp *h, QbHttpDone done, void *arg)
{
	struct epoll_event evs[64];
	int			n;
	CURLMsg    *msg;
	int			left;

	n = epoll_wait(h->epfd, evs, 64, 0);
	for (int i = 0; i < n; i++)
	{
		int			s = evs[i].data.fd;
		int			mask = 0;

		if (s < h->nfds && (h->fds[s] & (QBH_FD_OURS | QBH_FD_USED)) == QBH_FD_OURS)
		{
			/* a kept connection's peer wrote or hung up: no transfer to tell */
			epoll_ctl(h->epfd, EPOLL_CTL_DEL, s, NULL);
			h->fds[s] = QBH_FD_OURS;
			continue;
		}

		if (evs[i].events & (EPOLLIN | EPOLLHUP))
			mask |= CURL_CSELECT_IN;
		if (evs[i].events & EPOLLOUT)
			mask |= CURL_CSELECT_OUT;
		if (evs[i].events & EPOLLERR)
			mask |= CURL_CSELECT_ERR;
		qbh_action(h, s, mask);
	}
	if (h->timer_ms >= 0 && qb_http_timeout_ms(h) == 0)
	{
		h->timer_ms = -1;
		qbh_action(h, CURL_SOCKET_TIMEOUT, 0);
	}
	while ((msg = curl_multi_info_read(h->multi, &left)) != NULL)
		if (msg->msg == CURLMSG_DONE)
			qbh_finish(h, msg->easy_handle, msg->data.result, done, arg);
}

/* qb_http_abort_all drops every post in flight without reporting it. */
void
qb_http_abort_all(QbHttp *h)
{
	while (h->active)
		qbh_recycle(h, h->active);
}
