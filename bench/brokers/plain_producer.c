/*-------------------------------------------------------------------------
 * plain_producer.c
 *	  The anchor of bench/brokers: the broker library QueueBox uses, with the
 *	  settings QueueBox uses, publishing N messages as fast as one process
 *	  can, with no database at all.
 *
 *	plain_producer kafka BOOTSTRAP TOPIC N KEYS SIZE [LINGER_MS]
 *	plain_producer nats URL SUBJECT N KEYS SIZE
 *	plain_producer rabbitmq URL EXCHANGE ROUTING_KEY N KEYS SIZE [WINDOW]
 *
 * Message i (1..N) has the key "k<i % KEYS>" (as the benchmark's rows), a
 * value of exactly SIZE bytes of JSON, and the headers QueueBox sends for
 * those rows: X-Correlation-Id: c, then message-id (Kafka) or Nats-Msg-Id
 * (NATS), a 36-character id unique to the message.  RabbitMQ has no message
 * key (QueueBox routes by the routing key); the id is the message_id
 * property and X-Correlation-Id is both a header and correlation_id.
 *
 *	kafka: one idempotent producer (enable.idempotence=true, acks=all,
 *	       message.timeout.ms=30000, linger.ms LINGER_MS, default 5), every
 *	       message produced (waiting in rd_kafka_poll when the local queue
 *	       is full), then rd_kafka_flush; delivery reports counted.
 *	nats:  one connection, js_PublishMsgAsync for every message (cnats's
 *	       default MaxPending), then js_PublishAsyncComplete; acks counted by
 *	       a jsPubAckHandler, as QueueBox counts them.
 *	rabbitmq: one connection (librabbitmq, frame_max 131072, no heartbeat),
 *	       channel 1 in confirm mode, basic.publish persistent (delivery
 *	       mode 2), mandatory, content_type application/json, as
 *	       src/common/publish/qb_pub_amqp.c publishes; at most WINDOW (default 500,
 *	       an outbox batch) messages unconfirmed: when the window is full it
 *	       waits for basic.ack / basic.nack (multiple or not), and after each
 *	       publish it reads, without waiting, what the broker has sent, as
 *	       QueueBox does.  A basic.return or basic.nack is an error.
 *
 * It prints one line:
 *	ok N elapsed_s E rows_s R setup_ms S errors X [first error]
 * where the clock runs from before the handle/connection is made until the
 * last acknowledgement (setup_ms is the part spent making it).  Exit status
 * 0 when every message was acknowledged, 1 otherwise.
 *-------------------------------------------------------------------------
 */
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <amqp.h>
#include <amqp_framing.h>
#include <amqp_tcp_socket.h>
#include <librdkafka/rdkafka.h>
#include <nats/nats.h>

static atomic_long acked;
static atomic_long failed;
static char first_error[512];

static double
now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void
die(const char *what, const char *why)
{
	fprintf(stderr, "plain_producer: %s: %s\n", what, why);
	exit(2);
}

static void
note_error(const char *msg)
{
	if (atomic_fetch_add(&failed, 1) == 0)
		snprintf(first_error, sizeof(first_error), "%s", msg);
}

/* value i: {"seq":i,"pad":"xxx..."} padded to exactly size bytes */
static int
make_value(char *buf, int size, long i)
{
	int			n = snprintf(buf, size + 1, "{\"seq\":%ld,\"pad\":\"", i);

	if (n + 2 > size)
		return snprintf(buf, size + 1, "%ld", i);
	memset(buf + n, 'x', size - n - 2);
	memcpy(buf + size - 2, "\"}", 2);
	buf[size] = '\0';
	return size;
}

/* a 36-character id, unique per message and run */
static void
make_id(char *buf, long run, long i)
{
	snprintf(buf, 40, "%08lx-0000-4000-8000-%012lx", run & 0xffffffffL, i & 0xffffffffffffL);
}

/* ---------------------------------------------------------------- kafka */
static void
dr_cb(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
	(void) rk;
	(void) opaque;
	if (m->err == RD_KAFKA_RESP_ERR_NO_ERROR)
		atomic_fetch_add(&acked, 1);
	else
		note_error(rd_kafka_err2str(m->err));
}

static void
kconf(rd_kafka_conf_t *c, const char *name, const char *value)
{
	char		err[512];

	if (rd_kafka_conf_set(c, name, value, err, sizeof(err)) != RD_KAFKA_CONF_OK)
		die(name, err);
}

