/*-------------------------------------------------------------------------
 * nats_tool.c
 *	  A small cnats client for the NATS TAP tests (test/t/delivery/012_nats.pl,
 *	  test/t/inbox/015_nats_source.pl),
 *	  since the nats CLI is not installed.
 *
 *	nats_tool URL add-stream NAME SUBJECT... [-w MS]
 *		create a file stream; its duplicate window is 10 min, or MS
 *	nats_tool URL count NAME                   print its message count
 *	nats_tool URL delete-stream NAME           delete it
 *	nats_tool URL stream NAME                  its settings as JSON:
 *		{"subjects":[..],"retention":"limits"|..,"storage":"file"|"memory",
 *		 "description":..}
 *	nats_tool URL dump NAME                    one JSON line per message:
 *		{"seq":..,"subject":..,"data":..,"headers":{name:value},
 *		 "time_us": when the stream stored it (microseconds since the epoch)}
 *	nats_tool URL publish SUBJECT DATA [-n N] [NAME:VALUE]...
 *		JetStream publishes with headers, N times (default 1), "{i}" in
 *		DATA and the values replaced by 1..N; one JSON line per publish:
 *		{"seq":..,"duplicate":true|false}
 *	nats_tool URL consumer STREAM DURABLE      the consumer's state:
 *		{"delivered":..,"ack_floor":..,"num_ack_pending":..,
 *		 "num_redelivered":..,"num_pending":..,"max_ack_pending":..,
 *		 "ack_wait_ms":..}
 *	nats_tool URL ack-wait STREAM DURABLE MS   set the durable's AckWait to
 *		MS, the rest of its configuration as it is (the server updates it in
 *		place)
 *
 * Exit status 0 on success, 1 with the reason on stderr.
 *-------------------------------------------------------------------------
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <nats/nats.h>

static int
fail(const char *what, natsStatus s, jsErrCode jerr)
{
	fprintf(stderr, "nats_tool: %s: %s (jerr %d) %s\n", what, natsStatus_GetText(s), (int) jerr,
			nats_GetLastError(NULL) ? nats_GetLastError(NULL) : "");
	return 1;
}

static int
add_stream(jsCtx *js, const char *name, char **subjects, int n)
{
	jsStreamConfig cfg;
	jsStreamInfo *si = NULL;
	jsErrCode	jerr = 0;
	natsStatus	s;

	jsStreamConfig_Init(&cfg);
	cfg.Name = name;
	cfg.Subjects = (const char **) subjects;
	cfg.SubjectsLen = n;
	cfg.Storage = js_FileStorage;
	cfg.Duplicates = (int64_t) 600 * 1000000000;	/* 10 min dedup window */
	if (n >= 3 && strcmp(subjects[n - 2], "-w") == 0)
	{
		cfg.Duplicates = (int64_t) atol(subjects[n - 1]) * 1000000;
		cfg.SubjectsLen = n - 2;
	}
	if ((s = js_AddStream(&si, js, &cfg, NULL, &jerr)) != NATS_OK)
		return fail("js_AddStream", s, jerr);
	jsStreamInfo_Destroy(si);
	return 0;
}

static int
stream_info(jsCtx *js, const char *name, jsStreamInfo **si)
{
	jsErrCode	jerr = 0;
	natsStatus	s = js_GetStreamInfo(si, js, name, NULL, &jerr);

	return s == NATS_OK ? 0 : fail("js_GetStreamInfo", s, jerr);
}

static int
dump(jsCtx *js, const char *name)
{
	jsStreamInfo *si = NULL;

	if (stream_info(js, name, &si) != 0)
		return 1;
	for (uint64_t seq = si->State.FirstSeq; seq > 0 && seq <= si->State.LastSeq; seq++)
	{
		natsMsg    *m = NULL;
		jsErrCode	jerr = 0;
		natsStatus	s = js_GetMsg(&m, js, name, seq, NULL, &jerr);
		json_t	   *o,
				   *h;
		const char **keys = NULL;
		int			nkeys = 0;
		char	   *line;

		if (s == NATS_NOT_FOUND || jerr == 10037)
			continue;			/* deleted */
		if (s != NATS_OK)
			return fail("js_GetMsg", s, jerr);
		h = json_object();
		if (natsMsgHeader_Keys(m, &keys, &nkeys) == NATS_OK)
		{
			for (int i = 0; i < nkeys; i++)
			{
				const char *v = NULL;

				if (natsMsgHeader_Get(m, keys[i], &v) == NATS_OK)
					json_object_set_new(h, keys[i], json_string(v));
			}
			free((void *) keys);
		}
		o = json_pack("{s:I, s:s, s:s%, s:o, s:I}", "seq", (json_int_t) seq,
					  "subject", natsMsg_GetSubject(m),
					  "data", natsMsg_GetData(m), (size_t) natsMsg_GetDataLength(m),
					  "headers", h,
					  "time_us", (json_int_t) (natsMsg_GetTime(m) / 1000));
		line = json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS);
		printf("%s\n", line);
		free(line);
		json_decref(o);
		natsMsg_Destroy(m);
	}
	jsStreamInfo_Destroy(si);
	return 0;
}

