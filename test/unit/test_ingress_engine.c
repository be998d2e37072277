/*-------------------------------------------------------------------------
 * test_ingress_engine.c
 *	  The HTTP ingress engine (qb_ingress_run) against the fake store of
 *	  fake_store.h and the fake host of test_host.h, served over real
 *	  loopback HTTP: the engine runs in a second thread (its host's wait
 *	  polls the listener's fd), the test's thread is the libcurl client and
 *	  makes every assertion.
 *
 * The fake store (fake_store.h) keeps received rows in memory:
 * inbox_insert gives each new (source, idempotency key) the next id and a
 * duplicate 0, and can fail its next calls (-1, nothing stored); this
 * test's query_text answers readiness, the gauges and the admin queries
 * with fixed text and records what it was asked.  So these tests pin down what the ingress answers and what it asks
 * of any store: the id it was given in the 202, a duplicate's 200, a 503
 * that stored nothing, the store timeout, the refusals that make no store
 * call, the health routes, /metrics, the admin token, and a reload that
 * moves the listener.  The SQL behind the same calls is tested by
 * pg_regress.
 *
 * Threads: the fake's state is shared under the store's mutex; the engine's stats
 * are read after the engine thread was joined.
 *-------------------------------------------------------------------------
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <curl/curl.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "qb_admin_gate.h"
#include "qb_ingress.h"
#include "fake_store.h"
#include "test_host.h"

#define ADMIN_TOKEN "0123456789abcdef0123"
#define GH_SECRET "gh-s3cret"

/* ---- the fake store (fake_store.h), its queries, the engine's thread -- */

typedef struct Fake
{
	FakeStore	fs;				/* first: the store's ctx is the Fake; fs.lock guards all */
	bool		ready_fails;
	int			nqueries[QB_NQUERIES];
	char		last_param[64]; /* the last query's first parameter */
	int			loaded_port;	/* the http port of the last config_loaded */
	bool		stop;
	TestHost	th;
	QbMetrics	metrics;
	QbIngressStats stats;
	bool		bare;			/* run the engine with metrics and stats NULL */
	int			rc;
	pthread_t	thread;
} Fake;

static int
fake_query(void *ctx, QbQuery query, const char *const *params, long timeout_ms,
		   char **out, char *err, size_t errlen)
{
	Fake	   *f = ctx;
	int			rc = 0;

	pthread_mutex_lock(&f->fs.lock);
	f->nqueries[query]++;
	/* the dead list's limit is its eighth parameter */
	snprintf(f->last_param, sizeof(f->last_param), "%s",
			 query == QB_Q_DEAD_OUTBOX ? (params[7] ? params[7] : "") :
			 params && params[0] ? params[0] : "");
	*out = NULL;
	switch (query)
	{
		case QB_Q_READY:
			if (f->ready_fails)
			{
				snprintf(err, errlen, "the fake's database is down");
				rc = -1;
			}
			else
				*out = strdup("1");
			break;
		case QB_Q_GAUGES:
			*out = strdup("{\"outbox_pending\": 3, \"outbox_processing\": 1, \"outbox_oldest\": 0,"
						  " \"inbox_pending\": 2, \"inbox_processing\": 0, \"inbox_oldest\": 0}");
			break;
		case QB_Q_DEAD_OUTBOX:
			*out = strdup("{\"rows\": [{\"id\": 7, \"topic\": \"fake.dead\"}], \"next_after\": 7}");
			break;
		default:
			*out = strdup("{}");
			break;
	}
	pthread_mutex_unlock(&f->fs.lock);
	return rc;
}

/* ---- the engine in its thread ------------------------------------------ */

static bool
fake_done(void *arg)
{
	return __atomic_load_n(&((Fake *) arg)->stop, __ATOMIC_SEQ_CST);
}

