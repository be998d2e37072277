/*-------------------------------------------------------------------------
 * qb_config_int.h
 *	  The configuration family's private header: the tree, the validator's
 *	  context and helpers, and the tables of destination and source types.
 *	  Only the family (src/common/config, one file per phase: README.md)
 *	  includes it; everyone else uses qb_config.h.  Its names share one
 *	  prefix, qbcf_; the public API keeps qb_config_*.
 *
 * Wording:
 *	- node: one element of the tree (mapping, sequence or scalar), with the
 *	  1-based line and column where it starts.  A node made by an override
 *	  has line 0 and remembers the variable's name, so its errors name it.
 *	- null: an unquoted empty value, "~" or "null".  A null section
 *	  ("outbox:" with nothing under it) counts as absent.
 *	- key path: see qb_config.h.  A key holding a '.' is written ["a.b"].
 *	- a check (qbcf_*): reads one value or section into the config; returns
 *	  false with the message written to the context (qbcf_error) otherwise.
 *	  The first failure ends the validation: one message per document.
 *	  Every string and array a check makes is in the context's arena (the
 *	  config's), so a failed check leaves nothing to free but the arena.
 *-------------------------------------------------------------------------
 */
#ifndef QB_CONFIG_INT_H
#define QB_CONFIG_INT_H

#include <stdbool.h>
#include <stddef.h>

#include "qb_config.h"

#define QBCF_PATHLEN	512		/* a key path; longer ones are cut, still readable */
#define QBCF_MSGLEN		QB_ERRLEN
#define QBCF_MS_MAX		2147483647L

/* ---- the arena (qb_config_arena.c) -------------------------------- */

typedef struct QbcfArena QbcfArena;

extern QbcfArena *qbcf_arena_new(void);
/* NULL when out of memory; memory is zeroed and aligned for any type */
extern void *qbcf_arena_alloc(QbcfArena *a, size_t n);
extern void *qbcf_arena_memdup(QbcfArena *a, const void *src, size_t n);
extern char *qbcf_arena_strdup(QbcfArena *a, const char *s);
extern char *qbcf_arena_strndup(QbcfArena *a, const char *s, size_t n);
/* release(handle) when the arena is freed; on false it was released now */
extern bool qbcf_arena_own(QbcfArena *a, void (*release) (void *handle), void *handle);
extern void qbcf_arena_free(QbcfArena *a);

/* ---- the tree (qb_config_tree.c): in the parse's scratch arena ----- */

typedef enum QbcfKind
{
	QBCF_SCALAR,
	QBCF_MAP,
	QBCF_SEQ
} QbcfKind;

typedef struct QbcfNode QbcfNode;
struct QbcfNode
{
	QbcfKind	kind;
	int			line;			/* 1-based; 0 for a node made by an override */
	int			column;
	char	   *text;			/* scalar: raw value, NUL-terminated */
	size_t		len;			/* scalar: its length (a "\0" escape makes it
								 * differ from strlen) */
	bool		plain;			/* scalar: unquoted, so it may be null */
	char	   *envvar;			/* the override variable that made this node */
	QbcfNode  **keys;			/* map: the key scalars, parallel to kids */
	QbcfNode  **kids;			/* map: values; seq: items */
	int			n;
	int			cap;
};

extern QbcfNode *qbcf_node_new(QbcfArena *a, QbcfKind kind, int line, int column);
extern QbcfNode *qbcf_scalar(QbcfArena *a, const char *text, size_t len, int line, int column);
extern bool qbcf_append(QbcfArena *a, QbcfNode *parent, QbcfNode *key, QbcfNode *kid);
extern bool qbcf_is_null(const QbcfNode *n);
extern int	qbcf_find(const QbcfNode *map, const char *key);
extern QbcfNode *qbcf_get(const QbcfNode *map, const char *key);
extern const char *qbcf_kind_name(const QbcfNode *n);

