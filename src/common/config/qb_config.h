/*-------------------------------------------------------------------------
 * qb_config.h
 *	  The configuration model and its validator (libyaml): the public face
 *	  of the qb_config_* family in src/common/config (qb_config_int.h lists
 *	  its files).
 *
 * Wording:
 *	- A document is the YAML text a user gives to queuebox.configure() or to
 *	  the daemon's --config.  It is stored raw: ${NAME} references are expanded
 *	  each time it is loaded, so secrets never land in a table.
 *	- A key path names a value in the document: "outbox.backoff.initialMs",
 *	  "destinations.payments.baseUrl", "routes[1].destination".
 *	- An override is a QUEUEBOX_* environment variable that replaces the value
 *	  at one key path (docs/configuration.md; the rules at the top of
 *	  qb_config_override.c).
 *
 * Everything here is plain C, no PostgreSQL header.  A QbConfig and all it
 * points to (strings, arrays, signing keys) live in one arena the config
 * owns, and its compiled transforms are released with it: qb_config_free is
 * one call, and a pointer into a config (a destination, a name) is good
 * exactly as long as the config.  A QbConfig is immutable once built; the
 * engines hold a pointer and swap it on reload, dropping every pointer into
 * the old one.
 *-------------------------------------------------------------------------
 */
#ifndef QB_CONFIG_H
#define QB_CONFIG_H

#include <stdbool.h>
#include <stddef.h>

#include "qb_auth.h"
#include "qb_backoff.h"
#include "qb_egress.h"
#include "qb_errlen.h"
#include "qb_egress_policy.h"
#include "qb_otlp.h"
#include "qb_ratelimit.h"
#include "qb_sign.h"
#include "qb_transform.h"
#include "qb_url.h"

