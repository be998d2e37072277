package queuebox

// The tests that need no server: the default policy, the options and the
// timeout check, the dialects (their statements against
// examples/pull/sql, the claim token, Msg 51000), the pool check.

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	mssql "github.com/denisenkom/go-mssqldb"
	"github.com/lib/pq"
)

func TestDefaultPolicy(t *testing.T) {
	for a := 0; a < 4; a++ {
		base := time.Second << a
		for k := 0; k < 50; k++ {
			d := DefaultRetryPolicy.Decide(Message{Attempt: a}, errors.New("x"))
			if d.Dead() {
				t.Fatalf("attempt %d: dead, want a retry", a)
			}
			if d.Delay() < base*8/10 || d.Delay() > base*12/10 {
				t.Fatalf("attempt %d: delay %v, want %v ±20 %%", a, d.Delay(), base)
			}
		}
	}
	if !DefaultRetryPolicy.Decide(Message{Attempt: 4}, errors.New("x")).Dead() {
		t.Fatal("attempt 4 (the fifth): want dead")
	}
	if d := RetryAfter(-time.Second); d.Dead() || d.Delay() != 0 {
		t.Fatalf("RetryAfter(-1s) = %+v, want a retry after 0", d)
	}
	if !DeadLetter().Dead() {
		t.Fatal("DeadLetter() is not dead")
	}
}