/* subst: text with every "{i}" replaced by i (malloc'd). */
static char *
subst(const char *text, int i)
{
	char		num[16];
	size_t		n = strlen(text) + 1;
	char	   *out;
	char	   *o;

	snprintf(num, sizeof(num), "%d", i);
	for (const char *p = strstr(text, "{i}"); p != NULL; p = strstr(p + 3, "{i}"))
		n += strlen(num);
	if ((out = malloc(n)) == NULL)
		return NULL;
	o = out;
	for (const char *p = text; *p;)
	{
		if (strncmp(p, "{i}", 3) == 0)
		{
			o += sprintf(o, "%s", num);
			p += 3;
		}
		else
			*o++ = *p++;
	}
	*o = '\0';
	return out;
}

static int
publish(jsCtx *js, const char *subject, const char *data, char **args, int nargs)
{
	int			count = 1;

	if (nargs >= 2 && strcmp(args[0], "-n") == 0)
	{
		count = atoi(args[1]);
		args += 2;
		nargs -= 2;
	}
	for (int i = 1; i <= count; i++)
	{
		natsMsg    *m = NULL;
		jsPubAck   *pa = NULL;
		jsErrCode	jerr = 0;
		char	   *body = subst(data, i);
		natsStatus	s = natsMsg_Create(&m, subject, NULL, body, (int) strlen(body));

		for (int a = 0; s == NATS_OK && a < nargs; a++)
		{
			char	   *colon = strchr(args[a], ':');
			char	   *name;
			char	   *value;

			if (colon == NULL)
			{
				fprintf(stderr, "nats_tool: a header is NAME:VALUE, got %s\n", args[a]);
				return 1;
			}
			name = strndup(args[a], colon - args[a]);
			value = subst(colon + 1, i);
			s = natsMsgHeader_Add(m, name, value);
			free(name);
			free(value);
		}
		free(body);
		if (s == NATS_OK)
			s = js_PublishMsg(&pa, js, m, NULL, &jerr);
		natsMsg_Destroy(m);
		if (s != NATS_OK)
			return fail("js_PublishMsg", s, jerr);
		printf("{\"seq\":%llu,\"duplicate\":%s}\n", (unsigned long long) pa->Sequence,
			   pa->Duplicate ? "true" : "false");
		jsPubAck_Destroy(pa);
	}
	return 0;
}

/* add-consumer: a durable pull consumer made by hand, as an operator would */
static int
add_consumer(jsCtx *js, const char *stream, const char *durable, const char *subject,
			 const char *max_ack_pending, const char *ack)
{
	jsConsumerConfig cc;
	jsConsumerInfo *ci = NULL;
	jsErrCode	jerr = 0;
	natsStatus	s;

	jsConsumerConfig_Init(&cc);
	cc.Durable = durable;
	cc.FilterSubject = subject;
	cc.MaxAckPending = atoll(max_ack_pending);
	cc.AckPolicy = strcmp(ack, "none") == 0 ? js_AckNone : js_AckExplicit;
	if ((s = js_AddConsumer(&ci, js, stream, &cc, NULL, &jerr)) != NATS_OK)
		return fail("js_AddConsumer", s, jerr);
	jsConsumerInfo_Destroy(ci);
	printf("ok\n");
	return 0;
}

static int
consumer(jsCtx *js, const char *stream, const char *durable)
{
	jsConsumerInfo *ci = NULL;
	jsErrCode	jerr = 0;
	natsStatus	s = js_GetConsumerInfo(&ci, js, stream, durable, NULL, &jerr);

	if (s != NATS_OK)
		return fail("js_GetConsumerInfo", s, jerr);
	printf("{\"delivered\":%llu,\"ack_floor\":%llu,\"num_ack_pending\":%lld,\"num_redelivered\":%lld,\"num_pending\":%llu,\"max_ack_pending\":%lld,\"ack_wait_ms\":%lld}\n",
		   (unsigned long long) ci->Delivered.Stream, (unsigned long long) ci->AckFloor.Stream,
		   (long long) ci->NumAckPending, (long long) ci->NumRedelivered,
		   (unsigned long long) ci->NumPending, (long long) ci->Config->MaxAckPending,
		   (long long) (ci->Config->AckWait / 1000000));
	jsConsumerInfo_Destroy(ci);
	return 0;
}