/*
 * Defaults (qb_config_defaults) and accepted ranges, as in the document:
 *
 *	outbox.pollIntervalMs	500			integer 10..3600000
 *	outbox.batchSize		100			integer 1..10000
 *	outbox.maxAttempts		10			integer 1..1000000
 *	outbox.claimTimeoutMs	300000		integer 1000..86400000
 *	outbox.backoff.initialMs 1000		integer 1..2147483647
 *	outbox.backoff.maxMs	3600000		integer initialMs..2147483647
 *	outbox.backoff.multiplier 2			number >= 1 (1 means a constant delay)
 *	outbox.backoff.jitter	0.2			number 0..1
 *	outbox.retention		7d			"<n>d", "<n>h", "<n>m", "<n>s" or an
 *										integer of seconds; 1s..36500d
 *
 * Destinations (every key optional unless marked required):
 *	http		baseUrl (required), path "", headers {}, timeoutMs 10000 (1..600000),
 *				signing {type standard-webhooks|hmac-sha256, secret or secrets
 *				[..] (keys decoded here, qb_sign_key), header (hmac-sha256,
 *				required, an HTTP token QueueBox does not set itself), prefix,
 *				encoding hex|base64}; absent: requests are not signed
 *	rabbitmq	url (required, amqp/amqps; vhost and options as
 *				qb_amqp_url_parse reads them), exchange (required, <= 255 bytes),
 *				routingKey "{{ topic }}" (a template of topic and key),
 *				persistent true, mandatory true
 *	kafka		brokers (required, "host[:port],..."), topic (template with
 *				topic and key; none: the row's topic), config {} (librdkafka
 *				properties, string to string, each checked by librdkafka;
 *				the ones QueueBox sets itself are refused); timeout_ms is
 *				message.timeout.ms, 30000 unless config sets it (> 0)
 *	nats		url (required, nats/tls; comma-separated servers), subject
 *				(template over topic and key; none: the row's topic),
 *				jetstream true, createStream false (true: jetstream, and a
 *				subject whose first token is literal; the stream's name and
 *				subject are derived here, qbcf_nats_stream)
 *
 * Every destination type also takes maxInFlight 128 (1..10000: publishes in
 * flight at once, across the engine's claims) and circuitBreaker {failures
 * 10 (1..1000000 consecutive failed attempts open it), cooldownMs 30000
 * (100..86400000 before one probe row is tried)}, and the limits every
 * worker of one server shares (qb_limits.h): rateLimit {perSecond (a number,
 * 0.001..1000000), burst (1..1000000; default perSecond's ceiling)} and
 * maxConcurrent (1..10000 publishes at once); absent: none.
 *
 * Sources (sources.<name>; type http answered by the ingress, or a broker
 * type rabbitmq, kafka, nats consumed by a consumer worker: docs/broker-sources.md):
 *	path (required, starts with '/', unique), idempotencyKeyPath or
 *	idempotencyKeyHeader (exactly one; standard-webhooks auth defaults to the
 *	webhook-id header), eventTypePath or eventTypeHeader (at most one),
 *	aggregateIdPath, topic "{{ eventType }}" (names: source, eventType),
 *	consumption push (default) | pull, maxBodyBytes 1048576 (1..67108864),
 *	auth {type hmac-sha256|github|stripe|standard-webhooks|bearer, secret or
 *	secrets [..] (HMAC types), header (hmac-sha256, required), prefix,
 *	encoding hex|base64, toleranceSec 300 (stripe, standard-webhooks;
 *	1..86400), token (bearer)}.
 * inbox:	basePath "/inbox"; relay {enabled true, pollIntervalMs 100 (10..3600000),
 *			batchSize 100 (1..10000), claimTimeoutMs 300000 (1000..86400000),
 *			maxAttempts (1..1000000; unset: outbox.maxAttempts)}
 * http:	listen (unset: no listener; "8080" or ":8080" means 127.0.0.1:8080,
 *			"host:port" with an IPv4 literal, "[v6]:port" or localhost),
 *			maxConnections 256 (1..10000), connectionTimeoutMs 10000
 *			(1000..3600000), storeTimeoutMs 5000 (100..600000)
 * admin:	token (at least 16 characters; unset: the /admin/ routes are off)
 * database:	daemon only (queuebox-mssqld; the extension accepts and ignores
 *			it): url (unset: the daemon says it needs one; postgres://,
 *			postgresql:// or sqlserver://, credentials and a query allowed,
 *			never repeated in a message), listen false (PostgreSQL: LISTEN for
 *			the outbox's NOTIFY instead of polling alone), statementTimeoutMs
 *			30000 (100..3600000), connectTimeoutMs 10000 (1000..600000),
 *			idlePollMaxMs 2000 (10..3600000: idle polling backs off from
 *			outbox.pollIntervalMs and inbox.relay.pollIntervalMs up to this)
 * daemon:	daemon only, as database: outboxWorkers 2 (1..64), shutdownGraceMs
 *			10000 (0..3600000: how long in-flight deliveries may finish after
 *			SIGTERM), logFormat text | json (default text)
 * telemetry:	otlp {endpoint (unset: no span is exported; http:// or https://,
 *			"/v1/traces" appended when it has no path), headers {}, serviceName
 *			"queuebox", timeoutMs 10000 (100..600000), queueSize 2048
 *			(1..1000000), batchSize 512 (1..10000), flushIntervalMs 1000
 *			(10..600000)}
 * transform:	a jq program (docs/transforms.md) on a route, a destination or
 *			a source; compiled here, a compile error refuses the document.
 * Integers, numbers and booleans may be written quoted ("100"), so that a
 * ${NAME} reference or an override can supply them; booleans are true/false.
 */

typedef struct QbOutboxConf
{
	int			poll_interval_ms;	/* default 500 */
	int			batch_size;		/* default 100, 1..10000 */
	int			max_attempts;	/* default 10, >= 1 */
	long		claim_timeout_ms;	/* default 300000 */
	bool		takeover;		/* default true: a gone claimer's rows are taken over at once */
	QbBackoff	backoff;
	long		retention_sec;	/* default 7d; "7d", "12h", "30m", "45s" or seconds */
} QbOutboxConf;

typedef enum QbDestType
{
	QB_DEST_HTTP,
	QB_DEST_RABBITMQ,
	QB_DEST_KAFKA,
	QB_DEST_NATS
} QbDestType;

typedef struct QbHeader
{
	char	   *name;
	char	   *value;
} QbHeader;

/* onDead: what a row that goes dead does to its key's later rows */
typedef enum QbOnDead
{
	QB_ON_DEAD_UNSET,			/* a route that does not say: its destination's */
	QB_ON_DEAD_RELEASE,			/* they go out without it (the default) */
	QB_ON_DEAD_HOLD_KEY			/* they wait until it is requeued or skipped */
} QbOnDead;