func TestOptions(t *testing.T) {
	db, err := sql.Open("postgres", "host=/nonexistent")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, c := range []struct {
		o    Options
		want string
	}{
		{Options{}, "Options.Source (the pull source to consume) is required"},
		{Options{Source: "s", LeaseMS: 50}, "Options.LeaseMS must be from 100 to 86400000 (0: 30000), got 50"},
		{Options{Source: "s", MaxConcurrency: 1000}, "Options.MaxConcurrency must be from 1 to 256"},
		{Options{Source: "s", BatchSize: -1}, "Options.BatchSize must be from 1 to 10000"},
		{Options{Source: "s", PollInterval: -time.Second}, "Options.PollInterval must not be negative"},
		{Options{Source: "s", Dialect: Dialect(7)}, "Options.Dialect is Dialect(7)"},
		// the request timeout check: the mssql npm default of 15 s is refused, saying what to do
		{Options{Source: "s", StatementTimeout: 15 * time.Second},
			"Options.StatementTimeout is 15s, the request timeout of the worker's own statements; it must be at least 30s"},
	} {
		_, err := NewInboxWorker(db, c.o)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: got %v, want %q", c.o, err, c.want)
		}
	}
	if _, err := NewInboxWorker(nil, Options{Source: "s"}); err == nil {
		t.Error("a nil *sql.DB is accepted")
	}
	w, err := NewInboxWorker(db, Options{Source: "s", StatementTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	o := w.opt
	if o.BatchSize != 10 || o.LeaseMS != 30000 || o.MaxConcurrency != 1 || o.ShutdownGrace != 30*time.Second ||
		o.PollInterval != 500*time.Millisecond || o.StatementTimeout != 30*time.Second || o.RetryPolicy == nil ||
		o.Dialect != PostgreSQL {
		t.Errorf("the defaults: %+v", o)
	}
	if w.opt.Logger != nil {
		t.Error("a logger by default: nothing is to be printed")
	}
}

type unknownDriver struct{}

func (unknownDriver) Open(string) (driver.Conn, error) { return nil, errors.New("no") }

func TestDetectDialect(t *testing.T) {
	for _, c := range []struct {
		drv  driver.Driver
		want Dialect
	}{{&pq.Driver{}, PostgreSQL}, {&mssql.MssqlDriver{}, SQLServer}} {
		if got, err := detectDialect(c.drv); err != nil || got != c.want {
			t.Errorf("%T: %v %v, want %v", c.drv, got, err, c.want)
		}
	}
	if _, err := detectDialect(unknownDriver{}); err == nil ||
		!strings.Contains(err.Error(), "set Options.Dialect to queuebox.PostgreSQL or queuebox.SQLServer") {
		t.Errorf("an unknown driver: %v", err)
	}
}

// the statements are those of examples/pull/sql, as the driver sends them
func TestStatementsAreTheExamples(t *testing.T) {
	comment := regexp.MustCompile(`(?m)^--.*\n`)
	space := regexp.MustCompile(`\s+`)
	example := func(dialect, name string) string {
		b, err := os.ReadFile("../../examples/pull/sql/" + dialect + "/" + name + ".sql")
		if err != nil {
			t.Fatal(err)
		}
		s := space.ReplaceAllString(comment.ReplaceAllString(string(b), ""), " ")
		return strings.TrimSuffix(strings.TrimSpace(s), ";")
	}
	for dialect, st := range map[string]statements{
		"postgresql": postgresStatements,
		"sqlserver":  sqlServerStatements(false),
	} {
		for name, got := range map[string]string{"claim": st.claim, "renew": st.renew, "complete": st.complete,
			"retry": st.retry, "dead": st.dead} {
			if want := example(dialect, name); space.ReplaceAllString(got, " ") != want {
				t.Errorf("%s %s:\n got %s\nwant %s", dialect, name, got, want)
			}
		}
	}
	native := sqlServerStatements(true)
	if native.retry != "EXEC queuebox.inbox_retry @id = @p1, @claim_token = @p2, @delay_ms = @p3, @error = @p4" {
		t.Errorf("the native SQL Server retry: %s", native.retry)
	}
}

func TestClaimToken(t *testing.T) {
	const want = "6f9619ff-8b86-d011-b42d-00c04fc964ff"
	// SQL Server sends a UNIQUEIDENTIFIER with its first three groups little-endian
	wire := []byte{0xff, 0x19, 0x96, 0x6f, 0x86, 0x8b, 0x11, 0xd0, 0xb4, 0x2d, 0x00, 0xc0, 0x4f, 0xc9, 0x64, 0xff}
	if got, err := sqlServerStatements(true).token(wire); err != nil || got != want {
		t.Errorf("SQL Server: %q %v", got, err)
	}
	var u mssql.UniqueIdentifier
	if err := u.Scan(wire); err != nil || !strings.EqualFold(fmt.Sprintf("%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:]), want) {
		t.Errorf("the driver reads the same bytes as %s: %v %v", u, want, err)
	}
	network := []byte{0x6f, 0x96, 0x19, 0xff, 0x8b, 0x86, 0xd0, 0x11, 0xb4, 0x2d, 0x00, 0xc0, 0x4f, 0xc9, 0x64, 0xff}
	if got, err := postgresStatements.token(network); err != nil || got != want {
		t.Errorf("PostgreSQL, binary: %q %v", got, err)
	}
	if got, err := postgresStatements.token([]byte(want)); err != nil || got != want {
		t.Errorf("PostgreSQL, text: %q %v", got, err)
	}
	if _, err := postgresStatements.token([]byte("short")); err == nil {
		t.Error("a malformed token is accepted")
	}
}

func TestMsg51000IsTemporary(t *testing.T) {
	lock := mssql.Error{Number: 51000, Message: "queuebox.inbox_claim: another claim of this source held its lock for 10 s"}
	for _, c := range []struct {
		err  error
		want bool
	}{
		{lock, true},
		{fmt.Errorf("claim: %w", lock), true},
		{mssql.Error{Number: 50022, Message: "queuebox.inbox_claim: @source, @batch_size (1 or more)"}, false},
		{errors.New("mssql: queuebox.inbox_claim: another claim of this source held its lock for 10 s"), true},
		{errors.New("connection refused"), false},
		{nil, false},
	} {
		if got := claimLockTimeout(c.err); got != c.want {
			t.Errorf("%v: %v, want %v", c.err, got, c.want)
		}
	}
}

func TestHeaders(t *testing.T) {
	h, err := parseHeaders([]byte(`{"x-source": "shop", "n": 3, "o": {"a": 1}}`))
	if err != nil || h["x-source"] != "shop" || h["n"] != "3" || h["o"] != `{"a": 1}` {
		t.Errorf("%v %v", h, err)
	}
	if h, err := parseHeaders(nil); err != nil || len(h) != 0 {
		t.Errorf("no headers: %v %v", h, err)
	}
	if _, err := parseHeaders([]byte(`[1]`)); err == nil {
		t.Error("headers that are not an object are accepted")
	}
}

func TestPayload(t *testing.T) {
	var v struct{ N int }
	m := Message{Payload: []byte(`{"N": 4}`)}
	if err := m.UnmarshalPayload(&v); err != nil || v.N != 4 {
		t.Errorf("%v %v", v, err)
	}
	var syntax *json.SyntaxError
	if err := (Message{Payload: []byte(`{`)}).UnmarshalPayload(&v); !errors.As(err, &syntax) {
		t.Errorf("a bad payload: %T %v, want a *json.SyntaxError", err, err)
	}
}

// Run checks at start what it can check without a query
func TestRunStartChecks(t *testing.T) {
	db, err := sql.Open("postgres", "host=/nonexistent")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(3)
	w, err := NewInboxWorker(db, Options{Source: "s", MaxConcurrency: 2})
	if err != nil {
		t.Fatal(err)
	}
	noop := func(context.Context, Message, *sql.Tx) error { return nil }
	if err := w.Run(context.Background(), noop); err == nil ||
		!strings.Contains(err.Error(), "allows 3 open connections and the worker needs 4") ||
		!strings.Contains(err.Error(), "raise db.SetMaxOpenConns") {
		t.Errorf("a pool too small: %v", err)
	}
	if err := w.Run(context.Background(), nil); err == nil {
		t.Error("a nil handler is accepted")
	}
	db.SetMaxOpenConns(0)
	if err := w.Run(context.Background(), noop); err == nil || !strings.Contains(err.Error(), "cannot reach the database") {
		t.Errorf("no database: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := w.Run(ctx, noop); err != nil {
		t.Errorf("stopped before the start: %v, want nil", err)
	}
}

func TestTraceContext(t *testing.T) {
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	tc, ok := Message{Headers: map[string]string{"TraceParent": tp, "TraceState": "a=1"}}.TraceContext()
	if !ok || tc != (TraceContext{"4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", 1, "a=1"}) {
		t.Errorf("TraceContext() = %+v, %v", tc, ok)
	}
	for _, bad := range []string{"", "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
		"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", tp + "-more",
		"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01"} {
		if _, ok := (Message{Headers: map[string]string{"traceparent": bad}}).TraceContext(); ok {
			t.Errorf("TraceContext() of %q: ok, want false", bad)
		}
	}
	if tc, ok := (Message{Headers: map[string]string{"traceparent": "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-later"}}).TraceContext(); !ok || tc.SpanID != "00f067aa0ba902b7" {
		t.Errorf("a later version: %+v, %v", tc, ok)
	}
}
