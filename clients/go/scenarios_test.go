package queuebox

// The scenarios of clients/SCENARIOS.md (1 to 7) against a real database:
// PostgreSQL 15 with the extension (QBI_TEST_PGHOST, QBI_TEST_PGPORT; TAP
// 034 starts the cluster), and SQL Server when QUEUEBOX_TEST_MSSQL_URL is
// set (mssql_test.go).  Each scenario counts rows before and after.

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// backend: one database the scenarios run on
type backend struct {
	db      *sql.DB
	dialect Dialect
	st      statements
	source  string        // the pull source of this run: a shared database has others
	biz     string        // this run's business table
	reset   string        // empty the source, a new business table
	openTx  string        // 0 when no transaction is open on the connection
	expire  string        // every lease expired a second ago
	lease   int           // the short lease of the renewal scenarios, ms
	wait    time.Duration // how long a wait for a state may take
	atP     bool          // the driver binds @p1, not $1
}

// q: a statement written with $1 parameters and the tokens {inbox} (this
// run's rows of queuebox.inbox, to select from), {mine} (the condition
// that picks them), {source} and {biz}, in the backend's words
func (b *backend) q(query string) string {
	query = strings.NewReplacer(
		"{inbox}", "(SELECT * FROM queuebox.inbox WHERE source = '"+b.source+"') i",
		"{mine}", "source = '"+b.source+"'",
		"{source}", "'"+b.source+"'",
		"{biz}", b.biz).Replace(query)
	if b.atP {
		return dollar.ReplaceAllString(query, "@p$1")
	}
	return query
}

// testSource: a source and a business table of this test process alone
func testSource() (source, biz string) {
	return fmt.Sprintf("go-%d", os.Getpid()), fmt.Sprintf("biz_go_%d", os.Getpid())
}

var dollar = regexp.MustCompile(`\$([0-9]+)`)

// exec runs a statement on a connection of the pool that the worker uses
// too, first checking that no transaction is open on it: a connection the
// pool got back with a transaction open would hide the statement from
// every other session
func (b *backend) exec(t *testing.T, query string, args ...interface{}) {
	t.Helper()
	ctx := context.Background()
	conn, err := b.db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var open int
	if err := conn.QueryRowContext(ctx, b.openTx).Scan(&open); err != nil || open != 0 {
		t.Fatalf("a connection of the pool has a transaction open (%d, %v): %s", open, err, query)
	}
	if _, err := conn.ExecContext(ctx, b.q(query), args...); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
}

// rows: the answer as text, columns joined by ':', rows by ','
func (b *backend) rows(t *testing.T, query string, args ...interface{}) string {
	t.Helper()
	rs, err := b.db.Query(b.q(query), args...)
	if err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	defer rs.Close()
	cols, _ := rs.Columns()
	var out []string
	for rs.Next() {
		v := make([]sql.NullString, len(cols))
		p := make([]interface{}, len(cols))
		for i := range v {
			p[i] = &v[i]
		}
		if err := rs.Scan(p...); err != nil {
			t.Fatalf("%s: %v", query, err)
		}
		f := make([]string, len(v))
		for i := range v {
			f[i] = v[i].String
		}
		out = append(out, strings.Join(f, ":"))
	}
	if err := rs.Err(); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return strings.Join(out, ",")
}

