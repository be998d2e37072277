/*-------------------------------------------------------------------------
 * amqp_tool.c
 *	  A small AMQP 0-9-1 client for the TAP tests (librabbitmq-c): declare
 *	  exchanges, queues and bindings, count and fetch messages.  Perl has no
 *	  AMQP library on these machines, and rabbitmqadmin needs the management
 *	  plugin, which the tests do not load.
 *
 *	amqp_tool URL COMMAND [ARGS] [COMMAND [ARGS] ...]
 *
 *	  ping						connect and log in, nothing else
 *	  exchange NAME TYPE		declare a durable exchange (direct, topic, fanout)
 *	  exchange-delete NAME
 *	  queue NAME				declare a durable queue
 *	  queue-reject NAME MAXLEN	a durable queue holding at most MAXLEN messages
 *								that refuses more (x-overflow reject-publish:
 *								publishers get basic.nack)
 *	  queue-delete NAME
 *	  bind QUEUE EXCHANGE KEY
 *	  unbind QUEUE EXCHANGE KEY
 *	  purge QUEUE
 *	  count QUEUE				print the number of ready messages
 *	  get QUEUE					take every message (basic.get + ack), one JSON
 *								line each: exchange, routing_key, redelivered,
 *								message_id, correlation_id, content_type,
 *								delivery_mode, headers, body
 *	  publish QUEUE BODY MESSAGE_ID TYPE HEADERS_JSON
 *								a persistent message to QUEUE (default exchange),
 *								returning once the broker confirms it
 *	  consume QUEUE STOPFILE	a consumer (TAP 061's record of a broker): each
 *								message a JSON line as it arrives (t_us, the
 *								wall clock; redelivered; message_id;
 *								routing_key; body), flushed before its ack;
 *								returns once STOPFILE exists and nothing came
 *								for a second; a lost connection exits 1
 *
 * Commands run in order on one connection; the first failure prints the
 * broker's reason on stderr and exits 1.
 *-------------------------------------------------------------------------
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <amqp.h>
#include <amqp_framing.h>
#include <amqp_tcp_socket.h>
#include <jansson.h>
#include <sys/time.h>
#include <unistd.h>

static amqp_connection_state_t conn;
static int	confirming;			/* channel 1 is in confirm mode */

static void
die_reply(amqp_rpc_reply_t r, const char *what)
{
	switch (r.reply_type)
	{
		case AMQP_RESPONSE_NORMAL:
			return;
		case AMQP_RESPONSE_NONE:
			fprintf(stderr, "amqp_tool: %s: no reply\n", what);
			break;
		case AMQP_RESPONSE_LIBRARY_EXCEPTION:
			fprintf(stderr, "amqp_tool: %s: %s\n", what, amqp_error_string2(r.library_error));
			break;
		case AMQP_RESPONSE_SERVER_EXCEPTION:
			if (r.reply.id == AMQP_CONNECTION_CLOSE_METHOD || r.reply.id == AMQP_CHANNEL_CLOSE_METHOD)
			{
				amqp_bytes_t text;
				unsigned	code;

				if (r.reply.id == AMQP_CONNECTION_CLOSE_METHOD)
				{
					amqp_connection_close_t *m = r.reply.decoded;

					code = m->reply_code;
					text = m->reply_text;
				}
				else
				{
					amqp_channel_close_t *m = r.reply.decoded;

					code = m->reply_code;
					text = m->reply_text;
				}
				fprintf(stderr, "amqp_tool: %s: %u %.*s\n", what, code, (int) text.len,
						(char *) text.bytes);
			}
			else
				fprintf(stderr, "amqp_tool: %s: unexpected method 0x%08X\n", what, r.reply.id);
			break;
	}
	exit(1);
}