/* The tree of a whole stream; *root stays NULL for an empty one.  -1 with err. */
extern int	qbcf_load(QbcfArena *a, const char *text, size_t len, QbcfNode **root,
					  char *err, size_t errlen);

/* ---- environment and URLs (qb_config_env.c) ----------------------- */

/* kafka's bootstrap list, "host[:port],...", each entry optionally "proto://" */
extern bool qbcf_brokers_check(const char *s, char *err, size_t errlen);

/* ---- overrides (qb_config_override.c) ----------------------------- */

/* Apply every QUEUEBOX_* variable of the environment to the tree.  -1 with err. */
extern int	qbcf_overrides(QbcfArena *a, QbcfNode **root, char *err, size_t errlen);

/* ---- the validator's pieces (qb_config_value.c) ------------------- */

/*
 * a value that holds a file's content (${file:PATH}): qbcf_echo never
 * repeats it, and qbcf_error drops a message about its node that would
 */
typedef struct QbcfFileValue
{
	const char *value;
	const struct QbcfNode *node;
	struct QbcfFileValue *next;
} QbcfFileValue;

/* what a check writes to: the config's arena, and the one message */
typedef struct QbcfCtx
{
	QbcfArena  *arena;
	char	   *err;
	size_t		errlen;
	QbcfFileValue *file_values; /* in the arena */
	const QbConfigEnv *env;		/* what the host allows (never NULL) */
} QbcfCtx;

/* the environment of a parse given none: no host policy, no file, every section */
extern const QbConfigEnv qbcf_env_default;

extern void qbcf_fmt(char *buf, size_t size, const char *fmt,...)
			__attribute__((format(printf, 3, 4)));
extern void qbcf_path_key(char *buf, size_t size, const char *parent, const char *key);
extern void qbcf_path_index(char *buf, size_t size, const char *parent, int i);

extern bool qbcf_error(QbcfCtx *cx, const char *path, const QbcfNode *at, const char *fmt,...)
			__attribute__((format(printf, 4, 5)));
extern const char *qbcf_echo(const QbcfCtx *cx, char *buf, size_t size, const char *s);
extern void qbcf_list(char *buf, size_t size, const char *const *names, const char *last);

extern bool qbcf_text(QbcfCtx *cx, const char *path, const QbcfNode *n, const char *what,
					  char **out);
extern bool qbcf_int(QbcfCtx *cx, const char *path, const QbcfNode *n, long lo, long hi,
					 long *out);
extern bool qbcf_number(QbcfCtx *cx, const char *path, const QbcfNode *n, double lo,
						double hi, const char *what, double *out);
extern bool qbcf_bool(QbcfCtx *cx, const char *path, const QbcfNode *n, bool *out);
extern bool qbcf_string(QbcfCtx *cx, const char *path, const QbcfNode *n, bool nonempty,
						char **out);
extern bool qbcf_section(QbcfCtx *cx, const char *path, const QbcfNode *n, QbcfKind want,
						 const QbcfNode **out);
extern bool qbcf_check_keys(QbcfCtx *cx, const char *path, const QbcfNode *map,
							const char *const *allowed, const char *forwhat);
extern const QbcfNode *qbcf_required(QbcfCtx *cx, const char *path, const QbcfNode *m,
									 const char *key, const char *why);
extern bool qbcf_required_string(QbcfCtx *cx, const char *path, const QbcfNode *m,
								 const char *key, const char *why, bool nonempty,
								 char **out, const QbcfNode **node);
extern bool qbcf_flag(QbcfCtx *cx, const char *path, const QbcfNode *m, const char *key,
					  bool *out);
extern bool qbcf_opt_int(QbcfCtx *cx, const char *path, const QbcfNode *m, const char *key,
						 long lo, long hi, long *out);
extern bool qbcf_opt_string(QbcfCtx *cx, const char *path, const QbcfNode *m,
							const char *key, bool nonempty, char **out);
extern bool qbcf_header_name(const char *s);
extern bool qbcf_opt_header(QbcfCtx *cx, const char *path, const QbcfNode *m,
							const char *key, char **out);
