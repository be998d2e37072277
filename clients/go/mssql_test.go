package queuebox

// SQL Server, gated: the scenarios of scenarios_test.go, Msg 51000 as a
// temporary failure, and both names of the go-mssqldb driver, against the
// server QUEUEBOX_TEST_MSSQL_URL names (sqlserver://user:password@host:port/database,
// the project's form: the path is the database).  The schema must exist
// (queuebox-mssqld --config F --migrate, which the tests run first when
// QBI_TEST_MSSQLD names the binary, as TAP 034 does).  Skipped,
// saying why, when the variable is not set.

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/denisenkom/go-mssqldb"
)

// mssqlDSN: the project's URL as go-mssqldb reads it (its URL path is an
// instance name, the database a parameter)
func mssqlDSN(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "sqlserver" {
		return "", fmt.Errorf("QUEUEBOX_TEST_MSSQL_URL: not sqlserver://user:password@host:port/database: %v", err)
	}
	q := u.Query()
	if db := strings.TrimPrefix(u.Path, "/"); db != "" {
		q.Set("database", db)
	}
	u.Path, u.RawQuery = "", q.Encode()
	return u.String(), nil
}

func mssqlOpen(t *testing.T, driverName string) *sql.DB {
	raw := os.Getenv("QUEUEBOX_TEST_MSSQL_URL")
	if raw == "" {
		t.Skip("QUEUEBOX_TEST_MSSQL_URL is not set: no SQL Server to run against (set it to" +
			" sqlserver://user:password@host:port/database?encrypt=false, a database queuebox-mssqld --migrate set up)")
	}
	dsn, err := mssqlDSN(raw)
	if err != nil {
		t.Fatal(err)
	}
	migrateOnce.Do(func() { migrated = migrate(raw) })
	if migrated != nil {
		t.Fatal(migrated)
	}
	db, err := sql.Open(driverName, dsn)
	if err != nil {
		t.Fatal(err)
	}
	// connections kept (database/sql keeps 2 idle by default): a TDS engine
	// compiles each procedure on its first call in a session, a second or
	// two, so a handler on a new connection waits that long at each completion
	db.SetMaxIdleConns(16)
	return db
}

var (
	migrateOnce sync.Once
	migrated    error
)

// migrate: the schema, by queuebox-mssqld --migrate (idempotent), when QBI_TEST_MSSQLD names it
func migrate(raw string) error {
	bin := os.Getenv("QBI_TEST_MSSQLD")
	if bin == "" {
		return nil
	}
	dir, err := os.MkdirTemp("", "qb-go-mssql")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	conf := filepath.Join(dir, "migrate.yaml")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf("database:\n  url: %q\n", raw)), 0o600); err != nil {
		return err
	}
	out, err := exec.Command(bin, "--config", conf, "--migrate").CombinedOutput()
	if err != nil && !strings.Contains(string(out), "a newer daemon migrated it") {
		// (a newer schema has the same five procedures: the tests run on it)
		return fmt.Errorf("%s --migrate: %v\n%s", bin, err, out)
	}
	return nil
}

// mssqlBackend: native, the driver name "sqlserver" (@p1); else "mssql" ($1 and ?)
func mssqlBackend(db *sql.DB, native bool) *backend {
	source, biz := testSource()
	return &backend{
		db: db, dialect: SQLServer, st: sqlServerStatements(native), atP: native, source: source, biz: biz,
		reset: "DELETE FROM queuebox.inbox WHERE {mine}; IF OBJECT_ID(N'{biz}') IS NOT NULL DROP TABLE {biz};" +
			" CREATE TABLE {biz} (msg BIGINT, n INT)",
		expire: "UPDATE queuebox.inbox SET lease_until = DATEADD(second, -1, SYSUTCDATETIME()) WHERE {mine}",
		openTx: "SELECT @@TRANCOUNT",
		// a TDS engine can take seconds for a session's first call of a procedure
		lease: 3000, wait: 60 * time.Second,
	}
}

func TestSQLServer(t *testing.T) {
	db := mssqlOpen(t, "sqlserver")
	defer db.Close()
	b := mssqlBackend(db, true)
	var engine sql.NullString
	if err := db.QueryRow("SELECT CAST(SERVERPROPERTY('BabelfishVersion') AS NVARCHAR(20))").Scan(&engine); err != nil {
		t.Fatalf("cannot reach the server: %v", err)
	}
	if engine.Valid {
		t.Logf("the server is Babelfish %s (a TDS engine on PostgreSQL, not SQL Server)", engine.String)
	}
	runScenarios(t, b)
	t.Run("msg_51000_is_temporary", func(t *testing.T) {
		b.exec(t, b.reset)
		scenarioClaimLock(t, b)
	})
	t.Run("stop_during_claim", func(t *testing.T) {
		b.exec(t, b.reset)
		scenarioStopDuringClaim(t, b)
	})
	t.Run("two_workers", func(t *testing.T) {
		b.exec(t, b.reset)
		scenarioTwoWorkers(t, b)
	})
	b.exec(t, "DELETE FROM queuebox.inbox WHERE {mine}; DROP TABLE {biz}")
}

