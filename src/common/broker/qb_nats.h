/*-------------------------------------------------------------------------
 * qb_nats.h
 *	  What the NATS publisher (qb_pub_nats.c) and the NATS source consumer
 *	  (qb_src_nats.c) share about cnats: its threads' signal mask, the
 *	  library opened once per process, the common connection options, and
 *	  error texts that never show a password.
 *
 * Threads: cnats starts threads that block no signal of their own; every
 * call that may start one (nats_Open, a connect, the first JetStream call,
 * an async publish) must run between qb_nats_block_signals and
 * qb_nats_restore_signals, so SIGTERM, SIGHUP and the latch's SIGURG reach
 * only the worker's thread.
 *-------------------------------------------------------------------------
 */
#ifndef QB_NATS_H
#define QB_NATS_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>

#include <nats/nats.h>

#define QB_NATS_CONNECT_MS		2000
#define QB_NATS_RECONNECT_MS	250
#define QB_NATS_MAX_SERVERS		64	/* servers in one list */

extern void qb_nats_block_signals(sigset_t *old);
extern void qb_nats_restore_signals(const sigset_t *old);

/* nats_Open once per process (never closed), with every signal blocked. */
extern bool qb_nats_open(char *err, size_t errlen);

/*
 * A server list (nats:// or tls:// URLs, commas between): each read by the
 * URL reader as qb_nats_options reads it, user info allowed.  false with
 * err naming what is wrong (never the URL: it may hold a password).
 */
extern bool qb_nats_url_check(const char *list, char *err, size_t errlen);

/*
 * One server of a list (len bytes of one) as cnats is given it:
 * scheme://[user[:password]@]host:port, written from the URL reader's
 * parts (decoded), so that cnats's reading of it (the last '@', the first
 * ':' before it, the last ':' after any ']') names the reader's host.
 * malloc'd; it holds the password.  NULL with err when it does not read.
 */
extern char *qb_nats_server(const char *one, size_t len, char *err, size_t errlen);

/*
 * New options for a server list: its servers in their order (each written
 * again from what the URL reader read, so cnats connects to the host the
 * egress check judged), client name "queuebox", the connect timeout, and
 * reconnects forever a few times a second.  NULL when a server does not
 * read or cnats refused.
 */
extern natsOptions *qb_nats_options(const char *url, natsStatus *s);

/* A server list as the reader reads it, each user:password replaced by ***. */
extern void qb_nats_redact(const char *url, char *out, size_t outlen);

/* cnats's status text plus its last error detail. */
extern void qb_nats_status_text(natsStatus s, char *out, size_t outlen);

#endif							/* QB_NATS_H */
