package queuebox

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"
)

// Handler handles one message.  Write every business row through tx and
// neither commit nor roll it back: on a nil return the worker completes
// the message in tx and commits.  ctx is cancelled when the lease is lost
// or the shutdown grace ran out; tx is then rolled back.  A returned error
// rolls tx back and asks the retry policy.  A panic counts as an error.
type Handler func(ctx context.Context, message Message, tx *sql.Tx) error

// Counters count what a worker did since it was made.
type Counters struct {
	Claimed, Completed, Retried, Dead, LeaseLost int64
}

// Level is the weight of a log message.
type Level int

// The levels, lightest first.
const (
	LevelDebug Level = iota
	LevelInfo
	LevelWarn
	LevelError
)

func (l Level) String() string {
	switch l {
	case LevelDebug:
		return "debug"
	case LevelInfo:
		return "info"
	case LevelWarn:
		return "warn"
	case LevelError:
		return "error"
	}
	return fmt.Sprintf("Level(%d)", int(l))
}

// Logger receives the worker's messages.  It is called from the worker's
// goroutines, several at once.
type Logger interface {
	Log(level Level, message string)
}

// LoggerFunc makes a function a Logger.
type LoggerFunc func(level Level, message string)

// Log calls f.
func (f LoggerFunc) Log(level Level, message string) { f(level, message) }

// InboxWorker consumes one pull source.  Make it with NewInboxWorker;
// Run it once at a time.
type InboxWorker struct {
	db      *sql.DB
	opt     Options
	running int32

	claimed, completed, retried, dead, leaseLost int64
}

// NewInboxWorker checks the options and makes a worker on db.  db is the
// application's, with its driver; the worker needs MaxConcurrency + 2 of
// its connections (one per running handler, the claim, the renewal).
func NewInboxWorker(db *sql.DB, options Options) (*InboxWorker, error) {
	if db == nil {
		return nil, errors.New("queuebox: NewInboxWorker needs a *sql.DB")
	}
	o, err := options.withDefaults()
	if err != nil {
		return nil, err
	}
	if o.Dialect == DetectDialect {
		if o.Dialect, err = detectDialect(db.Driver()); err != nil {
			return nil, err
		}
	}
	return &InboxWorker{db: db, opt: o}, nil
}

// Counters returns the worker's counters now.
func (w *InboxWorker) Counters() Counters {
	return Counters{
		Claimed:   atomic.LoadInt64(&w.claimed),
		Completed: atomic.LoadInt64(&w.completed),
		Retried:   atomic.LoadInt64(&w.retried),
		Dead:      atomic.LoadInt64(&w.dead),
		LeaseLost: atomic.LoadInt64(&w.leaseLost),
	}
}

func (w *InboxWorker) logf(level Level, format string, args ...interface{}) {
	if w.opt.Logger != nil {
		w.opt.Logger.Log(level, fmt.Sprintf(format, args...))
	}
}

// held: a claimed message not finished yet
type held struct {
	msg    Message
	ctx    context.Context // the handler's
	cancel context.CancelFunc
	lost   int32 // atomic: a renewal changed no row
}

func (h *held) isLost() bool { return atomic.LoadInt32(&h.lost) == 1 }

// run: the state of one Run
type run struct {
	w        *InboxWorker
	st       statements
	handler  Handler
	complete *sql.Stmt       // PostgreSQL: st.complete, prepared; nil on SQL Server
	quiet    context.Context // the run's values, never cancelled: the statements that must outlive a stop
	hard     context.Context // the handlers' parent: cancelled past the shutdown grace
	mu       sync.Mutex
	held     map[*held]struct{}
}

