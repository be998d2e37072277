/*
 * test_metrics.c: the shared counters, their Prometheus rendering, and the
 * ingress's UTF-8 check.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "qb_metrics.h"
#include "qb_utf8.h"

static void
has(const char *text, const char *line)
{
	if (strstr(text, line) == NULL)
		fail_msg("missing line \"%s\" in:\n%s", line, text);
}

static void
test_render(void **state)
{
	QbMetrics  *m = malloc(sizeof(QbMetrics));
	QbGauges	g = {.outbox_pending = 12, .outbox_processing = 3, .outbox_oldest_pending_sec = 4.5,
				   .inbox_pending = 7, .database_up = true};
	char	   *t;

	qb_metrics_init(m);
	qb_metrics_delivery(m, "payments", QB_DELIVERED, 0.003);
	qb_metrics_delivery(m, "payments", QB_DELIVERED, 0.2);
	qb_metrics_delivery(m, "payments", QB_DELIVERED, 1000);
	qb_metrics_delivery(m, "payments", QB_FAILED, -1);
	qb_metrics_delivery(m, "audit", QB_DEAD, -1);
	qb_metrics_received(m, "stripe", QB_RX_ACCEPTED);
	qb_metrics_received(m, "stripe", QB_RX_ACCEPTED);
	qb_metrics_received(m, "stripe", QB_RX_UNAUTHORIZED);
	qb_metrics_add(&m->relay_forwarded, 5);
	/* a second slot of one name (two processes naming it at once) is summed */
	m->sources[5].state = QB_SLOT_IN_USE;
	strcpy(m->sources[5].name, "stripe");
	m->sources[5].count[QB_RX_ACCEPTED] = 10;

	t = qb_metrics_render(m, &g);
	assert_non_null(t);
	has(t, "# TYPE queuebox_outbox_delivered_total counter\n");
	has(t, "queuebox_outbox_delivered_total{destination=\"payments\"} 3\n");
	has(t, "queuebox_outbox_failed_total{destination=\"payments\"} 1\n");
	has(t, "queuebox_outbox_dead_total{destination=\"audit\"} 1\n");
	has(t, "queuebox_delivery_latency_seconds_bucket{destination=\"payments\",le=\"0.005\"} 1\n");
	has(t, "queuebox_delivery_latency_seconds_bucket{destination=\"payments\",le=\"0.25\"} 2\n");
	has(t, "queuebox_delivery_latency_seconds_bucket{destination=\"payments\",le=\"300\"} 2\n");
	has(t, "queuebox_delivery_latency_seconds_bucket{destination=\"payments\",le=\"+Inf\"} 3\n");
	has(t, "queuebox_delivery_latency_seconds_count{destination=\"payments\"} 3\n");
	has(t, "queuebox_delivery_latency_seconds_sum{destination=\"payments\"} 1000.203000\n");
	has(t, "queuebox_inbox_received_total{source=\"stripe\",result=\"accepted\"} 12\n");
	has(t, "queuebox_inbox_received_total{source=\"stripe\",result=\"unauthorized\"} 1\n");
	has(t, "queuebox_inbox_received_total{source=\"stripe\",result=\"unavailable\"} 0\n");
	has(t, "queuebox_relay_forwarded_total 5\n");
	has(t, "queuebox_outbox_pending 12\n");
	has(t, "queuebox_outbox_oldest_pending_age_seconds 4.5\n");
	has(t, "queuebox_database_up 1\n");
	/* the summed slot is shown once */
	{
		const char *first = strstr(t, "source=\"stripe\",result=\"accepted\"");

		assert_null(strstr(first + 1, "source=\"stripe\",result=\"accepted\""));
	}
	free(t);
	free(m);
}

/*
 * The configured names get their counters at 0 before any event; a slot
 * whose name is no longer configured is not rendered, QueueBox's own
 * buckets are; without circuits no state gauge.
 */
