/*-------------------------------------------------------------------------
 * qb_util.c
 *	  Small shared helpers of the core: UUIDs, logging through the host,
 *	  loading the stored configuration, freeing claimed rows.
 *-------------------------------------------------------------------------
 */
#include <stdarg.h>
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/rand.h>

#include "qb_host.h"
#include "qb_store.h"

/*
 * qb_uuid_v4 writes a random UUID.  Claim tokens must be unguessable by
 * another claimer, so they come from OpenSSL's CSPRNG, not from rand().
 */
bool
qb_uuid_v4(char out[QB_UUID_LEN + 1])
{
	unsigned char b[16];

	if (RAND_bytes(b, sizeof(b)) != 1)
		return false;
	b[6] = (b[6] & 0x0f) | 0x40;
	b[8] = (b[8] & 0x3f) | 0x80;
	snprintf(out, QB_UUID_LEN + 1,
			 "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
			 b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7],
			 b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
	return true;
}

/* qb_log formats a message and hands it to the host's logger. */
void
qb_log(const QbHost *host, QbLogLevel level, const char *fmt,...)
{
	char		buf[1024];
	va_list		ap;

	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	host->log(host->ctx, level, buf);
}

/*
 * qb_store_load_config reads the stored document and parses it with the
 * validator every host uses.  Returns 1 with a new config in *out, 0 when no
 * document is stored, -1 with err set (unreadable, or not valid in this
 * process, e.g. a ${NAME} it cannot see).
 */
static int
qb_store_load_config(const QbStore *store, QbConfig **out, char *err, size_t errlen)
{
	char	   *text = NULL;
	int			rc;

	*out = NULL;
	if (store->config_load(store->ctx, &text, err, errlen) != 0)
		return -1;
	if (text == NULL)
		return 0;
	rc = qb_config_parse(text, strlen(text), out, err, errlen) == 0 ? 1 : -1;
	free(text);
	return rc;
}

/*
 * qb_reload_config swaps an engine's *cfg for the stored document; true
 * when it did.  With no document stored, *cfg becomes NULL (said once,
 * naming what waits).  An invalid stored document keeps the previous
 * config; with none the engine claims nothing, because acting on rows for
 * want of a route or a template the user is about to configure would lose
 * their work.
 */
bool
qb_reload_config(const QbHost *host, const QbStore *store, QbConfig **cfg,
				 bool *warned_no_config, const char *what_waits)
{
	char		err[QB_ERRLEN];
	QbConfig   *loaded = NULL;

	switch (qb_store_load_config(store, &loaded, err, sizeof(err)))
	{
		case 0:
			if (!*warned_no_config)
				qb_log(host, QB_LOG_INFO,
					   "no configuration stored yet; %s wait until SELECT queuebox.configure(...) is run",
					   what_waits);
			*warned_no_config = true;
			qb_config_free(*cfg);
			*cfg = NULL;
			if (host->config_loaded)
				host->config_loaded(host->ctx, NULL);
			return false;
		case -1:
			qb_log(host, QB_LOG_WARNING,
				   "could not load the stored configuration (%s); %s",
				   err, *cfg ? "keeping the previous one" : "claiming nothing until it is fixed");
			return false;
	}
	qb_config_free(*cfg);
	*cfg = loaded;
	*warned_no_config = false;
	if (host->config_loaded)
		host->config_loaded(host->ctx, loaded);
	return true;
}

/* qb_outbox_rows_free_one frees what one row owns (not the row itself). */
void
qb_outbox_rows_free_one(QbOutboxRow *row)
{
	free(row->topic);
	free(row->key);
	free(row->payload);
	free(row->headers);
	free(row->destination);
	memset(row, 0, sizeof(*row));
}

/* qb_outbox_rows_free frees the rows a store's outbox_cycle returned. */
void
qb_outbox_rows_free(QbOutboxRow *rows, int n)
{
	if (rows == NULL)
		return;
	for (int i = 0; i < n; i++)
		qb_outbox_rows_free_one(&rows[i]);
	free(rows);
}

/* qb_cycle_out_free frees all a store's outbox_cycle returned. */
void
qb_cycle_out_free(QbCycleOut *out)
{
	for (int i = 0; i < out->nchanges; i++)
		free(out->changes[i].destination);
	for (int i = 0; i < out->nstates; i++)
		free(out->states[i].destination);
	free(out->changes);
	free(out->states);
	qb_outbox_rows_free(out->rows, out->nrows);
	memset(out, 0, sizeof(*out));
}

static const char *const qb_circuit_names[] = {"closed", "open", "half-open", "disabled"};

const char *
qb_circuit_name(QbCircuit c)
{
	return qb_circuit_names[c];
}

QbCircuit
qb_circuit_parse(const char *name)
{
	for (int i = 0; i < 4; i++)
		if (name != NULL && strcmp(name, qb_circuit_names[i]) == 0)
			return (QbCircuit) i;
	return QB_CIRCUIT_CLOSED;
}

/* qb_relay_rows_free frees what a store's relay_claim returned. */
void
qb_relay_rows_free(QbRelayRow *rows, int n)
{
	if (rows == NULL)
		return;
	for (int i = 0; i < n; i++)
	{
		free(rows[i].source);
		free(rows[i].event_type);
	}
	free(rows);
}

/* qb_now_ms: see qb_host.h. */
long
qb_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}