extern bool qbcf_url_path(QbcfCtx *cx, const char *path, const QbcfNode *n, const char *s,
						  const char *example);
extern bool qbcf_pairs(QbcfCtx *cx, const char *path, const QbcfNode *node, bool http,
					   QbHeader **out, int *nout);
extern bool qbcf_typed(QbcfCtx *cx, const char *path, const QbcfNode *node,
					   const char *const *types, const char *what, const char *empty,
					   const char *why, const QbcfNode **m, int *t);
extern char *qbcf_prefixed(QbcfCtx *cx, const char *prefix, const char *name);

/* ---- the document (qb_config_check.c) ----------------------------- */

/* The whole tree (NULL: an empty document) into cfg, which holds the defaults. */
extern bool qbcf_document(QbcfCtx *cx, const QbcfNode *root, QbConfig *cfg);

/* The telemetry: section (qb_config_telemetry.c). */
extern bool qbcf_telemetry(QbcfCtx *cx, const QbcfNode *node, QbConfig *cfg);

/* the keys of the fixed sections, which the overrides know too */
extern const char *const qbcf_scalars_outbox[];
extern const char *const qbcf_keys_backoff[];
extern const char *const qbcf_scalars_inbox[];
extern const char *const qbcf_keys_relay[];
extern const char *const qbcf_keys_http_section[];
extern const char *const qbcf_keys_admin[];
extern const char *const qbcf_keys_database[];
extern const char *const qbcf_keys_daemon[];
extern const char *const qbcf_keys_breaker[];
extern const char *const qbcf_keys_rate_limit[];
extern const char *const qbcf_keys_route[];

/* a broker destination's exchange, topic or subject into d->target */
extern bool qbcf_target(QbcfCtx *cx, const char *path, const QbcfNode *m, QbDestination *d,
						const char *key, const char *why, bool nonempty);
/* d->target (at key) as a template over the row's topic and key */
extern bool qbcf_target_template(QbcfCtx *cx, const char *path, const QbcfNode *m,
								 const QbDestination *d, const char *key);

/* ---- the types (qb_config_<type>.c) ------------------------------- */

/*
 * A destination type: the keys it allows (type: and the keys every type
 * shares included) and its check, which reads its own keys of mapping m
 * into *d once qb_config_check.c has read the shared ones.
 */
typedef struct QbcfDestType
{
	const char *type;			/* as written after type: */
	const char *const *keys;
	bool		(*check) (QbcfCtx *cx, const char *path, const QbcfNode *m, QbDestination *d);
} QbcfDestType;

/* A source type, the same way: its check reads the connection keys. */
typedef struct QbcfSourceType
{
	const char *type;
	const char *const *keys;
	bool		(*check) (QbcfCtx *cx, const char *path, const QbcfNode *m, QbSource *s);
} QbcfSourceType;

/*
 * By QbDestType and QbSourceType, NULL-terminated (qb_config_check.c); a
 * hole would end a table early.  Lists made from them (names, keys) have
 * room for QBCF_MAX_TYPES, which the tables are checked against.
 */
#define QBCF_MAX_TYPES	8
extern const QbcfDestType *const qbcf_dest_types[];
extern const QbcfSourceType *const qbcf_source_types[];

extern const QbcfDestType qbcf_dest_http;
extern const QbcfDestType qbcf_dest_rabbitmq;
extern const QbcfDestType qbcf_dest_kafka;
extern const QbcfDestType qbcf_dest_nats;
extern const QbcfSourceType qbcf_source_http;
extern const QbcfSourceType qbcf_source_rabbitmq;
extern const QbcfSourceType qbcf_source_kafka;
extern const QbcfSourceType qbcf_source_nats;

/* the scalar keys of a source's auth: and a destination's signing: (qb_config_http.c) */
extern const char *const qbcf_scalars_auth[];
extern const char *const qbcf_scalars_signing[];

#endif							/* QB_CONFIG_INT_H */