// Run claims and handles messages until ctx is cancelled, then starts no
// claim and no handler (a claim under way finishes; what it took is left
// to its lease) and returns when every running handler has returned
// (they keep Options.ShutdownGrace, then their contexts are cancelled).
// It returns nil after such a stop, and an error only when it cannot
// start: the pool too small, the database unreachable, the SQL Server
// driver's parameters not understood.  Claims, renewals and completions
// that fail later are logged and tried again.
func (w *InboxWorker) Run(ctx context.Context, handler Handler) error {
	if handler == nil {
		return errors.New("queuebox: Run needs a handler")
	}
	if !atomic.CompareAndSwapInt32(&w.running, 0, 1) {
		return errors.New("queuebox: this worker is running already; make another with NewInboxWorker")
	}
	defer atomic.StoreInt32(&w.running, 0)
	st, err := w.start(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil // stopped before the first claim
		}
		return err
	}
	quiet := detached{ctx}
	hard, cancelHandlers := context.WithCancel(quiet)
	defer cancelHandlers()
	r := &run{w: w, st: st, handler: handler, quiet: quiet, hard: hard, held: map[*held]struct{}{}}
	// On PostgreSQL the completion, once a message, is a prepared statement:
	// database/sql keeps it prepared on each connection, and lib/pq then
	// sends it in one round trip instead of two.  (go-mssqldb of 2017 gets
	// the plain statement: its prepare costs a round trip of its own.)
	if w.opt.Dialect == PostgreSQL {
		pctx, cancel := context.WithTimeout(quiet, w.opt.StatementTimeout)
		r.complete, err = w.db.PrepareContext(pctx, st.complete)
		cancel()
		if err != nil {
			return fmt.Errorf("queuebox: cannot prepare the completion: %w", err)
		}
		defer r.complete.Close()
	}

	stopRenewer := make(chan struct{})
	renewerDone := make(chan struct{})
	go func() {
		defer close(renewerDone)
		r.renewer(stopRenewer)
	}()

	var handlers sync.WaitGroup
	r.claimLoop(ctx, &handlers)

	done := make(chan struct{})
	go func() {
		handlers.Wait()
		close(done)
	}()
	grace := time.NewTimer(w.opt.ShutdownGrace) // negative: fires at once
	select {
	case <-done:
	case <-grace.C:
		w.logf(LevelWarn, "the shutdown grace (%v) ran out: cancelling the running handlers", w.opt.ShutdownGrace)
		cancelHandlers()
		<-done
	}
	grace.Stop()
	close(stopRenewer)
	<-renewerDone
	return nil
}

// start: the checks before the first claim, and the statements to use
func (w *InboxWorker) start(ctx context.Context) (statements, error) {
	need := w.opt.MaxConcurrency + 2
	if max := w.db.Stats().MaxOpenConnections; max > 0 && max < need {
		return statements{}, fmt.Errorf("queuebox: the *sql.DB allows %d open connections and the worker needs %d"+
			" (MaxConcurrency %d, one for the claim, one for the lease renewal): raise db.SetMaxOpenConns",
			max, need, w.opt.MaxConcurrency)
	}
	sctx, cancel := context.WithTimeout(ctx, w.opt.StatementTimeout)
	defer cancel()
	if w.opt.Dialect == PostgreSQL {
		if err := w.db.PingContext(sctx); err != nil {
			return statements{}, fmt.Errorf("queuebox: cannot reach the database: %w", err)
		}
		return postgresStatements, nil
	}
	// SQL Server: which parameters the driver binds
	var one int
	err := w.db.QueryRowContext(sctx, "SELECT CAST(@p1 AS INT)", 1).Scan(&one)
	if err == nil {
		return sqlServerStatements(true), nil
	}
	if err2 := w.db.QueryRowContext(sctx, "SELECT CAST(? AS INT)", 1).Scan(&one); err2 == nil {
		return sqlServerStatements(false), nil
	}
	return statements{}, fmt.Errorf("queuebox: SQL Server: the driver binds neither @p1 nor ? parameters,"+
		" or the database is unreachable (open it with go-mssqldb: sql.Open(\"sqlserver\", url)): %w", err)
}