static void
fake_loaded(void *arg, const QbConfig *cfg)
{
	Fake	   *f = arg;

	pthread_mutex_lock(&f->fs.lock);
	f->loaded_port = cfg ? cfg->http.port : 0;
	pthread_mutex_unlock(&f->fs.lock);
}

static void *
engine_main(void *arg)
{
	Fake	   *f = arg;
	QbStore		store = fake_store_ops(&f->fs);
	char		err[256] = "";

	store.query_text = fake_query;
	f->rc = qb_ingress_run(&f->th.host, &store, f->bare ? NULL : &f->metrics,
						   f->bare ? NULL : &f->stats, err, sizeof(err));
	return NULL;
}

/* free_port: a port nothing listens on now (bound, read, closed). */
static int
free_port(void)
{
	struct sockaddr_in a = {.sin_family = AF_INET};
	socklen_t	len = sizeof(a);
	int			s = socket(AF_INET, SOCK_STREAM, 0);
	int			port;

	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	assert_true(s >= 0);
	assert_int_equal(bind(s, (struct sockaddr *) &a, sizeof(a)), 0);
	assert_int_equal(getsockname(s, (struct sockaddr *) &a, &len), 0);
	port = ntohs(a.sin_port);
	close(s);
	return port;
}

static void
set_config(Fake *f, int port, bool admin)
{
	pthread_mutex_lock(&f->fs.lock);
	snprintf(f->fs.config, sizeof(f->fs.config),
			 "http: { listen: \"127.0.0.1:%d\", storeTimeoutMs: 1234 }\n"
			 "%s"
			 "sources:\n"
			 "  hook: { type: http, path: /hook, idempotencyKeyHeader: Idempotency-Key,\n"
			 "          eventTypePath: $.type, topic: \"hook.{{ eventType }}\" }\n"
			 "  gh: { type: http, path: /gh, idempotencyKeyPath: $.id, topic: gh,\n"
			 "        auth: { type: github, secret: \"" GH_SECRET "\" } }\n",
			 port, admin ? "admin: { token: \"" ADMIN_TOKEN "\" }\n" : "");
	pthread_mutex_unlock(&f->fs.lock);
}

/* ---- the client -------------------------------------------------------- */

typedef struct Answer
{
	long		status;			/* 0: no answer (curl failed) */
	char		body[8192];
	size_t		len;
} Answer;

static size_t
answer_write(char *data, size_t size, size_t n, void *arg)
{
	Answer	   *a = arg;
	size_t		len = size * n;
	size_t		room = sizeof(a->body) - 1 - a->len;

	memcpy(a->body + a->len, data, len < room ? len : room);
	a->len += len < room ? len : room;
	a->body[a->len] = '\0';
	return len;
}

/* easy_new: a handle for one request to url, its answer into a. */
static CURL *
easy_new(const char *url, struct curl_slist *headers, Answer *a)
{
	CURL	   *c = curl_easy_init();

	memset(a, 0, sizeof(*a));
	curl_easy_setopt(c, CURLOPT_URL, url);
	curl_easy_setopt(c, CURLOPT_NOPROXY, "*");
	curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 5000L);
	curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
	curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, answer_write);
	curl_easy_setopt(c, CURLOPT_WRITEDATA, a);
	return c;
}

/* http: one request; headers NULL-terminated, body NULL for a GET. */
static Answer *
http(int port, const char *method, const char *path, const char *const *headers,
	 const char *body)
{
	static Answer a;
	char		url[256];
	struct curl_slist *list = NULL;
	CURL	   *c;

	snprintf(url, sizeof(url), "http://127.0.0.1:%d%s", port, path);
	for (int i = 0; headers && headers[i]; i++)
		list = curl_slist_append(list, headers[i]);
	list = curl_slist_append(list, "Expect:");
	c = easy_new(url, list, &a);
	curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
	if (body != NULL)
		curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
	if (curl_easy_perform(c) == CURLE_OK)
		curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &a.status);
	curl_slist_free_all(list);
	curl_easy_cleanup(c);
	return &a;
}

