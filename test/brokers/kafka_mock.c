/*-------------------------------------------------------------------------
 * kafka_mock.c
 *	  A Kafka cluster for the TAP tests: librdkafka's mock cluster on real
 *	  loopback TCP, driven by commands on stdin.
 *
 *	kafka_mock --bootstrap-file FILE [--brokers N] [--topic NAME:PARTITIONS]...
 *	           [--missing NAME]...
 *
 * It creates the topics, marks the --missing ones as unknown to every
 * client (as a cluster with auto-create off answers), writes its bootstrap
 * string to FILE (renamed into place, so a reader never sees half of it),
 * then answers one command per line on stdout:
 *
 *	produce JSON	one message from {"topic", "key" (optional), "value",
 *					"headers": {name: string} (optional), "partition"
 *					(optional)}, sent and flushed; then "ok PARTITION
 *					OFFSET" or "error REASON"
 *	committed GROUP TOPIC
 *					the offsets GROUP committed on each partition of TOPIC:
 *					"ok O0 O1 ..." in partition order, -1 where none
 *	consume TOPIC	every message of TOPIC from the start of each partition,
 *					one JSON object a line {"partition", "offset", "key",
 *					"value", "headers": {name: value} (the last of a
 *					name), "header_list": [[name, value], ...] (every
 *					one, in order)}, then "end N"
 *	errors N CODE	the next N produce requests fail with Kafka error CODE
 *					(a number, e.g. 6 NOT_LEADER_FOR_PARTITION), then "ok"
 *	down ID, up ID	broker ID (1..N) refuses connections / takes them again
 *					(no leader moves: what it leads or coordinates waits)
 *	coordinator GROUP ID
 *					broker ID coordinates GROUP, so a test can take the
 *					coordinator down without the partitions' leaders; "ok"
 *	leader TOPIC PARTITION ID
 *					broker ID leads the partition; "ok"
 *	quit			stop (so does the end of stdin)
 *
 * The mock API is experimental in librdkafka 2.0.2 (clibs.md §1); this file
 * is a test helper, never linked into QueueBox.
 *-------------------------------------------------------------------------
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>
#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

static rd_kafka_mock_cluster_t *mc;
static const char *bootstraps;
static rd_kafka_t *producer;	/* made by the first produce */
static rd_kafka_resp_err_t dr_err;
static int32_t dr_partition;
static int64_t dr_offset;

static void
die(const char *what, const char *why)
{
	fprintf(stderr, "kafka_mock: %s: %s\n", what, why);
	exit(1);
}

/* km_partitions: how many partitions the cluster says topic has. */
static int
km_partitions(rd_kafka_t *rk, const char *topic)
{
	rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, topic, NULL);
	const struct rd_kafka_metadata *md = NULL;
	int			n = -1;

	if (rd_kafka_metadata(rk, 0, rkt, &md, 10000) == RD_KAFKA_RESP_ERR_NO_ERROR &&
		md->topic_cnt == 1 && md->topics[0].err == RD_KAFKA_RESP_ERR_NO_ERROR)
		n = md->topics[0].partition_cnt;
	if (md != NULL)
		rd_kafka_metadata_destroy(md);
	rd_kafka_topic_destroy(rkt);
	return n;
}