static void
test_configured_names(void **state)
{
	QbMetrics  *m = malloc(sizeof(QbMetrics));
	const char *const dests[] = {"idle", "busy"};
	const char *const sources[] = {"quiet"};
	QbGauges	g = {.outbox_pending = 0, .outbox_processing = 0, .outbox_oldest_pending_sec = 0,
				   .inbox_pending = 0, .inbox_processing = 0, .inbox_oldest_pending_sec = 0,
				   .database_up = false, .ndests = 2, .dest_names = dests,
				   .nsources = 1, .source_names = sources};
	char	   *t;

	qb_metrics_init(m);
	qb_metrics_delivery(m, "busy", QB_DELIVERED, 0.02);
	qb_metrics_delivery(m, "removed", QB_DEAD, -1);
	qb_metrics_delivery(m, "_unrouted", QB_DEAD, -1);
	qb_metrics_received(m, "removed", QB_RX_ACCEPTED);

	t = qb_metrics_render(m, &g);
	assert_non_null(t);
	has(t, "queuebox_outbox_delivered_total{destination=\"idle\"} 0\n");
	has(t, "queuebox_outbox_failed_total{destination=\"idle\"} 0\n");
	has(t, "queuebox_outbox_dead_total{destination=\"idle\"} 0\n");
	has(t, "queuebox_delivery_latency_seconds_bucket{destination=\"idle\",le=\"+Inf\"} 0\n");
	has(t, "queuebox_delivery_latency_seconds_count{destination=\"idle\"} 0\n");
	has(t, "queuebox_outbox_delivered_total{destination=\"busy\"} 1\n");
	has(t, "queuebox_outbox_dead_total{destination=\"_unrouted\"} 1\n");
	for (int k = 0; k < QB_NRESULTS; k++)
	{
		static const char *const results[] = {"accepted", "duplicate", "bad_request",
		"unauthorized", "too_large", "unprocessable", "unavailable"};
		char		line[160];

		snprintf(line, sizeof(line), "queuebox_inbox_received_total{source=\"quiet\",result=\"%s\"} 0\n",
				 results[k]);
		has(t, line);
	}
	assert_null(strstr(t, "\"removed\""));
	assert_null(strstr(t, "queuebox_destination_state"));
	/* the configuration's order: idle before busy */
	assert_true(strstr(t, "destination=\"idle\"") < strstr(t, "destination=\"busy\""));
	free(t);
	free(m);
}

static void
test_overflow_slot(void **state)
{
	QbMetrics  *m = malloc(sizeof(QbMetrics));
	char		name[32];
	char	   *t;

	qb_metrics_init(m);
	for (int i = 0; i < QB_METRICS_SLOTS + 5; i++)
	{
		snprintf(name, sizeof(name), "d%d", i);
		qb_metrics_delivery(m, name, QB_DELIVERED, -1);
	}
	t = qb_metrics_render(m, NULL);
	has(t, "queuebox_outbox_delivered_total{destination=\"d62\"} 1\n");
	has(t, "queuebox_outbox_delivered_total{destination=\"_other\"} 6\n");
	assert_null(strstr(t, "queuebox_outbox_pending"));
	free(t);
	free(m);
}

static void
test_utf8(void **state)
{
	assert_int_equal(qb_utf8_invalid_at("plain ascii", 11), -1);
	assert_int_equal(qb_utf8_invalid_at("caf\xc3\xa9", 5), -1);
	assert_int_equal(qb_utf8_invalid_at("\xf0\x9f\x98\x80", 4), -1);
	assert_int_equal(qb_utf8_invalid_at("caf\xe9", 4), 3);		/* Latin-1 */
	assert_int_equal(qb_utf8_invalid_at("ab\xc0\xaf", 4), 2);	/* overlong */
	assert_int_equal(qb_utf8_invalid_at("\xed\xa0\x80", 3), 0); /* surrogate */
	assert_int_equal(qb_utf8_invalid_at("x\xf4\x90\x80\x80", 5), 1); /* > U+10FFFF */
	assert_int_equal(qb_utf8_invalid_at("ab\xe2\x82", 4), 2);	/* cut short */
	assert_int_equal(qb_utf8_invalid_at("a\0b", 3), 1);		/* NUL */
}

