/*-------------------------------------------------------------------------
 * nats_tool.c
 *	  A small cnats client for the NATS TAP tests (test/t/012_nats.pl),
 *	  since the nats CLI is not installed.
 *
 *	nats_tool URL add-stream NAME SUBJECT...   create a file stream
 *	nats_tool URL count NAME                   print its message count
 *	nats_tool URL dump NAME                    one JSON line per message:
 *		{"seq":..,"subject":..,"data":..,"headers":{name:value}}
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
		o = json_pack("{s:I, s:s, s:s%, s:o}", "seq", (json_int_t) seq,
					  "subject", natsMsg_GetSubject(m),
					  "data", natsMsg_GetData(m), (size_t) natsMsg_GetDataLength(m),
					  "headers", h);
		line = json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS);
		printf("%s\n", line);
		free(line);
		json_decref(o);
		natsMsg_Destroy(m);
	}
	jsStreamInfo_Destroy(si);
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
		fprintf(stderr, "usage: nats_tool URL add-stream NAME SUBJECT... | count NAME | dump NAME\n");
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
	else if (strcmp(argv[2], "dump") == 0)
		rc = dump(js, argv[3]);
	else
		fprintf(stderr, "nats_tool: unknown command %s\n", argv[2]);
	jsCtx_Destroy(js);
	natsConnection_Destroy(nc);
	return rc;
}