typedef struct QbDestination
{
	char	   *name;			/* the map key under destinations: */
	QbDestType	type;
	/* http */
	char	   *base_url;		/* http:// or https://, no trailing '/' kept */
	char	   *path;			/* default "" ; starts with '/' when set */
	char	   *url;			/* base_url + path, ready for libcurl */
	QbHeader   *headers;		/* static headers, in document order */
	int			nheaders;
	long		timeout_ms;		/* default 10000 */
	QbSigning	signing;		/* signing:, keys decoded; type NONE without */
	/* rabbitmq / kafka / nats: what the broker publishers connect to */
	char	   *broker_url;		/* rabbitmq url | nats url | kafka brokers */
	char	   *target;			/* exchange | topic | subject; NULL: row topic */
	char	   *routing_key;	/* rabbitmq: template, default "{{ topic }}" */
	bool		persistent;		/* rabbitmq: default true */
	bool		mandatory;		/* rabbitmq: default true */
	QbHeader   *props;			/* kafka: config: librdkafka properties */
	int			nprops;
	bool		jetstream;		/* nats: default true */
	bool		create_stream;	/* nats: createStream, default false */
	char	   *stream;			/* nats, createStream: "queuebox-<name>" */
	char	   *stream_subject; /* nats, createStream: what that stream captures */
	QbTransform *transform;		/* transform: compiled, or NULL */
	/* every type: how the engine feeds it (docs/delivery.md) */
	int			max_in_flight;	/* maxInFlight, default QB_DEFAULT_MAX_IN_FLIGHT */
	int			breaker_failures;	/* circuitBreaker.failures, default 10 */
	long		breaker_cooldown_ms;	/* circuitBreaker.cooldownMs, default 30000 */
	QbOnDead	on_dead;		/* onDead, default release */
	QbLimitSpec limit;			/* rateLimit, maxConcurrent; zero: none */
	const QbEgress *egress;		/* the document's egress rules (daemon), or
								 * NULL: the host's */
	const QbEgressPolicy *host_egress;	/* the host's (QbConfigEnv's), or NULL */
} QbDestination;

#define QB_DEFAULT_MAX_IN_FLIGHT 128
#define QB_DEFAULT_BREAKER_FAILURES 10
#define QB_DEFAULT_BREAKER_COOLDOWN_MS 30000L

typedef struct QbRoute
{
	char	   *topic_pattern;	/* '*' one segment, '**' any number */
	char	   *destination;	/* a destinations: key: the first of dests */
	int			dest_index;		/* index into QbConfig.destinations */
	char	  **dests;			/* destination:, or each of destinations: */
	int		   *dest_indexes;	/* their indexes into QbConfig.destinations */
	int			ndests;			/* > 1: fan-out, a copy of each row per other one */
	char	   *copies;			/* fan-out: dests[1..] as a JSON array, else NULL */
	char	   *dest_list;		/* dests joined by ", ": what route_of() shows */
	QbTransform *transform;		/* transform: compiled, or NULL */
	QbOnDead	on_dead;		/* onDead; UNSET: its destination's */
} QbRoute;

typedef enum QbConsumption
{
	QB_CONSUME_PUSH,			/* the relay forwards the rows into the outbox */
	QB_CONSUME_PULL				/* the application's workers claim the rows */
} QbConsumption;

typedef enum QbSourceType
{
	QB_SOURCE_HTTP,				/* webhooks, answered by the ingress */
	QB_SOURCE_RABBITMQ,			/* the rest: consumed by a consumer worker */
	QB_SOURCE_KAFKA,
	QB_SOURCE_NATS
} QbSourceType;

