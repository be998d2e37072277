/*-------------------------------------------------------------------------
 * qb_host.c
 *	  What qb_host.h declares besides the host ops: logging through the
 *	  host, loading the stored configuration, and starting the span
 *	  exporter it names (the monotonic clock is lib's qb_clock.c, which
 *	  publishers and consumers read too).
 *-------------------------------------------------------------------------
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qb_host.h"
#include "qb_otlp.h"
#include "qb_store.h"

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
qb_store_load_config(const QbHost *host, const QbStore *store, QbConfig **out,
					 char *err, size_t errlen)
{
	char	   *text = NULL;
	int			rc;

	*out = NULL;
	if (store->config_load(store->ctx, &text, err, errlen) != 0)
		return -1;
	if (text == NULL)
		return 0;
	rc = qb_config_parse(text, strlen(text), host->config_env, out, err, errlen) == 0 ? 1 : -1;
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

	switch (qb_store_load_config(host, store, &loaded, err, sizeof(err)))
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
			qb_telemetry_apply(host, NULL);
			return false;
		case -1:
			qb_log(host, QB_LOG_WARNING,
				   "could not load the configuration (%s); %s",
				   err, *cfg ? "keeping the previous one" : "claiming nothing until it is fixed");
			return false;
	}
	qb_config_free(*cfg);
	*cfg = loaded;
	*warned_no_config = false;
	if (host->config_loaded)
		host->config_loaded(host->ctx, loaded);
	qb_telemetry_apply(host, loaded);
	return true;
}

/* qb_telemetry_apply: see qb_host.h. */
void
qb_telemetry_apply(const QbHost *host, const QbConfig *cfg)
{
	char		err[QB_ERRLEN];

	if (host->runtime != NULL &&
		!qb_otlp_configure(&host->runtime->otlp, cfg ? &cfg->otlp : NULL, host->metrics, NULL,
						   err, sizeof(err)))
		qb_log(host, QB_LOG_WARNING, "spans are not exported: %s", err);
}

/* qb_otlp_log_errors: see qb_host.h. */
void
qb_otlp_log_errors(const QbHost *host)
{
	QbOtlpExporter *ex = qb_host_otlp(host);
	char		err[QB_ERRLEN];
	long		now = qb_now_ms();

	if (ex == NULL || (ex->logged_ms != 0 && now - ex->logged_ms < 60000) ||
		!qb_otlp_take_error(ex, err, sizeof(err)))
		return;
	ex->logged_ms = now;
	qb_log(host, QB_LOG_WARNING, "span export failed (more spans may be dropped, counted in queuebox_otlp_spans_dropped_total): %s", err);
}
