/*-------------------------------------------------------------------------
 * qb_route.h
 *	  Topic patterns and routing.
 *
 * A topic is a dot-separated list of segments ("orders.eu.created").  In a
 * pattern, "*" matches exactly one segment and "**" matches any number of
 * segments, zero included; every other segment matches itself.  The first
 * route whose pattern matches names the destination (qb_config_route_find,
 * since the routes are the configuration's).
 *-------------------------------------------------------------------------
 */
#ifndef QB_ROUTE_H
#define QB_ROUTE_H

#include <stdbool.h>
#include <stddef.h>

extern bool qb_topic_match(const char *pattern, const char *topic);

/* Returns a pattern's defect in err (empty segment, "a*b" segment), or true. */
extern bool qb_pattern_check(const char *pattern, char *err, size_t errlen);

#endif							/* QB_ROUTE_H */