// claimLoop claims while ctx lives: one slot takes a whole batch and runs
// it in claim order; several slots claim no more than they can start.
func (r *run) claimLoop(ctx context.Context, handlers *sync.WaitGroup) {
	o := r.w.opt
	slots := make(chan struct{}, o.MaxConcurrency)
	for {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return
		}
		free := 1
	more:
		for free < o.MaxConcurrency && free < o.BatchSize {
			select {
			case slots <- struct{}{}:
				free++
			default:
				break more
			}
		}
		release := func(n int) {
			for i := 0; i < n; i++ {
				<-slots
			}
		}
		if ctx.Err() != nil {
			release(free)
			return
		}
		n := free
		if o.MaxConcurrency == 1 {
			n = o.BatchSize
		}
		batch, err := r.claim(n)
		if err != nil {
			if claimLockTimeout(err) {
				r.w.logf(LevelInfo, "claim: another claim of source %s held its lock for 10 s (Msg 51000, temporary); claiming again in %v",
					o.Source, o.PollInterval)
			} else {
				r.w.logf(LevelWarn, "claim failed: %v; claiming again in %v", err, o.PollInterval)
			}
		}
		if len(batch) == 0 {
			release(free)
			r.pause(ctx, o.PollInterval)
			continue
		}
		atomic.AddInt64(&r.w.claimed, int64(len(batch)))
		r.w.logf(LevelDebug, "claimed %d messages of source %s", len(batch), o.Source)
		hs := r.hold(batch)
		if ctx.Err() != nil {
			// the stop came during the claim: none starts, each is left to its lease
			r.drop(hs...)
			release(free)
			return
		}
		if o.MaxConcurrency == 1 {
			handlers.Add(1)
			go func() {
				defer handlers.Done()
				defer release(free)
				for i, h := range hs {
					if ctx.Err() != nil {
						// not started: left to its lease, no attempt spent
						r.drop(hs[i:]...)
						return
					}
					r.handle(h)
				}
			}()
			continue
		}
		release(free - len(hs))
		for _, h := range hs {
			handlers.Add(1)
			go func(h *held) {
				defer handlers.Done()
				defer release(1)
				r.handle(h)
			}(h)
		}
	}
}

// pause waits d or until ctx is done.
func (r *run) pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// claim: one claim of up to n messages in a transaction of its own,
// committed before it returns.  A stop does not cancel a claim under way
// (the loop stops after it, and what it claimed is left to its lease): a
// driver without a session reset (go-mssqldb of 2017) can hand the pool
// back a connection whose BEGIN the server ran when a cancellation cut
// the answer short, with the transaction still open.
func (r *run) claim(n int) ([]Message, error) {
	o := r.w.opt
	sctx, cancel := context.WithTimeout(r.quiet, o.StatementTimeout)
	defer cancel()
	tx, err := r.w.db.BeginTx(sctx, nil)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback() //nolint:errcheck // after the commit: ErrTxDone
	rows, err := tx.QueryContext(sctx, r.st.claim, o.Source, n, o.LeaseMS)
	if err != nil {
		return nil, err
	}
	var batch []Message
	for rows.Next() {
		m, err := r.scan(rows)
		if err != nil {
			rows.Close()
			return nil, err
		}
		batch = append(batch, m)
	}
	if err := rows.Err(); err != nil {
		rows.Close()
		return nil, err
	}
	if err := rows.Close(); err != nil {
		return nil, err
	}
	if err := tx.Commit(); err != nil {
		return nil, err
	}
	return batch, nil
}

func (r *run) scan(rows *sql.Rows) (Message, error) {
	var (
		m                       Message
		token, payload, headers []byte
		eventType, aggregateID  sql.NullString
		err                     error
	)
	if err = rows.Scan(&m.ID, &token, &m.Source, &m.IdempotencyKey, &eventType, &aggregateID,
		&payload, &headers, &m.Attempt, &m.CreatedAt); err != nil {
		return m, fmt.Errorf("reading the claim: %w", err)
	}
	if m.claimToken, err = r.st.token(token); err != nil {
		return m, err
	}
	m.EventType, m.AggregateID = eventType.String, aggregateID.String
	m.Payload = json.RawMessage(payload)
	if m.Headers, err = parseHeaders(headers); err != nil {
		return m, fmt.Errorf("message %d: %w", m.ID, err)
	}
	return m, nil
}