static double
run_kafka(const char *bootstrap, const char *topic, long n, int keys, int size,
		  const char *linger, double *setup)
{
	rd_kafka_conf_t *c = rd_kafka_conf_new();
	rd_kafka_t *rk;
	char		err[512];
	char	   *val = malloc(size + 64);
	char		key[32],
				id[40];
	long		run = (long) time(NULL);
	double		t0 = now_s();

	kconf(c, "bootstrap.servers", bootstrap);
	kconf(c, "enable.idempotence", "true");
	kconf(c, "acks", "all");
	kconf(c, "message.timeout.ms", "30000");
	kconf(c, "linger.ms", linger);
	rd_kafka_conf_set_dr_msg_cb(c, dr_cb);
	if ((rk = rd_kafka_new(RD_KAFKA_PRODUCER, c, err, sizeof(err))) == NULL)
		die("rd_kafka_new", err);
	*setup = now_s() - t0;

	for (long i = 1; i <= n; i++)
	{
		int			klen = snprintf(key, sizeof(key), "k%ld", i % keys);
		int			vlen = make_value(val, size, i);
		rd_kafka_headers_t *h = rd_kafka_headers_new(2);
		rd_kafka_resp_err_t e;

		make_id(id, run, i);
		rd_kafka_header_add(h, "X-Correlation-Id", -1, "c", 1);
		rd_kafka_header_add(h, "message-id", -1, id, 36);
		for (;;)
		{
			e = rd_kafka_producev(rk,
								  RD_KAFKA_V_TOPIC(topic),
								  RD_KAFKA_V_KEY(key, klen),
								  RD_KAFKA_V_VALUE(val, vlen),
								  RD_KAFKA_V_HEADERS(h),
								  RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
								  RD_KAFKA_V_END);
			if (e != RD_KAFKA_RESP_ERR__QUEUE_FULL)
				break;
			rd_kafka_poll(rk, 10);
		}
		if (e != RD_KAFKA_RESP_ERR_NO_ERROR)
		{
			rd_kafka_headers_destroy(h);	/* not taken on failure */
			note_error(rd_kafka_err2str(e));
		}
		rd_kafka_poll(rk, 0);
	}
	if (rd_kafka_flush(rk, 120000) != RD_KAFKA_RESP_ERR_NO_ERROR)
		note_error("rd_kafka_flush timed out");
	t0 = now_s() - t0;
	rd_kafka_destroy(rk);
	free(val);
	return t0;
}

/* ---------------------------------------------------------------- nats */
static void
ack_cb(jsCtx *js, natsMsg *msg, jsPubAck *pa, jsPubAckErr *pae, void *closure)
{
	char		why[512];

	(void) js;
	(void) pa;
	(void) closure;
	if (pae == NULL)
		atomic_fetch_add(&acked, 1);
	else
	{
		snprintf(why, sizeof(why), "%s (err_code %d) %s", natsStatus_GetText(pae->Err),
				 (int) pae->ErrCode, pae->ErrText ? pae->ErrText : "");
		note_error(why);
	}
	natsMsg_Destroy(msg);
}

static void
nck(natsStatus s, const char *what)
{
	if (s != NATS_OK)
		die(what, natsStatus_GetText(s));
}

static double
run_nats(const char *url, const char *subject, long n, int keys, int size, double *setup)
{
	natsConnection *nc = NULL;
	jsCtx	   *js = NULL;
	jsOptions	jo;
	jsPubOptions po;
	char	   *val = malloc(size + 64);
	char		id[40];
	long		run = (long) time(NULL);
	double		t0 = now_s();

	(void) keys;				/* NATS has no key: the subject is fixed, as the destination's */
	nck(natsConnection_ConnectTo(&nc, url), "connect");
	jsOptions_Init(&jo);
	jo.PublishAsync.AckHandler = ack_cb;
	nck(natsConnection_JetStream(&js, nc, &jo), "JetStream");
	*setup = now_s() - t0;

	jsPubOptions_Init(&po);
	po.MaxWait = 5000;			/* as QueueBox's ack wait */
	for (long i = 1; i <= n; i++)
	{
		natsMsg    *m = NULL;
		int			vlen = make_value(val, size, i);
		natsStatus	s;

		make_id(id, run, i);
		nck(natsMsg_Create(&m, subject, NULL, val, vlen), "natsMsg_Create");
		nck(natsMsgHeader_Set(m, "X-Correlation-Id", "c"), "header");
		nck(natsMsgHeader_Set(m, "Nats-Msg-Id", id), "header");
		if ((s = js_PublishMsgAsync(js, &m, &po)) != NATS_OK)
		{
			note_error(natsStatus_GetText(s));
			natsMsg_Destroy(m);
		}
	}
	{
		jsPubOptions co;

		jsPubOptions_Init(&co);
		co.MaxWait = 120000;
		if (js_PublishAsyncComplete(js, &co) != NATS_OK)
			note_error("js_PublishAsyncComplete timed out");
	}
	t0 = now_s() - t0;
	jsCtx_Destroy(js);
	natsConnection_Destroy(nc);
	free(val);
	return t0;
}

