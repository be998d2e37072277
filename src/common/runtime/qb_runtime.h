/*-------------------------------------------------------------------------
 * qb_runtime.h
 *	  The process's running parts, kept by its host and passed down.
 *
 * Wording: the runtime (QbRuntime) is what one process runs besides its
 * engine: the span exporter (qb_otlp.h), the transforms' jq helper child
 * (qb_transform.h) and the host's egress policy (qb_egress_policy.h).  A
 * host keeps one for the life of the process (the exporter's exit handler
 * reads it), zeroed at the start, and hands it to its engines as
 * QbHost.runtime and to the validator (the policy) in QbConfigEnv;
 * nothing in src/common keeps process state of its own.
 *
 * Threads: each part's header says; the exporter and the helper are driven
 * from the main thread only.
 *-------------------------------------------------------------------------
 */
#ifndef QB_RUNTIME_H
#define QB_RUNTIME_H

#include "qb_egress_policy.h"
#include "qb_otlp.h"
#include "qb_transform.h"

typedef struct QbRuntime
{
	QbOtlpExporter otlp;		/* the span exporter (none running) */
	QbTransformHelper jq;		/* the transforms' helper (none started) */
	QbEgressPolicy egress;		/* the host's egress policy (none) */
} QbRuntime;

#endif							/* QB_RUNTIME_H */