static Answer *
get(int port, const char *path)
{
	return http(port, "GET", path, NULL, NULL);
}

/* wait_listening: /healthz answers on port within 5 s. */
static bool
wait_listening(int port)
{
	for (int i = 0; i < 250; i++)
	{
		if (get(port, "/healthz")->status == 200)
			return true;
		usleep(20000);
	}
	return false;
}

static int
port_of(Fake *f)
{
	int			port;

	pthread_mutex_lock(&f->fs.lock);
	port = f->loaded_port;
	pthread_mutex_unlock(&f->fs.lock);
	return port;
}

/* start: the engine on a free port, its admin routes on or off. */
static Fake *
start(bool admin, bool bare)
{
	Fake	   *f = calloc(1, sizeof(Fake));
	int			port = free_port();

	fake_store_init(&f->fs, "");
	f->fs.next_in_id = 41;
	f->bare = bare;
	qb_metrics_init(&f->metrics);
	set_config(f, port, admin);
	test_host_init(&f->th, fake_done, f, 20000, 20);
	f->th.loaded = fake_loaded;
	f->th.quiet = true;
	f->th.host.routes = &qb_admin_routes;	/* as both hosts serve them */
	assert_int_equal(pthread_create(&f->thread, NULL, engine_main, f), 0);
	assert_true(wait_listening(port));
	assert_int_equal(port_of(f), port);
	return f;
}

/* stop: end the engine; its stats and the fake may be read after. */
static void
stop(Fake *f)
{
	__atomic_store_n(&f->stop, true, __ATOMIC_SEQ_CST);
	assert_int_equal(pthread_join(f->thread, NULL), 0);
	assert_int_equal(f->rc, 0);
	assert_false(f->th.timed_out);
}

static void
fake_free(Fake *f)
{
	fake_store_destroy(&f->fs);
	free(f);
}

/* github_sig: the X-Hub-Signature-256 header of body under secret. */
static void
github_sig(const char *secret, const char *body, char *out, size_t outlen)
{
	unsigned char mac[EVP_MAX_MD_SIZE];
	unsigned int n = 0;
	size_t		used;

	HMAC(EVP_sha256(), secret, (int) strlen(secret), (const unsigned char *) body,
		 strlen(body), mac, &n);
	used = (size_t) snprintf(out, outlen, "X-Hub-Signature-256: sha256=");
	for (unsigned int i = 0; i < n && used + 3 <= outlen; i++)
		used += (size_t) snprintf(out + used, outlen - used, "%02x", mac[i]);
}

/* ---- the tests --------------------------------------------------------- */

/*
 * A webhook is answered 202 with the id the store gave it, after one store
 * call with http.storeTimeoutMs; the same key again 200 duplicate.  A
 * missing idempotency key is 422 and a bad signature 401, neither with a
 * store call; a good signature is stored.  /metrics counts it all.
 */