func (b *backend) waitFor(t *testing.T, query, want string) {
	t.Helper()
	until := time.Now().Add(b.wait)
	got := ""
	for time.Now().Before(until) {
		if got = b.rows(t, query); got == want {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("waited %v for %q to be %s; it is %s (the rows: %s)", b.wait, query, want, got,
		b.rows(t, "SELECT id, idempotency_key, state, attempt FROM {inbox} ORDER BY id"))
}

// addRows: n pull messages of the backend's source, key jI, payload {"n": I}, and
// with aggregates > 0 aggregate a(I % aggregates)
func (b *backend) addRows(t *testing.T, n, aggregates int) {
	t.Helper()
	for i := 1; i <= n; i++ {
		var agg interface{}
		if aggregates > 0 {
			agg = fmt.Sprintf("a%d", i%aggregates)
		}
		b.exec(t, "INSERT INTO queuebox.inbox (source, idempotency_key, aggregate_id, payload, consumption)"+
			" VALUES ({source}, $1, $2, $3, 'pull')", fmt.Sprintf("j%d", i), agg, fmt.Sprintf(`{"n": %d}`, i))
	}
}

// claimOther: another worker's claim, straight through the claim
// statement, in a transaction as the contract says: how many it got
func (b *backend) claimOther(n int) (int, error) {
	tx, err := b.db.Begin()
	if err != nil {
		return 0, err
	}
	defer tx.Rollback() //nolint:errcheck
	rs, err := tx.Query(b.st.claim, b.source, n, 60000)
	if err != nil {
		return 0, fmt.Errorf("the other claim: %w", err)
	}
	got := 0
	for rs.Next() {
		got++
	}
	if err := rs.Err(); err != nil {
		return 0, fmt.Errorf("the other claim: %w", err)
	}
	rs.Close()
	return got, tx.Commit()
}

func (b *backend) mustClaimOther(t *testing.T, n int) int {
	t.Helper()
	got, err := b.claimOther(n)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// started: a worker running in the background
type started struct {
	w    *InboxWorker
	stop func() Counters
}

func (b *backend) start(t *testing.T, o Options, h Handler) *started {
	t.Helper()
	o.Source = b.source
	if o.PollInterval == 0 {
		o.PollInterval = 50 * time.Millisecond
	}
	w, err := NewInboxWorker(b.db, o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx, h) }()
	var once sync.Once
	stop := func() Counters {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
		return w.Counters()
	}
	// a scenario that fails half-way leaves no worker behind
	t.Cleanup(func() { stop() })
	return &started{w: w, stop: stop}
}

func payloadN(t *testing.T, m Message) int {
	var p struct {
		N int `json:"n"`
	}
	if err := m.UnmarshalPayload(&p); err != nil {
		t.Errorf("message %d: %v", m.ID, err)
	}
	return p.N
}

// writeBiz: the business write of a handler, through its transaction
func (b *backend) writeBiz(t *testing.T, ctx context.Context, tx *sql.Tx, m Message) error {
	_, err := tx.ExecContext(ctx, b.q("INSERT INTO {biz} (msg, n) VALUES ($1, $2)"), m.ID, payloadN(t, m))
	return err
}

func waitTrue(t *testing.T, what string, f func() bool) {
	t.Helper()
	for i := 0; i < 1200 && !f(); i++ {
		time.Sleep(10 * time.Millisecond)
	}
	if !f() {
		t.Fatalf("waited 12 s for %s", what)
	}
}

func same(t *testing.T, what string, got, want interface{}) {
	t.Helper()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("%s: got %v, want %v", what, got, want)
	}
}

// runScenarios: 1 to 7 on b, each from an empty inbox
func runScenarios(t *testing.T, b *backend) {
	for _, s := range []struct {
		name string
		f    func(*testing.T, *backend)
	}{
		{"commit_together", scenarioCommitTogether},
		{"slow_handler_keeps", scenarioSlowHandlerKeeps},
		{"lost_lease", scenarioLostLease},
		{"lost_at_completion", scenarioLostAtCompletion},
		{"retry_and_policy", scenarioRetryAndPolicy},
		{"handler_panic", scenarioHandlerPanic},
		{"default_policy", scenarioDefaultPolicy},
		{"shutdown_grace", scenarioShutdownGrace},
		{"max_concurrency", scenarioMaxConcurrency},
	} {
		t.Run(s.name, func(t *testing.T) {
			b.exec(t, b.reset)
			s.f(t, b)
		})
	}
}

// 1. the business write and the completion commit together; a failing handler leaves neither
func scenarioCommitTogether(t *testing.T, b *backend) {
	b.addRows(t, 3, 0)
	w := b.start(t, Options{RetryPolicy: RetryPolicyFunc(func(Message, error) FailureAction {
		return RetryAfter(10 * time.Minute)
	})}, func(ctx context.Context, m Message, tx *sql.Tx) error {
		if err := b.writeBiz(t, ctx, tx, m); err != nil {
			return err
		}
		if payloadN(t, m) == 2 {
			return errors.New("message two always fails")
		}
		return nil
	})
	b.waitFor(t, "SELECT count(*) FROM {inbox} WHERE state = 'processed' OR attempt > 0", "3")
	c := w.stop()
	same(t, "biz", b.rows(t, "SELECT n FROM {biz} ORDER BY n"), "1,3")
	same(t, "the inbox", b.rows(t, "SELECT state, attempt FROM {inbox} ORDER BY id"),
		"processed:0,pending:1,processed:0")
	same(t, "the failed one's error", b.rows(t, "SELECT last_error FROM {inbox} WHERE idempotency_key = 'j2'"),
		"message two always fails")
	same(t, "claimed, completed, retried", []int64{c.Claimed, c.Completed, c.Retried}, []int64{3, 2, 1})
}

// 2. a handler slower than three leases keeps its message
func scenarioSlowHandlerKeeps(t *testing.T, b *backend) {
	b.addRows(t, 1, 0)
	lease := time.Duration(b.lease) * time.Millisecond
	var begun int32
	w := b.start(t, Options{LeaseMS: b.lease, BatchSize: 1}, func(ctx context.Context, m Message, tx *sql.Tx) error {
		atomic.StoreInt32(&begun, 1)
		select {
		case <-time.After(lease * 10 / 3):
		case <-ctx.Done():
			return ctx.Err()
		}
		return b.writeBiz(t, ctx, tx, m)
	})
	waitTrue(t, "the handler", func() bool { return atomic.LoadInt32(&begun) == 1 })
	time.Sleep(lease * 13 / 6)
	same(t, "another claimer past two leases gets", b.mustClaimOther(t, 5), 0)
	b.waitFor(t, "SELECT state FROM {inbox}", "processed")
	c := w.stop()
	same(t, "lease lost, completed", []int64{c.LeaseLost, c.Completed}, []int64{0, 1})
	same(t, "biz rows", b.rows(t, "SELECT count(*) FROM {biz}"), 1)
}

// 3. a lost lease cancels the handler and rolls its writes back
func scenarioLostLease(t *testing.T, b *backend) {
	b.addRows(t, 1, 0)
	var begun, sawCancel int32
	w := b.start(t, Options{LeaseMS: b.lease, BatchSize: 1}, func(ctx context.Context, m Message, tx *sql.Tx) error {
		if err := b.writeBiz(t, ctx, tx, m); err != nil {
			return err
		}
		atomic.StoreInt32(&begun, 1)
		select {
		case <-ctx.Done():
			atomic.StoreInt32(&sawCancel, 1)
			return ctx.Err()
		case <-time.After(time.Minute):
			return errors.New("never cancelled")
		}
	})
	waitTrue(t, "the handler", func() bool { return atomic.LoadInt32(&begun) == 1 })
	// the lease expired behind the worker's back, and another claimer took the message
	b.exec(t, b.expire)
	same(t, "the other claimer gets", b.mustClaimOther(t, 1), 1)
	waitTrue(t, "the lease to be seen lost", func() bool { return w.w.Counters().LeaseLost > 0 })
	c := w.stop()
	same(t, "the handler saw its context cancelled", atomic.LoadInt32(&sawCancel), 1)
	sameLostLease(t, b, c)
}

// sameLostLease: a run that lost its lease counted it, completed nothing,
// wrote nothing, and left the row to the claimer that took it over.
func sameLostLease(t *testing.T, b *backend, c Counters) {
	t.Helper()
	same(t, "lease lost, completed, retried + dead", []int64{c.LeaseLost, c.Completed, c.Retried + c.Dead},
		[]int64{1, 0, 0})
	same(t, "biz rows", b.rows(t, "SELECT count(*) FROM {biz}"), 0)
	// the other claimer still holds it: nothing of the lost run changed the row
	same(t, "the inbox", b.rows(t, "SELECT state, attempt FROM {inbox}"), "processing:0")
}

// 3b. the lease lost where no renewal saw it: the completion changes no
// row, and the whole transaction, the handler's writes too, is rolled back
func scenarioLostAtCompletion(t *testing.T, b *backend) {
	b.addRows(t, 1, 0)
	w := b.start(t, Options{LeaseMS: 60000, BatchSize: 1}, func(ctx context.Context, m Message, tx *sql.Tx) error {
		if err := b.writeBiz(t, ctx, tx, m); err != nil {
			return err
		}
		// meanwhile the lease expired and another worker took the message (not
		// b.exec, b.mustClaimOther: t.Fatal is for the test's goroutine)
		if _, err := b.db.Exec(b.q(b.expire)); err != nil {
			t.Errorf("expire: %v", err)
		}
		got, err := b.claimOther(1)
		if err != nil {
			t.Error(err)
			return err
		}
		same(t, "the other claimer gets", got, 1)
		return nil
	})
	waitTrue(t, "the completion to be seen lost", func() bool { return w.w.Counters().LeaseLost > 0 })
	c := w.stop()
	sameLostLease(t, b, c)
}

// 4. retry then success; a custom policy sends a parse error straight to dead
func scenarioRetryAndPolicy(t *testing.T, b *backend) {
	b.addRows(t, 2, 0)
	// a payload that never parses into the handler's type
	b.exec(t, `UPDATE queuebox.inbox SET payload = '{"n": "two"}' WHERE {mine} AND idempotency_key = 'j2'`)
	policy := RetryPolicyFunc(func(m Message, failure error) FailureAction {
		var syntax *json.SyntaxError
		var typ *json.UnmarshalTypeError
		if errors.As(failure, &syntax) || errors.As(failure, &typ) {
			return DeadLetter()
		}
		return RetryAfter(0)
	})
	w := b.start(t, Options{RetryPolicy: policy}, func(ctx context.Context, m Message, tx *sql.Tx) error {
		var p struct {
			N int `json:"n"`
		}
		if err := m.UnmarshalPayload(&p); err != nil {
			return err
		}
		if m.Attempt == 0 {
			return errors.New("temporary")
		}
		return b.writeBiz(t, ctx, tx, m)
	})
	b.waitFor(t, "SELECT state FROM {inbox} ORDER BY id", "processed,dead")
	c := w.stop()
	same(t, "the retried one's attempt", b.rows(t, "SELECT attempt FROM {inbox} WHERE idempotency_key = 'j1'"), 1)
	same(t, "the dead one's error", b.rows(t, "SELECT idempotency_key, last_error FROM {inbox} WHERE state = 'dead'"),
		"j2:json: cannot unmarshal string into Go struct field .n of type int")
	same(t, "retried, dead, completed", []int64{c.Retried, c.Dead, c.Completed}, []int64{1, 1, 1})
}

// 4b. a handler that panics: recovered, rolled back, and the policy decides
func scenarioHandlerPanic(t *testing.T, b *backend) {
	b.addRows(t, 1, 0)
	w := b.start(t, Options{RetryPolicy: RetryPolicyFunc(func(Message, error) FailureAction { return RetryAfter(0) })},
		func(ctx context.Context, m Message, tx *sql.Tx) error {
			if err := b.writeBiz(t, ctx, tx, m); err != nil {
				return err
			}
			if m.Attempt == 0 {
				panic("a bug in the handler")
			}
			return nil
		})
	b.waitFor(t, "SELECT state, attempt FROM {inbox}", "processed:1")
	c := w.stop()
	same(t, "retried, completed", []int64{c.Retried, c.Completed}, []int64{1, 1})
	same(t, "biz rows (the panicked run's rolled back)", b.rows(t, "SELECT count(*) FROM {biz}"), 1)
	same(t, "the panic's error", b.rows(t, "SELECT last_error FROM {inbox}"),
		"the handler panicked: a bug in the handler")
}

// 5. the default policy: dead on the fifth attempt (the backoff: TestDefaultPolicy)
func scenarioDefaultPolicy(t *testing.T, b *backend) {
	b.addRows(t, 1, 0)
	b.exec(t, "UPDATE queuebox.inbox SET attempt = 4 WHERE {mine}")
	w := b.start(t, Options{}, func(context.Context, Message, *sql.Tx) error { return errors.New("down") })
	b.waitFor(t, "SELECT state FROM {inbox}", "dead")
	same(t, "dead", w.stop().Dead, 1)
	same(t, "its error", b.rows(t, "SELECT last_error FROM {inbox}"), "down")
}

// 6. shutdown: a running handler keeps the grace; past it nothing is completed, no attempt spent
func scenarioShutdownGrace(t *testing.T, b *backend) {
	b.addRows(t, 2, 0)
	var begun int32
	w := b.start(t, Options{BatchSize: 1, ShutdownGrace: 5 * time.Second}, func(ctx context.Context, m Message, tx *sql.Tx) error {
		atomic.StoreInt32(&begun, 1)
		time.Sleep(500 * time.Millisecond)
		return b.writeBiz(t, ctx, tx, m)
	})
	waitTrue(t, "the handler", func() bool { return atomic.LoadInt32(&begun) == 1 })
	c := w.stop()
	// the running one finished within the grace; no second claim after the stop
	same(t, "completed, claimed", []int64{c.Completed, c.Claimed}, []int64{1, 1})
	same(t, "the inbox", b.rows(t, "SELECT state FROM {inbox} ORDER BY id"), "processed,pending")
	same(t, "biz rows", b.rows(t, "SELECT count(*) FROM {biz}"), 1)

	b.exec(t, b.reset)
	b.addRows(t, 1, 0)
	atomic.StoreInt32(&begun, 0)
	w = b.start(t, Options{BatchSize: 1, ShutdownGrace: 300 * time.Millisecond}, func(ctx context.Context, m Message, tx *sql.Tx) error {
		if err := b.writeBiz(t, ctx, tx, m); err != nil {
			return err
		}
		atomic.StoreInt32(&begun, 1)
		<-ctx.Done()
		return ctx.Err()
	})
	waitTrue(t, "the handler", func() bool { return atomic.LoadInt32(&begun) == 1 })
	t0 := time.Now()
	c = w.stop()
	if d := time.Since(t0); d < 300*time.Millisecond || d > 5*time.Second {
		t.Errorf("the stop took %v; the grace is 300ms", d)
	}
	same(t, "completed + retried + dead", c.Completed+c.Retried+c.Dead, 0)
	same(t, "biz rows", b.rows(t, "SELECT count(*) FROM {biz}"), 0)
	// left to its lease: still processing, no attempt spent
	same(t, "the inbox", b.rows(t, "SELECT state, attempt FROM {inbox}"), "processing:0")
}

// aggregateWatch: what handlers running at once did to per-aggregate order
type aggregateWatch struct {
	mu                  sync.Mutex
	running, maxRunning int
	perAgg              map[string]int
	lastSeq             map[string]int
	overlap, outOfOrder bool
}

func newAggregateWatch() *aggregateWatch {
	return &aggregateWatch{perAgg: map[string]int{}, lastSeq: map[string]int{}}
}

// handler: a handler that notes each message of its aggregate (message n),
// takes d, then writes the business row
func (a *aggregateWatch) handler(t *testing.T, b *backend, d time.Duration) Handler {
	return func(ctx context.Context, m Message, tx *sql.Tx) error {
		n := payloadN(t, m)
		a.mu.Lock()
		a.running++
		if a.running > a.maxRunning {
			a.maxRunning = a.running
		}
		if a.perAgg[m.AggregateID] > 0 {
			a.overlap = true
		}
		a.perAgg[m.AggregateID]++
		if n < a.lastSeq[m.AggregateID] {
			a.outOfOrder = true
		}
		a.lastSeq[m.AggregateID] = n
		a.mu.Unlock()
		time.Sleep(d)
		a.mu.Lock()
		a.perAgg[m.AggregateID]--
		a.running--
		a.mu.Unlock()
		return b.writeBiz(t, ctx, tx, m)
	}
}

func (a *aggregateWatch) check(t *testing.T) {
	t.Helper()
	same(t, "two of one aggregate at once", a.overlap, false)
	same(t, "out of order within an aggregate", a.outOfOrder, false)
}

// 7. MaxConcurrency 4 over 8 aggregates: parallel, never two of one aggregate, order kept
func scenarioMaxConcurrency(t *testing.T, b *backend) {
	b.addRows(t, 40, 8)
	a := newAggregateWatch()
	w := b.start(t, Options{MaxConcurrency: 4, BatchSize: 10}, a.handler(t, b, 60*time.Millisecond))
	b.waitFor(t, "SELECT count(*) FROM {inbox} WHERE state = 'processed'", "40")
	c := w.stop()
	same(t, "completed", c.Completed, 40)
	a.check(t)
	if a.maxRunning < 2 || a.maxRunning > 4 {
		t.Errorf("up to %d handlers ran at once, want 2 to 4", a.maxRunning)
	}
	t.Logf("MaxConcurrency 4: up to %d handlers ran at once", a.maxRunning)
	same(t, "biz rows", b.rows(t, "SELECT count(*) FROM {biz}"), 40)
}

// pgOpen: the test cluster (QBI_TEST_PGHOST, QBI_TEST_PGPORT); skipped,
// saying which TAP file runs it, without one
func pgOpen(t *testing.T, tap string) *sql.DB {
	host := os.Getenv("QBI_TEST_PGHOST")
	if host == "" {
		t.Skip("QBI_TEST_PGHOST and QBI_TEST_PGPORT are not set: no PostgreSQL to run against (" + tap + " runs these tests)")
	}
	db, err := sql.Open("postgres", fmt.Sprintf("host=%s port=%s dbname=postgres user=%s sslmode=disable",
		host, os.Getenv("QBI_TEST_PGPORT"), envOr("QBI_TEST_PGUSER", "postgres")))
	if err != nil {
		t.Fatal(err)
	}
	return db
}

func TestPostgreSQL(t *testing.T) {
	db := pgOpen(t, "TAP 034")
	defer db.Close()
	source, biz := testSource()
	b := &backend{
		db: db, dialect: PostgreSQL, st: postgresStatements, source: source, biz: biz,
		reset:  "DELETE FROM queuebox.inbox WHERE {mine}; DROP TABLE IF EXISTS {biz}; CREATE TABLE {biz} (msg bigint, n int)",
		expire: "UPDATE queuebox.inbox SET lease_until = now() - interval '1 second' WHERE {mine}",
		openTx: "SELECT CASE WHEN now() = statement_timestamp() THEN 0 ELSE 1 END",
		lease:  600, wait: 20 * time.Second,
	}
	runScenarios(t, b)
	t.Run("handler_span", func(t *testing.T) {
		b.exec(t, b.reset)
		scenarioHandlerSpan(t, b)
	})
	b.exec(t, "DELETE FROM queuebox.inbox WHERE {mine}; DROP TABLE {biz}")
}

// the StartSpan hook gets each message with its trace context, and the
// handler the context the hook returned; end gets the handler's error
func scenarioHandlerSpan(t *testing.T, b *backend) {
	b.exec(t, "INSERT INTO queuebox.inbox (source, idempotency_key, payload, headers, consumption) VALUES "+
		"({source}, 't1', '{}', $1, 'pull'), ({source}, 't2', '{}', '{}', 'pull')",
		`{"Traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tracestate": "congo=1"}`)
	type key struct{}
	var mu sync.Mutex
	parents := map[string]string{}
	ended := map[string]error{}
	seen := map[string]interface{}{}
	s := b.start(t, Options{StartSpan: func(ctx context.Context, m Message) (context.Context, func(error)) {
		tc, ok := m.TraceContext()
		mu.Lock()
		parents[m.IdempotencyKey] = fmt.Sprintf("%v %s %s %02x %s", ok, tc.TraceID, tc.SpanID, tc.TraceFlags, tc.TraceState)
		mu.Unlock()
		return context.WithValue(ctx, key{}, "span of "+m.IdempotencyKey), func(err error) {
			mu.Lock()
			ended[m.IdempotencyKey] = err
			mu.Unlock()
		}
	}}, func(ctx context.Context, m Message, tx *sql.Tx) error {
		mu.Lock()
		seen[m.IdempotencyKey] = ctx.Value(key{})
		mu.Unlock()
		return nil
	})
	b.waitFor(t, "SELECT count(*) FROM {inbox} WHERE state = 'processed'", "2")
	s.stop()
	mu.Lock()
	defer mu.Unlock()
	same(t, "t1's trace context", parents["t1"], "true 4bf92f3577b34da6a3ce929d0e0e4736 00f067aa0ba902b7 01 congo=1")
	same(t, "t2's trace context (none)", parents["t2"], fmt.Sprintf("%v %s %s %02x %s", false, "", "", 0, ""))
	same(t, "the context t1's handler got", seen["t1"], "span of t1")
	for _, k := range []string{"t1", "t2"} {
		if err, ok := ended[k]; !ok || err != nil {
			t.Errorf("%s's span: ended %v, with %v; want ended, with nil", k, ok, err)
		}
	}
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