static void
km_print(const rd_kafka_message_t *m)
{
	json_t	   *o = json_object();
	json_t	   *h = json_object();
	json_t	   *all = json_array();
	rd_kafka_headers_t *hdrs = NULL;
	char	   *line;

	json_object_set_new(o, "partition", json_integer(m->partition));
	json_object_set_new(o, "offset", json_integer(m->offset));
	json_object_set_new(o, "key", m->key ? json_stringn(m->key, m->key_len) : json_null());
	json_object_set_new(o, "value", json_stringn(m->payload ? m->payload : "", m->len));
	if (rd_kafka_message_headers(m, &hdrs) == RD_KAFKA_RESP_ERR_NO_ERROR)
	{
		const char *name;
		const void *val;
		size_t		len;

		for (size_t i = 0; rd_kafka_header_get_all(hdrs, i, &name, &val, &len) == RD_KAFKA_RESP_ERR_NO_ERROR; i++)
		{
			json_object_set_new(h, name, json_stringn(val ? val : "", len));
			json_array_append_new(all, json_pack("[s, s%]", name, val ? val : "", len));
		}
	}
	json_object_set_new(o, "headers", h);
	json_object_set_new(o, "header_list", all);
	line = json_dumps(o, JSON_COMPACT);
	printf("%s\n", line);
	free(line);
	json_decref(o);
}

static void
km_dr_cb(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
	dr_err = m->err;
	dr_partition = m->partition;
	dr_offset = m->offset;
}

/* km_produce: one message described by a JSON object, sent and flushed. */
static void
km_produce(const char *text)
{
	json_error_t jerr;
	json_t	   *o = json_loads(text, 0, &jerr);
	json_t	   *key,
			   *hdrs;
	const char *topic,
			   *value,
			   *name;
	json_t	   *v;
	rd_kafka_headers_t *h;
	rd_kafka_resp_err_t err;
	int32_t		partition = RD_KAFKA_PARTITION_UA;
	char		why[512];

	if (o == NULL || !json_is_string(json_object_get(o, "topic")) ||
		!json_is_string(json_object_get(o, "value")))
	{
		printf("error produce wants {\"topic\", \"value\", ...}\n");
		json_decref(o);
		return;
	}
	if (producer == NULL)
	{
		rd_kafka_conf_t *conf = rd_kafka_conf_new();

		rd_kafka_conf_set(conf, "bootstrap.servers", bootstraps, why, sizeof(why));
		rd_kafka_conf_set(conf, "enable.idempotence", "true", why, sizeof(why));
		rd_kafka_conf_set(conf, "linger.ms", "0", why, sizeof(why));
		rd_kafka_conf_set_dr_msg_cb(conf, km_dr_cb);
		if ((producer = rd_kafka_new(RD_KAFKA_PRODUCER, conf, why, sizeof(why))) == NULL)
			die("producer", why);
	}
	topic = json_string_value(json_object_get(o, "topic"));
	value = json_string_value(json_object_get(o, "value"));
	key = json_object_get(o, "key");
	if (json_is_integer(json_object_get(o, "partition")))
		partition = (int32_t) json_integer_value(json_object_get(o, "partition"));
	h = rd_kafka_headers_new(4);
	hdrs = json_object_get(o, "headers");
	json_object_foreach(hdrs, name, v)
		if (json_is_string(v))
			rd_kafka_header_add(h, name, -1, json_string_value(v), -1);
	dr_err = RD_KAFKA_RESP_ERR__IN_PROGRESS;
	err = rd_kafka_producev(producer,
							RD_KAFKA_V_TOPIC(topic),
							RD_KAFKA_V_PARTITION(partition),
							RD_KAFKA_V_KEY(json_is_string(key) ? json_string_value(key) : NULL,
										   json_is_string(key) ? json_string_length(key) : 0),
							RD_KAFKA_V_VALUE((void *) value, json_string_length(json_object_get(o, "value"))),
							RD_KAFKA_V_HEADERS(h),
							RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
							RD_KAFKA_V_END);
	if (err != RD_KAFKA_RESP_ERR_NO_ERROR)
	{
		rd_kafka_headers_destroy(h);	/* not taken on failure */
		printf("error %s\n", rd_kafka_err2str(err));
	}
	else if (rd_kafka_flush(producer, 30000) != RD_KAFKA_RESP_ERR_NO_ERROR)
		printf("error flush timed out\n");
	else if (dr_err != RD_KAFKA_RESP_ERR_NO_ERROR)
		printf("error %s\n", rd_kafka_err2str(dr_err));
	else
		printf("ok %d %lld\n", (int) dr_partition, (long long) dr_offset);
	json_decref(o);
}