static void
test_webhooks(void **state)
{
	Fake	   *f = start(false, false);
	int			port = port_of(f);
	const char *hook_k1[] = {"Idempotency-Key: k1", "Content-Type: application/json",
	"X-Tenant: acme", NULL};
	const char *gh_body = "{\"id\": \"delivery-9\"}";
	char		sig[128];
	const char *gh_good[] = {sig, NULL};
	const char *gh_bad[] = {"X-Hub-Signature-256: sha256=00ff", NULL};
	Answer	   *a;

	a = http(port, "POST", "/inbox/hook", hook_k1, "{\"type\": \"order.paid\", \"n\": 1}");
	assert_int_equal(a->status, 202);
	assert_non_null(strstr(a->body, "\"status\":\"accepted\""));
	assert_non_null(strstr(a->body, "\"id\":41"));
	assert_non_null(strstr(a->body, "\"idempotencyKey\":\"k1\""));

	a = http(port, "POST", "/inbox/hook", hook_k1, "{\"type\": \"order.paid\", \"n\": 2}");
	assert_int_equal(a->status, 200);
	assert_non_null(strstr(a->body, "\"status\":\"duplicate\""));
	assert_null(strstr(a->body, "\"id\""));

	a = http(port, "POST", "/inbox/hook", NULL, "{\"type\": \"order.paid\"}");
	assert_int_equal(a->status, 422);
	assert_non_null(strstr(a->body, "the Idempotency-Key header is missing"));

	a = http(port, "POST", "/inbox/gh", gh_bad, gh_body);
	assert_int_equal(a->status, 401);
	assert_non_null(strstr(a->body, "authentication failed"));

	github_sig(GH_SECRET, gh_body, sig, sizeof(sig));
	a = http(port, "POST", "/inbox/gh", gh_good, gh_body);
	assert_int_equal(a->status, 202);
	assert_non_null(strstr(a->body, "\"id\":42"));

	a = get(port, "/metrics");
	assert_int_equal(a->status, 200);
	assert_non_null(strstr(a->body, "queuebox_inbox_received_total{source=\"hook\",result=\"accepted\"} 1\n"));
	assert_non_null(strstr(a->body, "queuebox_inbox_received_total{source=\"hook\",result=\"duplicate\"} 1\n"));
	assert_non_null(strstr(a->body, "queuebox_inbox_received_total{source=\"hook\",result=\"unprocessable\"} 1\n"));
	assert_non_null(strstr(a->body, "queuebox_inbox_received_total{source=\"gh\",result=\"unauthorized\"} 1\n"));
	assert_non_null(strstr(a->body, "queuebox_inbox_received_total{source=\"gh\",result=\"accepted\"} 1\n"));
	assert_non_null(strstr(a->body, "queuebox_database_up 1\n"));
	assert_non_null(strstr(a->body, "queuebox_outbox_pending 3\n"));
	assert_non_null(strstr(a->body, "queuebox_inbox_pending 2\n"));
	stop(f);

	/* three store calls: k1, its duplicate, the signed one */
	assert_int_equal(f->fs.ninserts, 3);
	assert_int_equal(f->fs.insert_timeout_ms, 1234);
	assert_int_equal(f->fs.nin, 2);
	assert_string_equal(f->fs.in[0].source, "hook");
	assert_string_equal(f->fs.in[0].key, "k1");
	assert_string_equal(f->fs.in[0].event_type, "order.paid");
	assert_string_equal(f->fs.in[0].payload, "{\"type\": \"order.paid\", \"n\": 1}");
	assert_non_null(strstr(f->fs.in[0].headers, "\"X-Tenant\":\"acme\""));
	assert_string_equal(f->fs.in[1].source, "gh");
	assert_string_equal(f->fs.in[1].key, "delivery-9");
	assert_null(strstr(f->fs.in[1].headers, "X-Hub-Signature-256"));	/* the auth header is not stored */
	assert_int_equal(f->nqueries[QB_Q_GAUGES], 1);
	assert_int_equal(f->stats.accepted, 2);
	assert_int_equal(f->stats.duplicates, 1);
	assert_int_equal(f->stats.refused, 2);
	assert_int_equal(f->stats.unavailable, 0);
	assert_int_equal(f->stats.batches, 3);
	fake_free(f);
}