typedef struct QbSource
{
	char	   *name;			/* the map key under sources: */
	QbSourceType type;
	char	   *path;			/* "/stripe": answered at inbox.basePath + path */
	char	   *idempotency_key_path;	/* JSONPath, or NULL */
	char	   *idempotency_key_header; /* header name, or NULL */
	char	   *event_type_path;	/* JSONPath, or NULL */
	char	   *event_type_header;	/* header name, or NULL */
	char	   *aggregate_id_path;	/* JSONPath, or NULL */
	char	   *topic;			/* template; default "{{ eventType }}" */
	QbConsumption consumption;	/* default push */
	long		max_body_bytes; /* default 1048576 */

	/*
	 * auth.type is QB_AUTH_NONE without an auth: section.  Its strings are
	 * owned by the config (secrets, header, prefix, token).
	 */
	QbAuth		auth;
	QbTransform *transform;		/* transform: compiled, or NULL */

	/* broker sources (rabbitmq, kafka, nats): what the consumer connects to */
	char	   *broker_url;		/* rabbitmq url | kafka brokers | nats url */
	char	   *queue;			/* rabbitmq: the queue consumed (not declared) */
	int			prefetch;		/* rabbitmq: basic.qos, default 100 */
	bool		event_type_from_header; /* rabbitmq: the AMQP type property */
	char	  **topics;			/* kafka: the topics subscribed */
	int			ntopics;
	char	   *group;			/* kafka: group.id, default "queuebox-<source>" */
	QbHeader   *props;			/* kafka: extra librdkafka consumer properties */
	int			nprops;
	char	   *subject;		/* nats: the filter subject */
	char	   *stream;			/* nats: the JetStream stream */
	char	   *durable;		/* nats: durable pull consumer, default "queuebox-<source>" */
	int			batch_size;		/* broker sources: messages per store, default 100 */
	QbOnDead	on_dead;		/* onDead: what a dead push row does to its
								 * aggregate in the relay's order; default
								 * release */
	const QbEgressPolicy *host_egress;	/* the rules of its broker connection:
										 * the host's (QbConfigEnv's), or NULL */
} QbSource;

typedef struct QbRelayConf
{
	bool		enabled;		/* default true */
	int			poll_interval_ms;	/* default 100 */
	int			batch_size;		/* default 100 */
	long		claim_timeout_ms;	/* default 300000 */
	bool		takeover;		/* default true, as outbox.takeover */
	int			max_attempts;	/* 0: outbox.maxAttempts */
} QbRelayConf;

typedef struct QbInboxConf
{
	char	   *base_path;		/* default "/inbox"; no trailing '/'; "" = root */
	QbRelayConf relay;
} QbInboxConf;

typedef struct QbHttpConf
{
	char	   *listen;			/* as written, NULL: no listener */
	char	   *host;			/* an IP literal (IPv6 without brackets) */
	int			port;			/* 1..65535 */
	int			max_connections;	/* default 256 */
	long		connection_timeout_ms;	/* default 10000 */
	long		store_timeout_ms;	/* default 5000: longer answers 503 */
} QbHttpConf;

/* database: and daemon: are the daemon's; the extension ignores them */
typedef struct QbDatabaseConf
{
	char	   *url;			/* NULL: not in the document */
	bool		listen;			/* default false */
	long		statement_timeout_ms;	/* default 30000 */
	long		connect_timeout_ms; /* default 10000 */
	long		idle_poll_max_ms;	/* default 2000 */
} QbDatabaseConf;

typedef struct QbDaemonConf
{
	int			outbox_workers; /* default 2 */
	long		shutdown_grace_ms;	/* default 10000 */
	bool		log_json;		/* logFormat: json (one object per line); false:
								 * text, the default */
} QbDaemonConf;

typedef struct QbConfig
{
	QbOutboxConf outbox;
	QbDestination *destinations;
	int			ndestinations;
	QbRoute    *routes;
	int			nroutes;
	QbSource   *sources;
	int			nsources;
	QbInboxConf inbox;			/* base_path is always set */
	QbHttpConf	http;
	char	   *admin_token;	/* NULL: the /admin/ routes are off */
	QbDatabaseConf database;	/* daemon only */
	QbDaemonConf daemon;		/* daemon only */
	bool		reads_files;	/* a value holds ${file:PATH}: a reload reads it anew */
	QbEgress   *egress;			/* egress.allow (daemon only), or NULL */
	QbOtlpOptions otlp;			/* telemetry.otlp; url NULL: no export */
	struct QbcfArena *arena;	/* private: owns everything above */
} QbConfig;