/* km_consumer: a consumer in group that commits nothing by itself. */
static rd_kafka_t *
km_consumer(const char *group, bool eof)
{
	rd_kafka_conf_t *conf = rd_kafka_conf_new();
	rd_kafka_t *rk;
	char		why[512];

	rd_kafka_conf_set(conf, "bootstrap.servers", bootstraps, why, sizeof(why));
	rd_kafka_conf_set(conf, "enable.partition.eof", eof ? "true" : "false", why, sizeof(why));
	rd_kafka_conf_set(conf, "group.id", group, why, sizeof(why));
	rd_kafka_conf_set(conf, "enable.auto.commit", "false", why, sizeof(why));
	if ((rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, why, sizeof(why))) == NULL)
		die("consumer", why);
	return rk;
}

/* km_committed: the group's committed offsets, asked without joining it. */
static void
km_committed(const char *group, const char *topic)
{
	rd_kafka_t *rk = km_consumer(group, false);
	rd_kafka_topic_partition_list_t *parts;
	rd_kafka_resp_err_t err;
	int			n;

	if ((n = km_partitions(rk, topic)) < 0)
	{
		printf("error no such topic\n");
		rd_kafka_destroy(rk);
		return;
	}
	parts = rd_kafka_topic_partition_list_new(n);
	for (int p = 0; p < n; p++)
		rd_kafka_topic_partition_list_add(parts, topic, p);
	if ((err = rd_kafka_committed(rk, parts, 10000)) != RD_KAFKA_RESP_ERR_NO_ERROR)
		printf("error %s\n", rd_kafka_err2str(err));
	else
	{
		printf("ok");
		for (int p = 0; p < n; p++)
			printf(" %lld", parts->elems[p].offset < 0 ? -1LL : (long long) parts->elems[p].offset);
		printf("\n");
	}
	rd_kafka_topic_partition_list_destroy(parts);
	rd_kafka_destroy(rk);
}

/* km_consume: every message of topic, read until each partition's end. */
static void
km_consume(const char *topic)
{
	rd_kafka_t *rk = km_consumer("kafka_mock", true);
	rd_kafka_topic_partition_list_t *parts;
	int			n,
				eof = 0,
				count = 0;
	time_t		deadline = time(NULL) + 30;

	if ((n = km_partitions(rk, topic)) < 0)
	{
		printf("end 0 no such topic\n");
		rd_kafka_destroy(rk);
		return;
	}
	parts = rd_kafka_topic_partition_list_new(n);
	for (int p = 0; p < n; p++)
		rd_kafka_topic_partition_list_add(parts, topic, p)->offset = RD_KAFKA_OFFSET_BEGINNING;
	rd_kafka_assign(rk, parts);
	rd_kafka_topic_partition_list_destroy(parts);
	while (eof < n && time(NULL) < deadline)
	{
		rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 200);

		if (m == NULL)
			continue;
		if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF)
			eof++;
		else if (m->err == RD_KAFKA_RESP_ERR_NO_ERROR)
		{
			km_print(m);
			count++;
		}
		rd_kafka_message_destroy(m);
	}
	printf("end %d%s\n", count, eof < n ? " timeout" : "");
	rd_kafka_assign(rk, NULL);
	rd_kafka_destroy(rk);
}