/* worker slots: taken by name, taken again by a restarted worker, states and cycles */
/* the configuration's last load: in force, a failure that keeps it, metrics */
static void
test_config_load(void **state)
{
	QbMetrics  *m = malloc(sizeof(QbMetrics));
	QbConfigLoad c;
	char	   *t;

	qb_metrics_init(m);
	qb_config_load_read(m, &c);
	assert_int_equal(c.source, QB_CONFIG_SOURCE_NONE);
	assert_int_equal(c.loaded_at_ms, 0);
	t = qb_metrics_render(m, NULL);
	has(t, "queuebox_config_last_reload_success_timestamp_seconds 0.000\n");
	assert_null(strstr(t, "queuebox_config_info"));
	free(t);

	/* SHA-256 of "abc" (FIPS 180-2's example) */
	qb_config_load_note(m, QB_CONFIG_SOURCE_FILE, "/etc/queuebox/q.yaml", true, "abc", 3, NULL);
	qb_config_load_read(m, &c);
	assert_int_equal(c.source, QB_CONFIG_SOURCE_FILE);
	assert_string_equal(c.path, "/etc/queuebox/q.yaml");
	assert_string_equal(c.sha256, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
	assert_true(c.loaded_at_ms > 0);
	assert_int_equal(c.failed_at_ms, 0);
	t = qb_metrics_render(m, NULL);
	has(t, "queuebox_config_last_reload_successful 1\n");
	has(t, "queuebox_config_info{source=\"file\",sha256=\"ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad\"} 1\n");
	free(t);

	/*
	 * a failure keeps what is in force, and says why; every worker that
	 * meets the same failed document notes it, and it counts once
	 */
	for (int worker = 0; worker < 4; worker++)
		qb_config_load_note(m, QB_CONFIG_SOURCE_FILE, "/etc/queuebox/q.yaml", false, "bad: [", 6,
							"destinations.a.url: not a URL");
	qb_config_load_read(m, &c);
	assert_string_equal(c.sha256, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
	assert_string_equal(c.error, "destinations.a.url: not a URL");
	assert_true(c.failed_at_ms >= c.loaded_at_ms);
	t = qb_metrics_render(m, NULL);
	has(t, "queuebox_config_last_reload_successful 0\n");
	has(t, "queuebox_config_reload_failures_total 1\n");
	free(t);
	/* another failed document, or a file that cannot be read, is a new failure */
	qb_config_load_note(m, QB_CONFIG_SOURCE_FILE, "/etc/queuebox/q.yaml", false, "bad: {", 6,
						"destinations.a.url: not a URL");
	qb_config_load_note(m, QB_CONFIG_SOURCE_FILE, "/etc/queuebox/q.yaml", false, NULL, 0,
						"could not open it: No such file or directory");
	qb_config_load_note(m, QB_CONFIG_SOURCE_FILE, "/etc/queuebox/q.yaml", false, NULL, 0,
						"could not open it: No such file or directory");
	t = qb_metrics_render(m, NULL);
	has(t, "queuebox_config_reload_failures_total 3\n");
	free(t);

	/* the next good load clears it */
	qb_config_load_note(m, QB_CONFIG_SOURCE_TABLE, NULL, true, "", 0, NULL);
	t = qb_metrics_render(m, NULL);
	has(t, "queuebox_config_last_reload_successful 1\n");
	has(t, "queuebox_config_info{source=\"table\",sha256=\"e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855\"} 1\n");
	free(t);
	assert_string_equal(qb_config_source_name(QB_CONFIG_SOURCE_TABLE), "table");
	free(m);
}

static void
test_worker_slots(void **state)
{
	QbMetrics  *m = calloc(1, sizeof(QbMetrics));
	QbActivitySlot *a = qb_metrics_worker(m, "outbox 0", 100);
	QbActivitySlot *b = qb_metrics_worker(m, "relay", 101);
	int64_t		since;

	assert_non_null(a);
	assert_non_null(b);
	assert_true(a != b);
	assert_string_equal(a->name, "outbox 0");
	assert_int_equal(a->pid, 100);
	assert_int_equal(a->activity, QB_W_STARTING);
	assert_true(a->since_ms > 0);
	assert_int_equal(a->last_cycle_ms, 0);
	since = a->since_ms;
	qb_worker_set(a, QB_W_STARTING);	/* the same state: since stays */
	assert_int_equal(a->since_ms, since);
	qb_worker_set(a, QB_W_CLAIMING);
	assert_int_equal(a->activity, QB_W_CLAIMING);
	assert_true(a->since_ms >= since);
	qb_worker_cycle(a);
	qb_worker_cycle(a);
	assert_int_equal(a->cycles, 2);
	assert_true(a->last_cycle_ms > 0);
	/* a restarted worker takes its slot again, fresh */
	assert_ptr_equal(qb_metrics_worker(m, "outbox 0", 200), a);
	assert_int_equal(a->pid, 200);
	assert_int_equal(a->cycles, 0);
	assert_int_equal(a->activity, QB_W_STARTING);
	/* NULL is a no-op; names as the overview shows them */
	qb_worker_set(NULL, QB_W_IDLE);
	qb_worker_cycle(NULL);
	assert_null(qb_metrics_worker(NULL, "x", 1));
	assert_string_equal(qb_worker_activity_name(QB_W_BACKING_OFF), "backing off");
	assert_string_equal(qb_worker_activity_name(QB_W_NACTIVITIES), "unknown");
	/* every slot taken: NULL, no overflow */
	for (int i = 2; i < QB_METRICS_WORKERS; i++)
	{
		char		name[24];

		snprintf(name, sizeof(name), "consumer %d", i);
		assert_non_null(qb_metrics_worker(m, name, i));
	}
	assert_null(qb_metrics_worker(m, "one too many", 1));
	free(m);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_render),
		cmocka_unit_test(test_configured_names),
		cmocka_unit_test(test_overflow_slot),
		cmocka_unit_test(test_utf8),
		cmocka_unit_test(test_worker_slots),
		cmocka_unit_test(test_config_load),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