/* A store that fails answers 503 and stores nothing; the retry is stored. */
static void
test_store_failure_503(void **state)
{
	Fake	   *f = start(false, false);
	int			port = port_of(f);
	const char *hdr[] = {"Idempotency-Key: k2", NULL};
	Answer	   *a;

	pthread_mutex_lock(&f->fs.lock);
	f->fs.fail_inserts = 1;
	pthread_mutex_unlock(&f->fs.lock);
	a = http(port, "POST", "/inbox/hook", hdr, "{\"type\": \"t\"}");
	assert_int_equal(a->status, 503);
	assert_non_null(strstr(a->body, "\"status\":\"unavailable\""));
	assert_non_null(strstr(a->body, "the fake's insert failed"));
	a = http(port, "POST", "/inbox/hook", hdr, "{\"type\": \"t\"}");
	assert_int_equal(a->status, 202);
	assert_non_null(strstr(a->body, "\"id\":41"));
	stop(f);
	assert_int_equal(f->fs.ninserts, 2);
	assert_int_equal(f->fs.nin, 1);
	assert_int_equal(f->stats.unavailable, 1);
	assert_int_equal(f->stats.accepted, 1);
	assert_int_equal(f->stats.refused, 0);
	assert_non_null(strstr(f->th.warned, "could not store 1 received message, answered 503"));
	assert_int_equal(f->metrics.sources[0].count[QB_RX_UNAVAILABLE] +
					 f->metrics.sources[1].count[QB_RX_UNAVAILABLE], 1);
	fake_free(f);
}

/* /healthz asks nothing of the store; /readyz is 200 or 503 as QB_Q_READY goes. */
static void
test_health_and_ready(void **state)
{
	Fake	   *f = start(false, false);
	int			port = port_of(f);
	Answer	   *a;

	assert_int_equal(get(port, "/healthz")->status, 200);
	a = get(port, "/readyz");
	assert_int_equal(a->status, 200);
	assert_non_null(strstr(a->body, "ready"));
	pthread_mutex_lock(&f->fs.lock);
	f->ready_fails = true;
	pthread_mutex_unlock(&f->fs.lock);
	a = get(port, "/readyz");
	assert_int_equal(a->status, 503);
	assert_non_null(strstr(a->body, "database unavailable: the fake's database is down"));
	assert_int_equal(http(port, "POST", "/healthz", NULL, "{}")->status, 405);
	assert_int_equal(get(port, "/nowhere")->status, 404);
	stop(f);
	assert_int_equal(f->nqueries[QB_Q_READY], 2);
	assert_int_equal(f->fs.ninserts, 0);
	assert_int_equal(f->metrics.http_not_found, 1);
	fake_free(f);
}

/*
 * /admin is closed without the token (401, counted) and with a wrong one,
 * open with it: the fake's query_text answers, with ?limit= passed.
 */
static void
test_admin_token(void **state)
{
	Fake	   *f = start(true, false);
	int			port = port_of(f);
	const char *good[] = {"Authorization: Bearer " ADMIN_TOKEN, NULL};
	const char *bad[] = {"Authorization: Bearer not-the-token-at-all", NULL};
	Answer	   *a;

	a = get(port, "/admin/outbox/dead?limit=5");
	assert_int_equal(a->status, 401);
	assert_non_null(strstr(a->body, "admin authentication failed"));
	assert_int_equal(http(port, "GET", "/admin/outbox/dead?limit=5", bad, NULL)->status, 401);
	a = http(port, "GET", "/admin/outbox/dead?limit=5", good, NULL);
	assert_int_equal(a->status, 200);
	assert_string_equal(a->body, "[{\"id\":7,\"topic\":\"fake.dead\"}]");
	stop(f);
	assert_int_equal(f->nqueries[QB_Q_DEAD_OUTBOX], 1);
	assert_string_equal(f->last_param, "5");
	assert_int_equal(f->metrics.admin_unauthorized, 2);
	fake_free(f);
}

/*
 * Webhooks that arrive while a store call runs are stored together, in one
 * call (a batch), and each is answered with its own row's id; a key sent
 * twice in one batch is stored once, the later one answered duplicate.
 */