int
main(int argc, char **argv)
{
	const char *file = NULL;
	int			nbrokers = 1;
	rd_kafka_t *owner;
	char		err[512];
	static char line[65536];
	char		tmp[1024];
	FILE	   *f;

	setvbuf(stdout, NULL, _IOLBF, 0);
	for (int i = 1; i < argc; i++)
		if (strcmp(argv[i], "--bootstrap-file") == 0 && i + 1 < argc)
			file = argv[++i];
		else if (strcmp(argv[i], "--brokers") == 0 && i + 1 < argc)
			nbrokers = atoi(argv[++i]);
		else if ((strcmp(argv[i], "--topic") == 0 || strcmp(argv[i], "--missing") == 0) && i + 1 < argc)
			i++;				/* after the cluster exists */
		else
			die("usage", "kafka_mock --bootstrap-file FILE [--brokers N] [--topic NAME:PARTITIONS]... [--missing NAME]...");
	if (file == NULL)
		die("usage", "--bootstrap-file is required");

	/* the owner handle must outlive the cluster (clibs.md §1) */
	if ((owner = rd_kafka_new(RD_KAFKA_PRODUCER, rd_kafka_conf_new(), err, sizeof(err))) == NULL)
		die("owner handle", err);
	if ((mc = rd_kafka_mock_cluster_new(owner, nbrokers)) == NULL)
		die("mock cluster", "rd_kafka_mock_cluster_new failed");
	bootstraps = rd_kafka_mock_cluster_bootstraps(mc);
	for (int i = 1; i < argc; i++)
		if (strcmp(argv[i], "--topic") == 0)
		{
			char		name[256];
			int			parts = 1;

			snprintf(name, sizeof(name), "%s", argv[++i]);
			if (strchr(name, ':'))
			{
				parts = atoi(strchr(name, ':') + 1);
				*strchr(name, ':') = '\0';
			}
			if (rd_kafka_mock_topic_create(mc, name, parts, nbrokers) != RD_KAFKA_RESP_ERR_NO_ERROR)
				die("topic", name);
		}
		else if (strcmp(argv[i], "--missing") == 0)
			rd_kafka_mock_topic_set_error(mc, argv[++i], RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART);
		else if (argv[i][0] == '-' && strcmp(argv[i], "--topic") != 0)
			i++;

	snprintf(tmp, sizeof(tmp), "%s.tmp", file);
	if ((f = fopen(tmp, "w")) == NULL || fprintf(f, "%s\n", bootstraps) < 0 || fclose(f) != 0 ||
		rename(tmp, file) != 0)
		die("bootstrap file", file);

	while (fgets(line, sizeof(line), stdin) != NULL)
	{
		char		arg[512];
		char		arg2[256];
		int			a,
					b;

		if (strncmp(line, "produce ", 8) == 0)
			km_produce(line + 8);
		else if (sscanf(line, "committed %255s %255s", arg, arg2) == 2)
			km_committed(arg, arg2);
		else if (sscanf(line, "consume %511s", arg) == 1)
			km_consume(arg);
		else if (sscanf(line, "errors %d %d", &a, &b) == 2)
		{
			for (int i = 0; i < a; i++)
				rd_kafka_mock_push_request_errors(mc, 0 /* Produce */ , 1, (rd_kafka_resp_err_t) b);
			printf("ok\n");
		}
		else if (sscanf(line, "coordinator %255s %d", arg2, &a) == 2)
			printf("%s\n", rd_kafka_mock_coordinator_set(mc, "group", arg2, a) ? "error" : "ok");
		else if (sscanf(line, "leader %255s %d %d", arg2, &a, &b) == 3)
			printf("%s\n", rd_kafka_mock_partition_set_leader(mc, arg2, a, b) ? "error" : "ok");
		else if (sscanf(line, "down %d", &a) == 1)
			printf("%s\n", rd_kafka_mock_broker_set_down(mc, a) ? "error" : "ok");
		else if (sscanf(line, "up %d", &a) == 1)
			printf("%s\n", rd_kafka_mock_broker_set_up(mc, a) ? "error" : "ok");
		else if (strncmp(line, "quit", 4) == 0)
			break;
		else
			printf("error unknown command\n");
	}
	if (producer != NULL)
		rd_kafka_destroy(producer);
	rd_kafka_mock_cluster_destroy(mc);
	rd_kafka_destroy(owner);
	return 0;
}
