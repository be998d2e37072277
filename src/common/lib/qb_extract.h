/*-------------------------------------------------------------------------
 * qb_extract.h
 *	  What an inbox source reads from a received message: JSONPath values
 *	  (idempotency key, event type, aggregate id), topic templates, and the
 *	  received headers worth storing.
 *
 * Wording:
 *	- The JSONPath subset: "$" followed by steps, each ".name", "['name']"
 *	  (any characters, with \' and \\ escapes) or "[n]" (an array index,
 *	  n >= 0).  No wildcards, filters or recursive descent: a path names one
 *	  value.  A path is checked at configure time (qb_jsonpath_check).
 *	- A template is text with "{{ name }}" placeholders (spaces optional);
 *	  the names allowed are the caller's (source, eventType).
 *	- Redaction drops headers that carry credentials (Authorization, Cookie,
 *	  signature headers) before a message is stored.
 *-------------------------------------------------------------------------
 */
#ifndef QB_EXTRACT_H
#define QB_EXTRACT_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

/* Check a path's syntax; false with the offending character's offset in err. */
extern bool qb_jsonpath_check(const char *path, char *err, size_t errlen);

/*
 * The value a path names in doc (a borrowed reference), or NULL when a step
 * is missing or the path is invalid.
 */
extern json_t *qb_jsonpath_get(json_t *doc, const char *path);

/*
 * The value as key text: strings as they are, integers and booleans as
 * JSON text; NULL for null, objects, arrays, reals and missing values (an
 * idempotency key or an aggregate id must be a scalar).  malloc'd.
 */
extern char *qb_jsonpath_text(json_t *doc, const char *path);

/* The longest idempotency key, event type or aggregate id stored, in bytes. */
#define QB_VALUE_MAX_BYTES	1024

/* What keeps a key, event type or aggregate id out of the inbox. */
typedef enum QbValueFault
{
	QB_VALUE_OK,
	QB_VALUE_TOO_LONG,			/* over QB_VALUE_MAX_BYTES */
	QB_VALUE_NOT_UTF8,
	QB_VALUE_CONTROL			/* a control character other than tab */
} QbValueFault;

/*
 * qb_value_fault: whether v (not NULL) can be stored as an idempotency key,
 * event type or aggregate id, the one rule of the ingress and the consumer
 * engine; *at: the offending byte, -1 when none.  Besides what a text column
 * holds, no control character but tab: the relay sends the key on as the
 * x-idempotency-key header and the event type into the topic, where one
 * would send the row dead at its first publish.
 */
extern QbValueFault qb_value_fault(const char *v, long *at);

/*
 * Check a template against the allowed names (NULL-terminated); false with
 * the reason (an unknown name, an unterminated "{{").
 */
extern bool qb_template_check(const char *tmpl, const char *const *names,
							  char *err, size_t errlen);

/*
 * Render a checked template: names[i] is replaced by values[i] (NULL
 * renders empty).  malloc'd; the result may be empty.
 */
extern char *qb_template_render(const char *tmpl, const char *const *names,
								const char *const *values);

/*
 * True for a header that must not be stored: Authorization,
 * Proxy-Authorization, Cookie, Set-Cookie, the signature headers of the
 * schemes QueueBox checks, and extra (a configured signature header, or NULL).
 */
extern bool qb_header_redacted(const char *name, const char *extra);

#endif							/* QB_EXTRACT_H */