static void
test_batch_answers_each_its_id(void **state)
{
	enum
	{
		N = 6
	};
	Fake	   *f = start(false, false);
	int			port = port_of(f);
	const char *keys[N] = {"a", "b", "c", "a", "d", "e"};
	CURLM	   *multi = curl_multi_init();
	CURL	   *easy[N];
	struct curl_slist *hdrs[N];
	Answer		answers[N];
	char		url[128];
	int			running = 0;
	int			accepted = 0;
	int			duplicates = 0;

	pthread_mutex_lock(&f->fs.lock);
	f->fs.insert_delay_ms = 100;
	pthread_mutex_unlock(&f->fs.lock);
	snprintf(url, sizeof(url), "http://127.0.0.1:%d/inbox/hook", port);
	for (int i = 0; i < N; i++)
	{
		char		h[64];

		snprintf(h, sizeof(h), "Idempotency-Key: %s", keys[i]);
		hdrs[i] = curl_slist_append(curl_slist_append(NULL, h), "Expect:");
		easy[i] = easy_new(url, hdrs[i], &answers[i]);
		curl_easy_setopt(easy[i], CURLOPT_POSTFIELDS, "{\"type\": \"t\"}");
		curl_multi_add_handle(multi, easy[i]);
	}
	do
	{
		curl_multi_perform(multi, &running);
		if (running)
			curl_multi_poll(multi, NULL, 0, 100, NULL);
	} while (running);
	for (int i = 0; i < N; i++)
	{
		curl_easy_getinfo(easy[i], CURLINFO_RESPONSE_CODE, &answers[i].status);
		curl_multi_remove_handle(multi, easy[i]);
		curl_easy_cleanup(easy[i]);
		curl_slist_free_all(hdrs[i]);
	}
	curl_multi_cleanup(multi);
	stop(f);

	assert_int_equal(f->fs.nin, N - 1);
	for (int i = 0; i < N; i++)
	{
		char		want[96];
		int			row = -1;

		for (int j = 0; j < f->fs.nin; j++)
			if (strcmp(f->fs.in[j].key, keys[i]) == 0)
				row = j;
		assert_true(row >= 0);
		if (answers[i].status == 200)
		{
			duplicates++;
			assert_string_equal(keys[i], "a");
			assert_non_null(strstr(answers[i].body, "\"status\":\"duplicate\""));
			continue;
		}
		assert_int_equal(answers[i].status, 202);
		accepted++;
		snprintf(want, sizeof(want), "\"id\":%lld,", (long long) f->fs.in[row].id);
		assert_non_null(strstr(answers[i].body, want));
	}
	assert_int_equal(accepted, N - 1);
	assert_int_equal(duplicates, 1);
	assert_true(f->fs.max_batch > 1);	/* some arrived during a store call */
	assert_true(f->stats.batches < N);
	assert_int_equal(f->stats.accepted, N - 1);
	assert_int_equal(f->stats.duplicates, 1);
	fake_free(f);
}

/* reconfigure: store text and report a change; back once the engine looked. */
static void
reconfigure(Fake *f, const char *text)
{
	pthread_mutex_lock(&f->fs.lock);
	snprintf(f->fs.config, sizeof(f->fs.config), "%s", text);
	pthread_mutex_unlock(&f->fs.lock);
	test_host_change(&f->th);
	while (test_host_get(f->th.config_changes) > 0)
		usleep(5000);
}

/*
 * A configuration change with a new document moves the listener to its
 * new port (the old one answers no more) and config_loaded hears the new
 * configuration; the admin routes it turns off answer 404.  An invalid
 * document keeps both; a document without http.listen stops the listener.
 */