static json_t *
field_json(const amqp_field_value_t *v)
{
	switch (v->kind)
	{
		case AMQP_FIELD_KIND_UTF8:
		case AMQP_FIELD_KIND_BYTES:
			return json_stringn(v->value.bytes.bytes, v->value.bytes.len);
		case AMQP_FIELD_KIND_BOOLEAN:
			return json_boolean(v->value.boolean);
		case AMQP_FIELD_KIND_I8:
			return json_integer(v->value.i8);
		case AMQP_FIELD_KIND_U8:
			return json_integer(v->value.u8);
		case AMQP_FIELD_KIND_I16:
			return json_integer(v->value.i16);
		case AMQP_FIELD_KIND_U16:
			return json_integer(v->value.u16);
		case AMQP_FIELD_KIND_I32:
			return json_integer(v->value.i32);
		case AMQP_FIELD_KIND_U32:
			return json_integer(v->value.u32);
		case AMQP_FIELD_KIND_I64:
			return json_integer(v->value.i64);
		case AMQP_FIELD_KIND_U64:
			return json_integer((json_int_t) v->value.u64);
		case AMQP_FIELD_KIND_F32:
			return json_real(v->value.f32);
		case AMQP_FIELD_KIND_F64:
			return json_real(v->value.f64);
		default:
			return json_string("(unsupported field kind)");
	}
}

static json_t *
bytes_json(amqp_bytes_t b)
{
	return json_stringn(b.bytes, b.len);
}

static amqp_queue_declare_ok_t *
queue_declare(const char *name, amqp_table_t args, const char *what)
{
	amqp_queue_declare_ok_t *ok;

	ok = amqp_queue_declare(conn, 1, amqp_cstring_bytes(name), 0, 1, 0, 0, args);
	die_reply(amqp_get_rpc_reply(conn), what);
	return ok;
}

static void
get_all(const char *queue)
{
	for (;;)
	{
		amqp_rpc_reply_t r = amqp_basic_get(conn, 1, amqp_cstring_bytes(queue), 0);
		amqp_basic_get_ok_t *g;
		amqp_message_t msg;
		amqp_basic_properties_t *p;
		json_t	   *o;
		json_t	   *h;
		char	   *line;

		die_reply(r, "basic.get");
		if (r.reply.id == AMQP_BASIC_GET_EMPTY_METHOD)
			return;
		g = r.reply.decoded;
		o = json_object();
		json_object_set_new(o, "exchange", bytes_json(g->exchange));
		json_object_set_new(o, "routing_key", bytes_json(g->routing_key));
		json_object_set_new(o, "redelivered", json_boolean(g->redelivered));
		{
			uint64_t	tag = g->delivery_tag;

			die_reply(amqp_read_message(conn, 1, &msg, 0), "read message");
			p = &msg.properties;
			json_object_set_new(o, "message_id", p->_flags & AMQP_BASIC_MESSAGE_ID_FLAG ?
								bytes_json(p->message_id) : json_null());
			json_object_set_new(o, "correlation_id", p->_flags & AMQP_BASIC_CORRELATION_ID_FLAG ?
								bytes_json(p->correlation_id) : json_null());
			json_object_set_new(o, "content_type", p->_flags & AMQP_BASIC_CONTENT_TYPE_FLAG ?
								bytes_json(p->content_type) : json_null());
			json_object_set_new(o, "delivery_mode", p->_flags & AMQP_BASIC_DELIVERY_MODE_FLAG ?
								json_integer(p->delivery_mode) : json_null());
			h = json_object();
			if (p->_flags & AMQP_BASIC_HEADERS_FLAG)
				for (int i = 0; i < p->headers.num_entries; i++)
				{
					char	   *k = strndup(p->headers.entries[i].key.bytes,
											p->headers.entries[i].key.len);
					json_t	   *v = field_json(&p->headers.entries[i].value);

					json_object_set_new(h, k, v);
					free(k);
				}
			json_object_set_new(o, "headers", h);
			/* each header's field kind ('S': long string), in table order */
			json_object_set_new(o, "header_kinds", json_string(""));
			if (p->_flags & AMQP_BASIC_HEADERS_FLAG)
			{
				char		kinds[1024];
				size_t		n = 0;

				for (int i = 0; i < p->headers.num_entries && n + 2 < sizeof(kinds); i++)
					kinds[n++] = (char) p->headers.entries[i].value.kind;
				kinds[n] = '\0';
				json_object_set_new(o, "header_kinds", json_string(kinds));
			}
			json_object_set_new(o, "body", json_stringn(msg.body.bytes, msg.body.len));
			amqp_destroy_message(&msg);
			if (amqp_basic_ack(conn, 1, tag, 0) != AMQP_STATUS_OK)
			{
				fprintf(stderr, "amqp_tool: basic.ack failed\n");
				exit(1);
			}
		}
		line = json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS);
		printf("%s\n", line);
		free(line);
		json_decref(o);
		amqp_maybe_release_buffers(conn);
	}
}