// hold registers a claimed batch for the renewal, each message with its
// handler's context.
func (r *run) hold(batch []Message) []*held {
	hs := make([]*held, len(batch))
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, m := range batch {
		ctx, cancel := context.WithCancel(r.hard)
		hs[i] = &held{msg: m, ctx: ctx, cancel: cancel}
		r.held[hs[i]] = struct{}{}
	}
	return hs
}

// drop: finished (or never to start); no longer renewed
func (r *run) drop(hs ...*held) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, h := range hs {
		delete(r.held, h)
		h.cancel()
	}
}

// renewer renews every held message every third of the lease, on a
// connection of the pool other than the handlers' (they hold theirs in a
// transaction).  A renewal that changes no row marks the message lost and
// cancels its handler's context; one that fails is tried again next round.
func (r *run) renewer(stop <-chan struct{}) {
	o := r.w.opt
	every := time.Duration(o.LeaseMS) * time.Millisecond / 3
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		r.mu.Lock()
		hs := make([]*held, 0, len(r.held))
		for h := range r.held {
			if !h.isLost() {
				hs = append(hs, h)
			}
		}
		r.mu.Unlock()
		for _, h := range hs {
			ok, err := r.flag(r.st.renew, h.msg.ID, h.msg.claimToken, o.LeaseMS)
			switch {
			case err != nil:
				r.w.logf(LevelWarn, "renewal of message %d failed: %v; trying again in %v", h.msg.ID, err, every)
			case !ok:
				atomic.StoreInt32(&h.lost, 1)
				h.cancel()
			}
		}
	}
}

// flag runs one of renew, retry, dead on a connection of its own: whether
// it changed a row
func (r *run) flag(query string, args ...interface{}) (bool, error) {
	sctx, cancel := context.WithTimeout(r.quiet, r.w.opt.StatementTimeout)
	defer cancel()
	var ok bool
	err := r.w.db.QueryRowContext(sctx, query, args...).Scan(&ok)
	return ok, err
}

// outcome of one message's transaction
type outcome int

const (
	completed   outcome = iota
	failed              // the handler's error: the retry policy decides
	lost                // another worker owns the message
	leftToLease         // not completed, no attempt spent: it comes back after its lease
)

func (r *run) handle(h *held) {
	defer r.drop(h)
	m := h.msg
	if h.isLost() {
		atomic.AddInt64(&r.w.leaseLost, 1)
		r.w.logf(LevelWarn, "message %d: the lease was lost before its handler started", m.ID)
		return
	}
	out, err := r.inTransaction(h)
	switch out {
	case completed:
		atomic.AddInt64(&r.w.completed, 1)
	case lost:
		atomic.AddInt64(&r.w.leaseLost, 1)
		r.w.logf(LevelWarn, "message %d: the lease was lost (another worker owns the message); rolled back", m.ID)
	case leftToLease:
		r.w.logf(LevelWarn, "message %d: %v; rolled back, no attempt spent: it comes back after its lease", m.ID, err)
	case failed:
		r.fail(h, err)
	}
}