static void
test_reload_moves_listener(void **state)
{
	Fake	   *f = start(true, false);
	int			old_port = port_of(f);
	int			new_port = free_port();
	const char *good[] = {"Authorization: Bearer " ADMIN_TOKEN, NULL};

	assert_int_equal(http(old_port, "GET", "/admin/outbox/dead", good, NULL)->status, 200);
	set_config(f, new_port, false);
	test_host_change(&f->th);
	assert_true(wait_listening(new_port));
	assert_int_equal(port_of(f), new_port);
	assert_int_equal(get(old_port, "/healthz")->status, 0);
	assert_int_equal(http(new_port, "GET", "/admin/outbox/dead", good, NULL)->status, 404);

	/* an invalid document keeps the listener and the configuration */
	reconfigure(f, "http: { listen: 70000 }\n");
	assert_int_equal(get(new_port, "/healthz")->status, 200);	/* a pass after the reload */
	assert_int_equal(port_of(f), new_port);

	/* http.listen removed: the listener stops */
	reconfigure(f, "inbox: { basePath: /in }\n");
	for (int i = 0; i < 100 && get(new_port, "/healthz")->status != 0; i++)
		usleep(20000);
	assert_int_equal(get(new_port, "/healthz")->status, 0);
	stop(f);
	assert_int_equal(f->th.nloaded, 3);
	assert_int_equal(f->th.nloaded_null, 0);
	assert_non_null(strstr(f->th.warned, "keeping the previous one"));
	fake_free(f);
}

/*
 * qb_ingress_run takes metrics and stats NULL (qb_ingress.h): webhooks are
 * stored and /metrics still answers, its counters 0 (it crashed on a NULL
 * metrics block), the configured source's among them.
 */
static void
test_metrics_null(void **state)
{
	Fake	   *f = start(false, true);
	int			port = port_of(f);
	const char *hdr[] = {"Idempotency-Key: k3", NULL};
	Answer	   *a;

	assert_int_equal(http(port, "POST", "/inbox/hook", hdr, "{\"type\": \"t\"}")->status, 202);
	a = get(port, "/metrics");
	assert_int_equal(a->status, 200);
	assert_non_null(strstr(a->body, "queuebox_outbox_pending 3\n"));
	assert_non_null(strstr(a->body, "queuebox_relay_forwarded_total 0\n"));
	/* nothing counted: the configured source's counters stay at 0 */
	assert_non_null(strstr(a->body, "queuebox_inbox_received_total{source=\"hook\",result=\"accepted\"} 0\n"));
	stop(f);
	assert_int_equal(f->fs.nin, 1);
	assert_string_equal(f->fs.in[0].key, "k3");
	fake_free(f);
}

static int
setup(void **state)
{
	return curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK ? 0 : -1;
}

static int
teardown(void **state)
{
	curl_global_cleanup();
	return 0;
}

/* close_wait: the server side sockets of port in CLOSE-WAIT (/proc/net/tcp state 08). */
static int
close_wait(int port)
{
	FILE	   *f = fopen("/proc/net/tcp", "r");
	char		line[512];
	int			n = 0;

	assert_non_null(f);
	while (fgets(line, sizeof(line), f))
	{
		unsigned int lport;
		unsigned int st;

		if (sscanf(line, " %*d: %*8x:%4x %*8x:%*4x %2x", &lport, &st) == 2 &&
			(int) lport == port && st == 0x08)
			n++;
	}
	fclose(f);
	return n;
}

/*
 * A client that sends fewer body bytes than its Content-Length and closes:
 * its connection is released when the close arrives, not when
 * http.connectionTimeoutMs (10 s here) runs out.
 */
static void
test_truncated_then_closed(void **state)
{
	Fake	   *f = start(false, false);
	int			port = port_of(f);
	int			left = -1;

	for (int i = 0; i < 20; i++)
	{
		struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t) port)};
		int			s = socket(AF_INET, SOCK_STREAM, 0);
		static const char req[] = "POST /inbox/hook HTTP/1.1\r\nHost: x\r\nIdempotency-Key: t\r\n"
			"Content-Length: 100\r\n\r\n{\"type\":";

		a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
		assert_int_equal(connect(s, (struct sockaddr *) &a, sizeof(a)), 0);
		assert_int_equal(send(s, req, sizeof(req) - 1, 0), (ssize_t) sizeof(req) - 1);
		close(s);
	}
	/* 2 s, well inside the 10 s idle timeout */
	for (int i = 0; i < 100 && (left = close_wait(port)) > 0; i++)
		usleep(20000);
	assert_int_equal(left, 0);
	assert_int_equal(http(port, "POST", "/inbox/hook", (const char *[]) {"Idempotency-Key: after", NULL},
						  "{\"type\":\"t\"}")->status, 202);
	stop(f);
	/* each began (its head was whole) and never completed; none was stored */
	assert_int_equal(f->metrics.http_incomplete, 20);
	assert_int_equal(f->fs.nin, 1);
	fake_free(f);
}