/*
 * publish: one persistent message to the default exchange, key = queue, in
 * confirm mode: it returns once the broker has taken the message (for a
 * durable queue, written it to disk), so a broker killed right after still
 * has it.
 */
static void
publish(const char *queue, const char *body, const char *mid, const char *type,
		const char *headers)
{
	amqp_basic_properties_t p = {0};
	amqp_table_entry_t e[32];
	json_error_t jerr;
	json_t	   *h = json_loads(headers, 0, &jerr);
	const char *k;
	json_t	   *v;
	int			n = 0;
	amqp_frame_t f;
	struct timeval tv = {30, 0};
	int			rc;

	if (h == NULL || !json_is_object(h))
	{
		fprintf(stderr, "amqp_tool: publish: HEADERS_JSON is not a JSON object\n");
		exit(2);
	}
	json_object_foreach(h, k, v)
	{
		if (n == 32 || !json_is_string(v))
			continue;
		e[n].key = amqp_cstring_bytes(k);
		e[n].value.kind = AMQP_FIELD_KIND_UTF8;
		e[n].value.value.bytes = amqp_cstring_bytes(json_string_value(v));
		n++;
	}
	p._flags = AMQP_BASIC_DELIVERY_MODE_FLAG;
	p.delivery_mode = 2;
	if (*mid)
	{
		p._flags |= AMQP_BASIC_MESSAGE_ID_FLAG;
		p.message_id = amqp_cstring_bytes(mid);
	}
	if (*type)
	{
		p._flags |= AMQP_BASIC_TYPE_FLAG;
		p.type = amqp_cstring_bytes(type);
	}
	if (n > 0)
	{
		p._flags |= AMQP_BASIC_HEADERS_FLAG;
		p.headers.num_entries = n;
		p.headers.entries = e;
	}
	if (!confirming)
	{
		amqp_confirm_select(conn, 1);
		die_reply(amqp_get_rpc_reply(conn), "confirm.select");
		confirming = 1;
	}
	if (amqp_basic_publish(conn, 1, amqp_cstring_bytes(""), amqp_cstring_bytes(queue), 0, 0,
						   &p, amqp_cstring_bytes(body)) != AMQP_STATUS_OK)
	{
		fprintf(stderr, "amqp_tool: basic.publish failed\n");
		exit(1);
	}
	/* one message in flight at a time: the next frame is its basic.ack */
	if ((rc = amqp_simple_wait_frame_noblock(conn, &f, &tv)) != AMQP_STATUS_OK)
	{
		fprintf(stderr, "amqp_tool: publish: no confirm: %s\n", amqp_error_string2(rc));
		exit(1);
	}
	if (f.frame_type != AMQP_FRAME_METHOD || f.payload.method.id != AMQP_BASIC_ACK_METHOD)
	{
		fprintf(stderr, "amqp_tool: publish: the broker did not confirm (method 0x%08X)\n",
				f.frame_type == AMQP_FRAME_METHOD ? f.payload.method.id : 0);
		exit(1);
	}
	json_decref(h);
}

/*
 * consume: the line is written and flushed before the ack, so no acked
 * message is missing from the record; a message whose ack a broker restart
 * lost comes again with redelivered set, and the reader skips it when its
 * message_id is already there.
 */