// the older driver name "mssql" rewrites ? itself: Run finds that out and
// binds ?; one message goes through
func TestSQLServerQuestionMarks(t *testing.T) {
	db := mssqlOpen(t, "mssql")
	defer db.Close()
	b := mssqlBackend(db, false)
	w, err := NewInboxWorker(db, Options{Source: b.source})
	if err != nil {
		t.Fatal(err)
	}
	st, err := w.start(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	same(t, "the claim", st.claim, "EXEC queuebox.inbox_claim @source = ?, @batch_size = ?, @lease_ms = ?")
	b.exec(t, b.reset)
	b.addRows(t, 1, 0)
	s := b.start(t, Options{}, func(ctx context.Context, m Message, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, b.q("INSERT INTO {biz} (msg, n) VALUES (?, ?)"), m.ID, payloadN(t, m))
		return err
	})
	b.waitFor(t, "SELECT state FROM {inbox}", "processed")
	same(t, "completed", s.stop().Completed, 1)
	same(t, "biz rows", b.rows(t, "SELECT count(*) FROM {biz}"), 1)
	b.exec(t, "DELETE FROM queuebox.inbox WHERE {mine}; DROP TABLE {biz}")
}

// holdClaimLock: a transaction on a connection of its own that holds the
// claim's application lock of b's source; roll it back to release it
func holdClaimLock(t *testing.T, b *backend) *sql.Tx {
	ctx := context.Background()
	conn, err := b.db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback() })
	var got int
	if err := tx.QueryRow("DECLARE @r INT; EXEC @r = sp_getapplock @Resource = @p1,"+
		" @LockMode = N'Exclusive', @LockOwner = N'Transaction', @LockTimeout = 1000; SELECT @r",
		"queuebox.inbox_claim:"+b.source).Scan(&got); err != nil || got < 0 {
		t.Fatalf("sp_getapplock: %d %v", got, err)
	}
	return tx
}

// a stop while a claim waits for its lock: the claim finishes, what it
// took starts no handler and is left to its lease, no attempt spent
func scenarioStopDuringClaim(t *testing.T, b *backend) {
	b.addRows(t, 1, 0)
	lock := holdClaimLock(t, b)
	s := b.start(t, Options{}, func(ctx context.Context, m Message, tx *sql.Tx) error {
		t.Errorf("message %d: a handler started after the stop", m.ID)
		return nil
	})
	time.Sleep(time.Second) // the worker's claim waits for the lock
	stopped := make(chan Counters, 1)
	t0 := time.Now()
	go func() { stopped <- s.stop() }()
	time.Sleep(500 * time.Millisecond)
	if err := lock.Rollback(); err != nil {
		t.Fatal(err)
	}
	c := <-stopped
	if d := time.Since(t0); d > 10*time.Second {
		t.Errorf("the stop took %v", d)
	}
	same(t, "claimed, completed, retried + dead", []int64{c.Claimed, c.Completed, c.Retried + c.Dead}, []int64{1, 0, 0})
	same(t, "the inbox", b.rows(t, "SELECT state, attempt FROM {inbox}"), "processing:0")
	same(t, "biz rows", b.rows(t, "SELECT count(*) FROM {biz}"), 0)
}

// Msg 51000: another session holds the claim's application lock of the
// source; the claim waits 10 s, raises 51000, the worker says it is
// temporary and claims again, and takes the message once the lock is free.
func scenarioClaimLock(t *testing.T, b *backend) {
	b.addRows(t, 1, 0)
	tx := holdClaimLock(t, b)
	var mu sync.Mutex
	var said []string
	logger := LoggerFunc(func(level Level, message string) {
		mu.Lock()
		defer mu.Unlock()
		said = append(said, level.String()+": "+message)
	})
	s := b.start(t, Options{Logger: logger}, func(ctx context.Context, m Message, tx *sql.Tx) error {
		return b.writeBiz(t, ctx, tx, m)
	})
	waitTrue51000 := func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, m := range said {
			if strings.HasPrefix(m, "info: claim: another claim of source "+b.source+" held its lock for 10 s (Msg 51000, temporary)") {
				return true
			}
		}
		return false
	}
	until := time.Now().Add(30 * time.Second)
	for !waitTrue51000() && time.Now().Before(until) {
		time.Sleep(100 * time.Millisecond)
	}
	if !waitTrue51000() {
		t.Fatalf("no Msg 51000 in 30 s; the worker said %q", said)
	}
	same(t, "while the lock is held, the message", b.rows(t, "SELECT state FROM {inbox}"), "pending")
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	b.waitFor(t, "SELECT state FROM {inbox}", "processed")
	c := s.stop()
	same(t, "claimed, completed", []int64{c.Claimed, c.Completed}, []int64{1, 1})
	same(t, "biz rows", b.rows(t, "SELECT count(*) FROM {biz}"), 1)
}

// scenarioTwoWorkers: two workers on one source, 60 messages over 6
// aggregates, each completing while the other claims.  A completion then
// races the claim that parks the next message of its aggregate; a Babelfish
// engine ignores the lock that race relies on, and before schema 0.3.3
// (the claim re-checks its parks) messages stayed parked for good there.
// Every message processed, never two of one aggregate at once, in order.
func scenarioTwoWorkers(t *testing.T, b *backend) {
	b.addRows(t, 60, 6)
	a := newAggregateWatch()
	h := a.handler(t, b, 20*time.Millisecond)
	w1 := b.start(t, Options{MaxConcurrency: 4, BatchSize: 5}, h)
	w2 := b.start(t, Options{MaxConcurrency: 4, BatchSize: 5}, h)
	b.waitFor(t, "SELECT count(*) FROM {inbox} WHERE state = 'processed'", "60")
	c1, c2 := w1.stop(), w2.stop()
	same(t, "completed", c1.Completed+c2.Completed, 60)
	if c1.Completed == 0 || c2.Completed == 0 {
		t.Logf("one worker took every message (%d, %d)", c1.Completed, c2.Completed)
	}
	a.check(t)
	same(t, "biz rows", b.rows(t, "SELECT count(*) FROM {biz}"), 60)
	same(t, "rows left parked", b.rows(t, "SELECT count(*) FROM {inbox} WHERE hold IS NOT NULL"), 0)
}