// inTransaction: the handler and the completion in one transaction
func (r *run) inTransaction(h *held) (outcome, error) {
	tx, err := r.w.db.BeginTx(h.ctx, nil)
	if err != nil {
		return r.cancelled(h, fmt.Errorf("could not begin: %w", err))
	}
	herr := r.call(h, tx)
	if herr == nil && h.ctx.Err() != nil {
		herr = h.ctx.Err()
	}
	if herr != nil {
		_ = tx.Rollback()
		return r.cancelled(h, herr)
	}
	sctx, cancel := context.WithTimeout(h.ctx, r.w.opt.StatementTimeout)
	defer cancel()
	var ok bool
	var row *sql.Row
	if r.complete != nil {
		row = tx.StmtContext(sctx, r.complete).QueryRowContext(sctx, h.msg.ID, h.msg.claimToken)
	} else {
		row = tx.QueryRowContext(sctx, r.st.complete, h.msg.ID, h.msg.claimToken)
	}
	if err := row.Scan(&ok); err != nil {
		_ = tx.Rollback()
		return r.cancelled(h, fmt.Errorf("the completion failed: %w", err))
	}
	if !ok {
		_ = tx.Rollback()
		return lost, nil
	}
	if err := tx.Commit(); err != nil {
		return r.cancelled(h, fmt.Errorf("the commit failed: %w", err))
	}
	return completed, nil
}

// cancelled: why a transaction ended early: the lease lost, the grace run
// out, or else err (failed, or left to its lease when the statements of
// the library failed)
func (r *run) cancelled(h *held, err error) (outcome, error) {
	switch {
	case h.isLost():
		return lost, err
	case r.hard.Err() != nil:
		return leftToLease, errors.New("the shutdown grace ran out")
	}
	var hf handlerFailure
	if errors.As(err, &hf) {
		return failed, hf.err
	}
	return leftToLease, err
}

// handlerFailure marks an error as the handler's own (the policy decides)
type handlerFailure struct{ err error }

func (f handlerFailure) Error() string { return f.err.Error() }

// call runs the handler; a panic becomes its error
func (r *run) call(h *held, tx *sql.Tx) (err error) {
	defer func() {
		if p := recover(); p != nil {
			r.w.logf(LevelError, "message %d: the handler panicked: %v\n%s", h.msg.ID, p, debug.Stack())
			err = handlerFailure{fmt.Errorf("the handler panicked: %v", p)}
		}
	}()
	ctx := h.ctx
	if r.w.opt.StartSpan != nil {
		var end func(error)
		ctx, end = r.w.opt.StartSpan(ctx, h.msg)
		defer func() { end(err) }()
	}
	if err := r.handler(ctx, h.msg, tx); err != nil {
		return handlerFailure{err}
	}
	return nil
}

// fail asks the policy, then retries or dead-letters in a statement of its own
func (r *run) fail(h *held, failure error) {
	m := h.msg
	action := r.decide(m, failure)
	text := failure.Error()
	if text == "" {
		text = "the handler failed"
	}
	var ok bool
	var err error
	what := "retry"
	if action.dead {
		what = "dead letter"
		ok, err = r.flag(r.st.dead, m.ID, m.claimToken, text)
	} else {
		ok, err = r.flag(r.st.retry, m.ID, m.claimToken, action.delay.Milliseconds(), text)
	}
	switch {
	case err != nil:
		r.w.logf(LevelError, "message %d: the %s failed: %v; it comes back after its lease", m.ID, what, err)
	case !ok:
		r.w.logf(LevelWarn, "message %d: the %s changed no row (the lease was lost)", m.ID, what)
	case action.dead:
		atomic.AddInt64(&r.w.dead, 1)
	default:
		atomic.AddInt64(&r.w.retried, 1)
	}
}

// decide: the policy's answer; a policy that panics gets the default's
func (r *run) decide(m Message, failure error) (action FailureAction) {
	defer func() {
		if p := recover(); p != nil {
			r.w.logf(LevelError, "message %d: the retry policy panicked: %v; the default policy decides", m.ID, p)
			action = DefaultRetryPolicy.Decide(m, failure)
		}
	}()
	return r.w.opt.RetryPolicy.Decide(m, failure)
}

// detached carries a context's values but never its cancellation: the
// handlers keep their grace after the run's context is cancelled, and a
// retry after a stop still runs.
type detached struct{ parent context.Context }

func (detached) Deadline() (time.Time, bool)         { return time.Time{}, false }
func (detached) Done() <-chan struct{}               { return nil }
func (detached) Err() error                          { return nil }
func (d detached) Value(key interface{}) interface{} { return d.parent.Value(key) }