static void
consume(const char *queue, const char *stopfile)
{
	struct timeval tv = {0, 200000};
	int			idle = 0;

	amqp_basic_qos(conn, 1, 0, 200, 0);
	die_reply(amqp_get_rpc_reply(conn), "basic.qos");
	amqp_basic_consume(conn, 1, amqp_cstring_bytes(queue), amqp_empty_bytes, 0, 0, 0,
					   amqp_empty_table);
	die_reply(amqp_get_rpc_reply(conn), "basic.consume");
	for (;;)
	{
		amqp_envelope_t env;
		amqp_rpc_reply_t r;
		struct timeval now;
		json_t	   *o;
		char	   *line;

		amqp_maybe_release_buffers(conn);
		r = amqp_consume_message(conn, &env, &tv, 0);
		if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION &&
			r.library_error == AMQP_STATUS_TIMEOUT)
		{
			/* five quiet 200 ms waits after the stop file: a second */
			if (access(stopfile, F_OK) == 0 && ++idle >= 5)
				return;
			continue;
		}
		if (r.reply_type != AMQP_RESPONSE_NORMAL)
		{
			fprintf(stderr, "amqp_tool: consume: the connection was lost (%s)\n",
					r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION ?
					amqp_error_string2(r.library_error) : "the broker closed it");
			exit(1);
		}
		idle = 0;
		gettimeofday(&now, NULL);
		o = json_object();
		json_object_set_new(o, "t_us", json_integer((json_int_t) now.tv_sec * 1000000 + now.tv_usec));
		json_object_set_new(o, "redelivered", json_boolean(env.redelivered));
		json_object_set_new(o, "routing_key", bytes_json(env.routing_key));
		json_object_set_new(o, "message_id",
							env.message.properties._flags & AMQP_BASIC_MESSAGE_ID_FLAG ?
							bytes_json(env.message.properties.message_id) : json_null());
		json_object_set_new(o, "body", bytes_json(env.message.body));
		line = json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS);
		printf("%s\n", line);
		fflush(stdout);
		free(line);
		json_decref(o);
		if (amqp_basic_ack(conn, 1, env.delivery_tag, 0) != AMQP_STATUS_OK)
		{
			fprintf(stderr, "amqp_tool: consume: basic.ack failed: the connection was lost\n");
			exit(1);
		}
		amqp_destroy_envelope(&env);
	}
}

static void
usage(void)
{
	fprintf(stderr,
			"usage: amqp_tool URL COMMAND [ARGS] ...\n"
			"  ping | exchange NAME TYPE | exchange-delete NAME | queue NAME |\n"
			"  queue-reject NAME MAXLEN | queue-delete NAME | bind QUEUE EXCHANGE KEY |\n"
			"  unbind QUEUE EXCHANGE KEY | purge QUEUE | count QUEUE | get QUEUE |\n"
			"  publish QUEUE BODY MESSAGE_ID TYPE HEADERS_JSON (exchange \"\", key QUEUE;\n"
			"  an empty MESSAGE_ID or TYPE: not set; HEADERS_JSON an object of strings) |\n"
			"  consume QUEUE STOPFILE\n");
	exit(2);
}

static void
need(int argc, int i, int n)
{
	if (i + n >= argc)
		usage();
}