/*
 * A header name over 255 bytes is refused (400, nothing stored): a RabbitMQ
 * destination could not carry it, and fuzz_ingress found such a stored row
 * dead at its first publish (qb_amqp_headers_build).  255 bytes are taken.
 */
static void
test_long_header_name(void **state)
{
	Fake	   *f = start(false, false);
	int			port = port_of(f);
	char		longname[300 + 8];
	char		okname[255 + 8];
	const char *bad[] = {"Idempotency-Key: ln1", longname, NULL};
	const char *good[] = {"Idempotency-Key: ln2", okname, NULL};
	Answer	   *a;

	memset(longname, 'n', 300);
	memcpy(longname, "X-", 2);
	strcpy(longname + 300, ": v");
	memset(okname, 'n', 255);
	memcpy(okname, "X-", 2);
	strcpy(okname + 255, ": v");
	a = http(port, "POST", "/inbox/hook", bad, "{\"type\": \"t\"}");
	assert_int_equal(a->status, 400);
	assert_non_null(strstr(a->body, "is 300 bytes; header names are at most 255 bytes"));
	a = http(port, "POST", "/inbox/hook", good, "{\"type\": \"t\"}");
	assert_int_equal(a->status, 202);
	stop(f);
	assert_int_equal(f->fs.nin, 1);
	assert_string_equal(f->fs.in[0].key, "ln2");
	fake_free(f);
}

/*
 * A key or event type with a control character is refused (400, nothing
 * stored): the key travels on as the relayed row's x-idempotency-key
 * header, and fuzz_ingress found a key of DEL bytes stored and the row
 * refused by the HTTP publisher.  A tab is a header value's character.
 */
static void
test_value_control_character(void **state)
{
	Fake	   *f = start(false, false);
	int			port = port_of(f);
	const char *hook[] = {"Idempotency-Key: cc1", NULL};
	const char *del_body = "{\"id\": \"\\u007f\\u007fe5\"}";
	const char *tab_body = "{\"id\": \"a\\tb\"}";
	char		sig[128];
	const char *gh[] = {sig, NULL};
	Answer	   *a;

	a = http(port, "POST", "/inbox/hook", hook, "{\"type\": \"order\\npaid\"}");
	assert_int_equal(a->status, 400);
	assert_non_null(strstr(a->body, "the event type has a control character (byte 5 is 0x0a)"));
	github_sig(GH_SECRET, del_body, sig, sizeof(sig));
	a = http(port, "POST", "/inbox/gh", gh, del_body);
	assert_int_equal(a->status, 400);
	assert_non_null(strstr(a->body, "the idempotency key has a control character (byte 0 is 0x7f)"));
	github_sig(GH_SECRET, tab_body, sig, sizeof(sig));
	a = http(port, "POST", "/inbox/gh", gh, tab_body);
	assert_int_equal(a->status, 202);
	stop(f);
	assert_int_equal(f->fs.nin, 1);
	assert_string_equal(f->fs.in[0].key, "a\tb");
	fake_free(f);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_webhooks),
		cmocka_unit_test(test_store_failure_503),
		cmocka_unit_test(test_health_and_ready),
		cmocka_unit_test(test_admin_token),
		cmocka_unit_test(test_batch_answers_each_its_id),
		cmocka_unit_test(test_reload_moves_listener),
		cmocka_unit_test(test_metrics_null),
		cmocka_unit_test(test_truncated_then_closed),
		cmocka_unit_test(test_long_header_name),
		cmocka_unit_test(test_value_control_character),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