/* ---------------------------------------------------------------- rabbitmq */
typedef struct Confirms
{
	char	   *settled;		/* settled[tag]: 1 once acked or nacked */
	long		n;				/* tags 1..n */
	long		low;			/* every tag below it is settled */
	long		count;			/* how many are settled */
} Confirms;

static void
amqp_check(amqp_rpc_reply_t r, const char *what)
{
	char		why[512];

	if (r.reply_type == AMQP_RESPONSE_NORMAL)
		return;
	if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION)
		die(what, amqp_error_string2(r.library_error));
	if (r.reply_type == AMQP_RESPONSE_SERVER_EXCEPTION && r.reply.id == AMQP_CHANNEL_CLOSE_METHOD)
	{
		amqp_channel_close_t *m = r.reply.decoded;

		snprintf(why, sizeof(why), "channel closed: %u %.*s", m->reply_code,
				 (int) m->reply_text.len, (char *) m->reply_text.bytes);
		die(what, why);
	}
	if (r.reply_type == AMQP_RESPONSE_SERVER_EXCEPTION && r.reply.id == AMQP_CONNECTION_CLOSE_METHOD)
	{
		amqp_connection_close_t *m = r.reply.decoded;

		snprintf(why, sizeof(why), "connection closed: %u %.*s", m->reply_code,
				 (int) m->reply_text.len, (char *) m->reply_text.bytes);
		die(what, why);
	}
	die(what, "no normal reply");
}

static void
settle_one(Confirms *c, long tag, bool ok)
{
	if (tag < 1 || tag > c->n || c->settled[tag])
		return;
	c->settled[tag] = 1;
	c->count++;
	if (ok)
		atomic_fetch_add(&acked, 1);
	else
		note_error("basic.nack: the broker refused the message");
}

static void
settle(Confirms *c, uint64_t tag, bool multiple, bool ok)
{
	if (multiple)
		for (long t = c->low; t <= (long) tag && t <= c->n; t++)
			settle_one(c, t, ok);
	else
		settle_one(c, (long) tag, ok);
	while (c->low <= c->n && c->settled[c->low])
		c->low++;
}

/* one frame from the broker: a confirm, a return, or the end */
static void
amqp_frame(Confirms *c, const amqp_frame_t *f)
{
	char		why[512];

	if (f->frame_type != AMQP_FRAME_METHOD)
		return;					/* a returned message's header and body */
	switch (f->payload.method.id)
	{
		case AMQP_BASIC_ACK_METHOD:
			{
				amqp_basic_ack_t *m = f->payload.method.decoded;

				settle(c, m->delivery_tag, m->multiple != 0, true);
				break;
			}
		case AMQP_BASIC_NACK_METHOD:
			{
				amqp_basic_nack_t *m = f->payload.method.decoded;

				settle(c, m->delivery_tag, m->multiple != 0, false);
				break;
			}
		case AMQP_BASIC_RETURN_METHOD:
			{
				amqp_basic_return_t *m = f->payload.method.decoded;

				snprintf(why, sizeof(why), "basic.return (unroutable): %u %.*s", m->reply_code,
						 (int) m->reply_text.len, (char *) m->reply_text.bytes);
				note_error(why);
				break;
			}
		case AMQP_CHANNEL_CLOSE_METHOD:
		case AMQP_CONNECTION_CLOSE_METHOD:
			{
				amqp_rpc_reply_t r = {AMQP_RESPONSE_SERVER_EXCEPTION, f->payload.method, 0};

				amqp_check(r, "publish");
				break;
			}
		default:
			break;
	}
}

/* amqp_read: handle what has arrived; wait for one frame first when block */
static void
amqp_read(amqp_connection_state_t conn, Confirms *c, bool block)
{
	struct timeval zero = {0, 0};

	for (;;)
	{
		amqp_frame_t f;
		int			rc = amqp_simple_wait_frame_noblock(conn, &f, block ? NULL : &zero);

		if (rc == AMQP_STATUS_TIMEOUT)
			break;
		if (rc != AMQP_STATUS_OK)
			die("reading confirms", amqp_error_string2(rc));
		amqp_frame(c, &f);
		block = false;
	}
	amqp_maybe_release_buffers(conn);
}