int
main(int argc, char **argv)
{
	struct amqp_connection_info ci;
	amqp_socket_t *sock;
	char	   *url;
	struct timeval tv = {10, 0};
	int			rc;

	if (argc < 3)
		usage();
	url = strdup(argv[1]);
	amqp_default_connection_info(&ci);
	if (amqp_parse_url(url, &ci) != AMQP_STATUS_OK)
	{
		fprintf(stderr, "amqp_tool: bad url\n");
		return 2;
	}
	if (ci.vhost[0] == '\0')
		ci.vhost = "/";
	conn = amqp_new_connection();
	sock = amqp_tcp_socket_new(conn);
	if ((rc = amqp_socket_open_noblock(sock, ci.host, ci.port, &tv)) != AMQP_STATUS_OK)
	{
		fprintf(stderr, "amqp_tool: cannot connect to %s:%d: %s\n", ci.host, ci.port,
				amqp_error_string2(rc));
		return 1;
	}
	amqp_set_rpc_timeout(conn, &tv);
	die_reply(amqp_login(conn, ci.vhost, 0, 131072, 0, AMQP_SASL_METHOD_PLAIN, ci.user,
						 ci.password), "login");
	amqp_channel_open(conn, 1);
	die_reply(amqp_get_rpc_reply(conn), "channel.open");

	for (int i = 2; i < argc;)
	{
		const char *cmd = argv[i];

		if (strcmp(cmd, "ping") == 0)
			i += 1;
		else if (strcmp(cmd, "exchange") == 0)
		{
			need(argc, i, 2);
			amqp_exchange_declare(conn, 1, amqp_cstring_bytes(argv[i + 1]),
								  amqp_cstring_bytes(argv[i + 2]), 0, 1, 0, 0, amqp_empty_table);
			die_reply(amqp_get_rpc_reply(conn), "exchange.declare");
			i += 3;
		}
		else if (strcmp(cmd, "exchange-delete") == 0)
		{
			need(argc, i, 1);
			amqp_exchange_delete(conn, 1, amqp_cstring_bytes(argv[i + 1]), 0);
			die_reply(amqp_get_rpc_reply(conn), "exchange.delete");
			i += 2;
		}
		else if (strcmp(cmd, "queue") == 0)
		{
			need(argc, i, 1);
			queue_declare(argv[i + 1], amqp_empty_table, "queue.declare");
			i += 2;
		}
		else if (strcmp(cmd, "queue-reject") == 0)
		{
			amqp_table_entry_t e[2];
			amqp_table_t args;

			need(argc, i, 2);
			e[0].key = amqp_cstring_bytes("x-max-length");
			e[0].value.kind = AMQP_FIELD_KIND_I64;
			e[0].value.value.i64 = atol(argv[i + 2]);
			e[1].key = amqp_cstring_bytes("x-overflow");
			e[1].value.kind = AMQP_FIELD_KIND_UTF8;
			e[1].value.value.bytes = amqp_cstring_bytes("reject-publish");
			args.num_entries = 2;
			args.entries = e;
			queue_declare(argv[i + 1], args, "queue.declare");
			i += 3;
		}
		else if (strcmp(cmd, "queue-delete") == 0)
		{
			need(argc, i, 1);
			amqp_queue_delete(conn, 1, amqp_cstring_bytes(argv[i + 1]), 0, 0);
			die_reply(amqp_get_rpc_reply(conn), "queue.delete");
			i += 2;
		}
		else if (strcmp(cmd, "bind") == 0 || strcmp(cmd, "unbind") == 0)
		{
			need(argc, i, 3);
			if (cmd[0] == 'b')
				amqp_queue_bind(conn, 1, amqp_cstring_bytes(argv[i + 1]), amqp_cstring_bytes(argv[i + 2]),
								amqp_cstring_bytes(argv[i + 3]), amqp_empty_table);
			else
				amqp_queue_unbind(conn, 1, amqp_cstring_bytes(argv[i + 1]), amqp_cstring_bytes(argv[i + 2]),
								  amqp_cstring_bytes(argv[i + 3]), amqp_empty_table);
			die_reply(amqp_get_rpc_reply(conn), cmd);
			i += 4;
		}
		else if (strcmp(cmd, "purge") == 0)
		{
			need(argc, i, 1);
			amqp_queue_purge(conn, 1, amqp_cstring_bytes(argv[i + 1]));
			die_reply(amqp_get_rpc_reply(conn), "queue.purge");
			i += 2;
		}
		else if (strcmp(cmd, "count") == 0)
		{
			amqp_queue_declare_ok_t *ok;

			need(argc, i, 1);
			ok = amqp_queue_declare(conn, 1, amqp_cstring_bytes(argv[i + 1]), 1, 0, 0, 0,
									amqp_empty_table);
			die_reply(amqp_get_rpc_reply(conn), "queue.declare (passive)");
			printf("%u\n", ok->message_count);
			i += 2;
		}
		else if (strcmp(cmd, "publish") == 0)
		{
			need(argc, i, 5);
			publish(argv[i + 1], argv[i + 2], argv[i + 3], argv[i + 4], argv[i + 5]);
			i += 6;
		}
		else if (strcmp(cmd, "get") == 0)
		{
			need(argc, i, 1);
			get_all(argv[i + 1]);
			i += 2;
		}
		else if (strcmp(cmd, "consume") == 0)
		{
			need(argc, i, 2);
			consume(argv[i + 1], argv[i + 2]);
			i += 3;
		}
		else
			usage();
		amqp_maybe_release_buffers(conn);
	}
	fflush(stdout);
	amqp_channel_close(conn, 1, AMQP_REPLY_SUCCESS);
	amqp_connection_close(conn, AMQP_REPLY_SUCCESS);
	amqp_destroy_connection(conn);
	free(url);
	return 0;
}
