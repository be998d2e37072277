// Package queuebox is the Go pull worker of the QueueBox inbox: it holds
// the claim, the lease renewal, the completion, the retry and the dead
// letter of a pull source (docs/pull.md, "The five statements"), so that
// an application writes only the handler.  It needs only database/sql:
// the application brings its driver (lib/pq or pgx for PostgreSQL,
// go-mssqldb for SQL Server).
//
// Wording:
//   - A claim takes up to Options.BatchSize messages of one source, each
//     with its own claim token and a lease of Options.LeaseMS, in a
//     transaction of its own, committed before any handler starts.
//   - The handler gets the message and an open *sql.Tx: it writes its
//     business rows through it and neither commits nor rolls back.  On a
//     nil return the worker completes the message in that transaction and
//     commits; a completion that changes no row (another worker owns the
//     message) rolls the whole transaction back.
//   - Renewal: one goroutine renews every held message every third of the
//     lease, on a connection of the pool other than the handlers'.  A
//     renewal that changes no row means the message is lost: its handler's
//     context is cancelled, and database/sql rolls its transaction back.
//   - On a handler's error (or panic) the transaction is rolled back and
//     the retry policy decides, RetryAfter(d) or DeadLetter(), in a
//     statement of its own.  DefaultRetryPolicy: 1 s × 2^attempt ±20 %,
//     at most 5 minutes, dead on the fifth attempt.
//   - Stop: once Run's context is cancelled no claim starts (one under
//     way finishes, uncancelled); running handlers keep
//     Options.ShutdownGrace, past it their contexts are cancelled, nothing
//     is completed and no attempt spent (the lease expires); messages
//     claimed but not started are left to their lease.
//
// Goroutines: Run claims in the caller's goroutine; handlers run in
// goroutines of the worker, Options.MaxConcurrency at once (default 1: one
// batch at a time, in claim order).  The claim gives at most one open
// message per (source, aggregate), so handlers in parallel never run two
// messages of one aggregate, and each aggregate keeps its order.  The
// pool needs MaxConcurrency + 2 connections (Run checks
// db.SetMaxOpenConns).  Counters and the Logger may be used from any
// goroutine; nothing is printed unless a Logger is given.
//
// SQL Server (Options.Dialect SQLServer, or found from go-mssqldb): the
// five T-SQL procedures of examples/pull/sql/sqlserver; Msg 51000 from the
// claim (another claim of the source held its lock for 10 s) is a
// temporary failure, logged at LevelInfo, and the claim is tried again
// after Options.PollInterval.  database/sql drivers take their request
// timeout from the context: Options.StatementTimeout is that timeout for
// the worker's statements, and NewInboxWorker refuses less than 30 s.
package queuebox