static double
run_amqp(const char *url, const char *exchange, const char *rkey, long n, int size,
		 long window, double *setup)
{
	struct amqp_connection_info ci;
	char	   *u = strdup(url);
	amqp_connection_state_t conn;
	amqp_socket_t *sock;
	amqp_basic_properties_t props;
	amqp_table_entry_t hdr;
	Confirms	c = {calloc(n + 1, 1), n, 1, 0};
	char	   *val = malloc(size + 64);
	char		id[40];
	long		run = (long) time(NULL);
	double		t0 = now_s();
	int			rc;

	amqp_default_connection_info(&ci);
	if (u == NULL || c.settled == NULL || amqp_parse_url(u, &ci) != AMQP_STATUS_OK)
		die("url", url);
	if (ci.vhost[0] == '\0')
		ci.vhost = "/";
	conn = amqp_new_connection();
	if ((sock = amqp_tcp_socket_new(conn)) == NULL)
		die("socket", "amqp_tcp_socket_new failed");
	if ((rc = amqp_socket_open(sock, ci.host, ci.port)) != AMQP_STATUS_OK)
		die("connect", amqp_error_string2(rc));
	amqp_check(amqp_login(conn, ci.vhost, 0, 131072, 0, AMQP_SASL_METHOD_PLAIN, ci.user,
						  ci.password), "login");
	amqp_channel_open(conn, 1);
	amqp_check(amqp_get_rpc_reply(conn), "channel.open");
	amqp_confirm_select(conn, 1);
	amqp_check(amqp_get_rpc_reply(conn), "confirm.select");
	*setup = now_s() - t0;

	memset(&props, 0, sizeof(props));
	props._flags = AMQP_BASIC_CONTENT_TYPE_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG |
		AMQP_BASIC_MESSAGE_ID_FLAG | AMQP_BASIC_CORRELATION_ID_FLAG | AMQP_BASIC_HEADERS_FLAG;
	props.content_type = amqp_cstring_bytes("application/json");
	props.delivery_mode = AMQP_DELIVERY_PERSISTENT;
	props.correlation_id = amqp_cstring_bytes("c");
	hdr.key = amqp_cstring_bytes("X-Correlation-Id");
	hdr.value.kind = AMQP_FIELD_KIND_UTF8;
	hdr.value.value.bytes = amqp_cstring_bytes("c");
	props.headers.num_entries = 1;
	props.headers.entries = &hdr;

	for (long i = 1; i <= n; i++)
	{
		amqp_bytes_t body;

		while (i - 1 - c.count >= window)
			amqp_read(conn, &c, true);
		body.len = make_value(val, size, i);
		body.bytes = val;
		make_id(id, run, i);
		props.message_id = amqp_cstring_bytes(id);
		if ((rc = amqp_basic_publish(conn, 1, amqp_cstring_bytes(exchange), amqp_cstring_bytes(rkey),
									 1, 0, &props, body)) != AMQP_STATUS_OK)
			die("basic.publish", amqp_error_string2(rc));
		amqp_read(conn, &c, false);
	}
	while (c.count < n)
		amqp_read(conn, &c, true);
	t0 = now_s() - t0;
	amqp_channel_close(conn, 1, AMQP_REPLY_SUCCESS);
	amqp_connection_close(conn, AMQP_REPLY_SUCCESS);
	amqp_destroy_connection(conn);
	free(c.settled);
	free(val);
	free(u);
	return t0;
}

int
main(int argc, char **argv)
{
	long		n;
	int			keys,
				size;
	long		window;
	double		elapsed,
				setup = 0;

	bool		rabbit = argc > 1 && strcmp(argv[1], "rabbitmq") == 0;
	int			a = rabbit ? 1 : 0;	/* rabbitmq has one argument more */

	if (argc < 7 + a || (strcmp(argv[1], "kafka") != 0 && strcmp(argv[1], "nats") != 0 && !rabbit))
		die("usage", "plain_producer kafka BOOTSTRAP TOPIC N KEYS SIZE [LINGER_MS] | nats URL SUBJECT N KEYS SIZE | rabbitmq URL EXCHANGE ROUTING_KEY N KEYS SIZE [WINDOW]");
	n = atol(argv[4 + a]);
	keys = atoi(argv[5 + a]);
	size = atoi(argv[6 + a]);
	window = rabbit && argc > 8 ? atol(argv[8]) : 500;
	if (n < 1 || keys < 1 || size < 16 || size > 1000000 || window < 1)
		die("usage", "N >= 1, KEYS >= 1, 16 <= SIZE <= 1000000, WINDOW >= 1");

	if (rabbit)
		elapsed = run_amqp(argv[2], argv[3], argv[4], n, size, window, &setup);
	else if (argv[1][0] == 'k')
		elapsed = run_kafka(argv[2], argv[3], n, keys, size, argc > 7 ? argv[7] : "5", &setup);
	else
		elapsed = run_nats(argv[2], argv[3], n, keys, size, &setup);

	printf("ok %ld elapsed_s %.3f rows_s %.0f setup_ms %.1f errors %ld%s%s\n",
		   (long) atomic_load(&acked), elapsed, atomic_load(&acked) / elapsed, setup * 1000,
		   (long) atomic_load(&failed), atomic_load(&failed) ? " first: " : "", first_error);
	return atomic_load(&acked) == n && atomic_load(&failed) == 0 ? 0 : 1;
}
