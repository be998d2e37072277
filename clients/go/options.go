package queuebox

import (
	"context"
	"fmt"
	"time"
)

// Options configure an InboxWorker.  Source is required; a zero value
// takes the default named beside it.
type Options struct {
	// Source is the pull source to consume.
	Source string
	// BatchSize is how many messages one claim takes (default 10, at most
	// 10000).  With MaxConcurrency above 1 a claim takes no more than the
	// handlers free to start them.
	BatchSize int
	// LeaseMS is the lease of a claimed message in milliseconds (default
	// 30000, at least 100); the worker renews it every third of it.
	LeaseMS int
	// MaxConcurrency is how many handlers run at once (default 1, at most
	// 256).  Never two messages of one aggregate: the claim gives one
	// open message per (source, aggregate).
	MaxConcurrency int
	// ShutdownGrace is how long running handlers may go on after the
	// run's context is cancelled (default 30 s; negative: none).  Past it
	// their contexts are cancelled, nothing is completed and no attempt
	// spent: the lease expires and another worker takes the message.
	ShutdownGrace time.Duration
	// PollInterval is the wait after a claim that found nothing or failed
	// (default 500 ms).
	PollInterval time.Duration
	// StatementTimeout bounds each of the library's own statements (claim,
	// renew, complete, retry, dead); default 60 s.  database/sql drivers
	// take their request timeout from the context, so this is the request
	// timeout the SQL Server rule asks for: it must be at least 30 s, as
	// the SQL Server claim waits up to 10 s for its lock, and a call cut
	// short leaves that lock held until the connection resets.
	StatementTimeout time.Duration
	// RetryPolicy decides what a failed message does (default
	// DefaultRetryPolicy).
	RetryPolicy RetryPolicy
	// Dialect is PostgreSQL or SQLServer (default: from the driver).
	Dialect Dialect
	// Logger receives what the worker has to say (default: nothing is
	// logged).
	Logger Logger
	// StartSpan, when set, is called before each handler with the
	// handler's context; the handler gets the context it returns, and end
	// is called with the handler's error once it returned.  Start a span
	// there, the child of m.TraceContext() when the message has one: the
	// library needs no tracing package (docs/observability.md).
	StartSpan func(ctx context.Context, m Message) (spanCtx context.Context, end func(err error))
}

// minStatementTimeout: the SQL Server claim's lock wait (10 s) with room
const minStatementTimeout = 30 * time.Second

// withDefaults checks o and fills in the defaults; the error says which
// option is wrong and what it may be.
func (o Options) withDefaults() (Options, error) {
	if o.Source == "" {
		return o, fmt.Errorf("queuebox: Options.Source (the pull source to consume) is required")
	}
	ints := []struct {
		name     string
		v        *int
		def      int
		min, max int
	}{
		{"BatchSize", &o.BatchSize, 10, 1, 10000},
		{"LeaseMS", &o.LeaseMS, 30000, 100, 86400000},
		{"MaxConcurrency", &o.MaxConcurrency, 1, 1, 256},
	}
	for _, f := range ints {
		if *f.v == 0 {
			*f.v = f.def
		}
		if *f.v < f.min || *f.v > f.max {
			return o, fmt.Errorf("queuebox: Options.%s must be from %d to %d (0: %d), got %d",
				f.name, f.min, f.max, f.def, *f.v)
		}
	}
	if o.ShutdownGrace == 0 {
		o.ShutdownGrace = 30 * time.Second
	}
	if o.PollInterval == 0 {
		o.PollInterval = 500 * time.Millisecond
	}
	if o.PollInterval < 0 {
		return o, fmt.Errorf("queuebox: Options.PollInterval must not be negative, got %v", o.PollInterval)
	}
	if o.StatementTimeout == 0 {
		o.StatementTimeout = 60 * time.Second
	}
	if o.StatementTimeout < minStatementTimeout {
		return o, fmt.Errorf("queuebox: Options.StatementTimeout is %v, the request timeout of the worker's own statements;"+
			" it must be at least 30s: the SQL Server claim waits up to 10s for its lock, and a call aborted earlier"+
			" leaves the lock held until the connection resets. Raise it, or leave it 0 for 60s", o.StatementTimeout)
	}
	if o.RetryPolicy == nil {
		o.RetryPolicy = DefaultRetryPolicy
	}
	if o.Dialect < DetectDialect || o.Dialect > SQLServer {
		return o, fmt.Errorf("queuebox: Options.Dialect is %v: use queuebox.PostgreSQL or queuebox.SQLServer", o.Dialect)
	}
	return o, nil
}