/* ack-wait: the durable's AckWait set to ms, its other settings kept */
static int
ack_wait(jsCtx *js, const char *stream, const char *durable, const char *ms)
{
	jsConsumerInfo *ci = NULL;
	jsConsumerInfo *up = NULL;
	jsConsumerConfig cc;
	jsErrCode	jerr = 0;
	natsStatus	s = js_GetConsumerInfo(&ci, js, stream, durable, NULL, &jerr);

	if (s != NATS_OK)
		return fail("js_GetConsumerInfo", s, jerr);
	cc = *ci->Config;
	cc.AckWait = atoll(ms) * 1000000;	/* nanoseconds */
	s = js_UpdateConsumer(&up, js, stream, &cc, NULL, &jerr);
	jsConsumerInfo_Destroy(up);
	jsConsumerInfo_Destroy(ci);
	if (s != NATS_OK)
		return fail("js_UpdateConsumer", s, jerr);
	printf("ok\n");
	return 0;
}

int
main(int argc, char **argv)
{
	natsConnection *nc = NULL;
	jsCtx	   *js = NULL;
	natsStatus	s;
	int			rc = 1;

	if (argc < 4)
	{
		fprintf(stderr, "usage: nats_tool URL add-stream NAME SUBJECT... | count NAME | stream NAME | delete-stream NAME | dump NAME | publish SUBJECT DATA [-n N] [NAME:VALUE]... | consumer STREAM DURABLE | add-consumer STREAM DURABLE SUBJECT MAX_ACK_PENDING explicit|none\n");
		return 2;
	}
	if ((s = natsConnection_ConnectTo(&nc, argv[1])) != NATS_OK)
		return fail("connect", s, 0);
	if ((s = natsConnection_JetStream(&js, nc, NULL)) != NATS_OK)
		rc = fail("jetstream", s, 0);
	else if (strcmp(argv[2], "add-stream") == 0 && argc >= 5)
		rc = add_stream(js, argv[3], argv + 4, argc - 4);
	else if (strcmp(argv[2], "count") == 0)
	{
		jsStreamInfo *si = NULL;

		if ((rc = stream_info(js, argv[3], &si)) == 0)
		{
			printf("%llu\n", (unsigned long long) si->State.Msgs);
			jsStreamInfo_Destroy(si);
		}
	}
	else if (strcmp(argv[2], "delete-stream") == 0)
	{
		jsErrCode	jerr = 0;

		if ((s = js_DeleteStream(js, argv[3], NULL, &jerr)) != NATS_OK)
			rc = fail("js_DeleteStream", s, jerr);
		else
			rc = 0;
	}
	else if (strcmp(argv[2], "stream") == 0)
	{
		jsStreamInfo *si = NULL;

		if ((rc = stream_info(js, argv[3], &si)) == 0)
		{
			json_t	   *subj = json_array();
			json_t	   *o;
			char	   *line;

			for (int i = 0; i < si->Config->SubjectsLen; i++)
				json_array_append_new(subj, json_string(si->Config->Subjects[i]));
			o = json_pack("{s:o, s:s, s:s, s:s?}", "subjects", subj,
						  "retention", si->Config->Retention == js_LimitsPolicy ? "limits" :
						  si->Config->Retention == js_InterestPolicy ? "interest" : "workqueue",
						  "storage", si->Config->Storage == js_FileStorage ? "file" : "memory",
						  "description", si->Config->Description);
			line = json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS);
			printf("%s\n", line);
			free(line);
			json_decref(o);
			jsStreamInfo_Destroy(si);
		}
	}
	else if (strcmp(argv[2], "dump") == 0)
		rc = dump(js, argv[3]);
	else if (strcmp(argv[2], "publish") == 0 && argc >= 5)
		rc = publish(js, argv[3], argv[4], argv + 5, argc - 5);
	else if (strcmp(argv[2], "consumer") == 0 && argc >= 5)
		rc = consumer(js, argv[3], argv[4]);
	else if (strcmp(argv[2], "add-consumer") == 0 && argc >= 8)
		rc = add_consumer(js, argv[3], argv[4], argv[5], argv[6], argv[7]);
	else if (strcmp(argv[2], "ack-wait") == 0 && argc >= 6)
		rc = ack_wait(js, argv[3], argv[4], argv[5]);
	else
		fprintf(stderr, "nats_tool: unknown command %s\n", argv[2]);
	jsCtx_Destroy(js);
	natsConnection_Destroy(nc);
	return rc;
}