/*
 * Fill *out with every default of the model (no destinations, no routes).
 * Such a config has no arena and owns nothing (qb_config_free does nothing
 * to it).
 */
extern void qb_config_defaults(QbConfig *out);

/* The largest document a host reads from a file (either host's). */
#define QB_CONFIG_DOC_MAX	(1024 * 1024)

/*
 * What the host allows a document, given to every parse (NULL, or a zeroed
 * one: no host policy, no ${file:PATH}, every section read).  The same
 * document and the same QbConfigEnv give the same answer in any process.
 */
typedef struct QbConfigEnv
{
	/*
	 * The host's egress policy (the extension's
	 * queuebox.allowed_destinations), or NULL: the host has none, and a
	 * document's egress: section gives the rules.  Kept by the
	 * destinations, sources and span exporter for their connects.
	 */
	const QbEgressPolicy *egress;

	/*
	 * Where ${file:PATH} may read: a comma-separated list of absolute
	 * directories (a file must be inside one, as written and once symlinks
	 * are resolved); NULL or "" allows none.  file_setting: the name of the
	 * host's setting, for the refusal's hint, or NULL.
	 */
	const char *file_dirs;
	const char *file_setting;
	bool		files_anywhere; /* any path (the daemon: its operator chose its user) */

	/*
	 * The daemon's own sections (database:, daemon:) are not read: the
	 * extension, which has no use for them, checks only their keys and
	 * expands nothing there, so a file both hosts read may hold a ${NAME}
	 * only the daemon's environment sets.
	 */
	bool		daemon_sections_unread;
} QbConfigEnv;

/*
 * Parse and validate a whole document.  ${NAME} references are expanded and
 * QUEUEBOX_* overrides applied (both read through getenv), ${file:PATH} read
 * where env allows.  On success returns 0 and a new config in *out.  On
 * failure returns -1, leaves *out NULL, and writes one message to err: the
 * key path (or line and column for a YAML syntax error), what was wrong and
 * what to do, e.g.
 *   outbox.batchSize: expected an integer from 1 to 10000, got "many" (line 3, column 14)
 */
extern int	qb_config_parse(const char *text, size_t len, const QbConfigEnv *env,
							QbConfig **out, char *err, size_t errlen);
extern void qb_config_free(QbConfig *cfg);

/* The sources that consume a broker (rabbitmq, kafka, nats); 0 for NULL. */
extern int	qb_config_broker_sources(const QbConfig *cfg);

/* Destination by name, or NULL. */
extern const QbDestination *qb_config_destination(const QbConfig *cfg, const char *name);

/* Source by name, or NULL. */
extern const QbSource *qb_config_source(const QbConfig *cfg, const char *name);

/* Index of the first route whose pattern matches topic (qb_route.h), or -1. */
extern int	qb_config_route_find(const QbConfig *cfg, const char *topic);

/*
 * A header the http publisher sets itself (Content-Type, X-Message-Id,
 * User-Agent, Expect), those libcurl owns (Host, Content-Length,
 * Transfer-Encoding) and the hop-by-hop ones (Connection, Upgrade ...); a
 * row or a destination cannot set it (the header rule, publish/qb_headers.h,
 * leaves it out), nor name it as its signature header.
 */
extern bool qb_config_header_reserved(const char *name);

/* The max_attempts the relay gives the outbox rows it writes. */
extern int	qb_config_relay_max_attempts(const QbConfig *cfg);

/*
 * Expand ${NAME} references in one scalar, and ${file:PATH} ones: the
 * content of the file, less one trailing newline; PATH may hold ${NAME}
 * references (${file:${CREDENTIALS_DIRECTORY}/github}).  Returns a malloc'd
 * string or NULL with err set (unset variable, unterminated reference, bad
 * name, a file missing, unreadable or not allowed by env: NULL allows
 * none).  "$${" stands for a literal "${".
 */
extern char *qb_expand_env(const char *in, const QbConfigEnv *env, char *err, size_t errlen);

/* true when every entry of a file_dirs list is an absolute path (empty ones pass) */
extern bool qb_config_file_dirs_valid(const char *dirs);

/* URLs are checked with qb_url_check and qb_url_check_scheme (qb_url.h). */

extern const char *qb_dest_type_name(QbDestType t);

#endif							/* QB_CONFIG_H */
