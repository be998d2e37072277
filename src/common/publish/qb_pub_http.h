/*-------------------------------------------------------------------------
 * qb_pub_http.h
 *	  The HTTP publisher (qb_pub_http.c) behind QbPublisherOps.
 *-------------------------------------------------------------------------
 */
#ifndef QB_PUB_HTTP_H
#define QB_PUB_HTTP_H

#include "qb_publish.h"

extern const QbPublisherOps qb_http_publisher;

#endif							/* QB_PUB_HTTP_H */
