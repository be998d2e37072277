package queuebox

// Outbox.Enqueue (outbox.go, docs/enqueue.md) on a real database whose
// outbox delivers topics enq.** to the real HTTP sink, both started by TAP
// 064: PostgreSQL (QBI_TEST_PGHOST, QBI_TEST_PGPORT), and SQL Server when
// QUEUEBOX_TEST_MSSQL_URL is set too (queuebox-mssqld delivering).
// QBI_TEST_SINK_LOG is the sink's JSONL log; without it they are skipped.

import (
	"bufio"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"
)

type enqDB struct {
	db             *sql.DB
	p              func(n int) string // the n-th placeholder
	biz, row, due  string
	createBiz, now string
}

func sinkLog(t *testing.T) string {
	log := os.Getenv("QBI_TEST_SINK_LOG")
	if log == "" {
		t.Skip("QBI_TEST_SINK_LOG is not set: no sink to deliver to (TAP 064 runs these tests)")
	}
	return log
}

func TestEnqueuePostgreSQL(t *testing.T) {
	log := sinkLog(t)
	db := pgOpen(t, "TAP 064")
	defer db.Close()
	runEnqueue(t, log, &enqDB{db: db, p: func(n int) string { return fmt.Sprintf("$%d", n) },
		createBiz: "CREATE TABLE IF NOT EXISTS enq_go_biz (n int NOT NULL)", biz: "enq_go_biz",
		row: "SELECT message_id::text, state, attempt, headers::text," +
			" to_char(scheduled_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS') FROM queuebox.outbox WHERE id = $1",
		due: "UPDATE queuebox.outbox SET scheduled_at = now() WHERE id = $1"})
}

func TestEnqueueSQLServer(t *testing.T) {
	log := sinkLog(t)
	db := mssqlOpen(t, "sqlserver")
	defer db.Close()
	runEnqueue(t, log, &enqDB{db: db, p: func(n int) string { return fmt.Sprintf("@p%d", n) },
		createBiz: "IF OBJECT_ID(N'dbo.enq_go_biz') IS NULL CREATE TABLE dbo.enq_go_biz (n INT NOT NULL)", biz: "dbo.enq_go_biz",
		row: "SELECT CAST(message_id AS NVARCHAR(36)), state, attempt, headers," +
			" CONVERT(NVARCHAR(23), scheduled_at, 126) FROM queuebox.outbox WHERE id = @p1",
		due: "UPDATE queuebox.outbox SET scheduled_at = SYSUTCDATETIME() WHERE id = @p1"})
}

// The driver name "mssql" binds ? where "sqlserver" binds @p1: Enqueue finds
// out on the caller's transaction, and a failed probe (a cancelled context)
// is not kept for the next call.
func TestEnqueueMssqlDriverName(t *testing.T) {
	sinkLog(t)
	db := mssqlOpen(t, "mssql")
	defer db.Close()
	ctx := context.Background()
	ob, err := NewOutbox(db, OutboxOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out0 int
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM queuebox.outbox").Scan(&out0); err != nil {
		t.Fatal(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	gone, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := ob.Enqueue(gone, tx, OutboxMessage{Topic: "enq.go.driver", Payload: 1}); err == nil {
		t.Fatal("Enqueue with a cancelled context succeeded")
	}
	tx.Rollback()
	if tx, err = db.BeginTx(ctx, nil); err != nil {
		t.Fatal(err)
	}
	ids, err := ob.Enqueue(ctx, tx, OutboxMessage{Topic: "enq.go.driver", Key: "k-driver", Payload: 1},
		OutboxMessage{Topic: "enq.go.driver", Key: "k-driver", Payload: 2})
	if err != nil || len(ids) != 2 || ids[0] >= ids[1] {
		t.Fatalf("after a cancelled call, Enqueue on the \"mssql\" driver: ids %v, %v", ids, err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM queuebox.outbox").Scan(&n); err != nil || n != out0+2 {
		t.Fatalf("%d rows, %v; want %d", n, err, out0+2)
	}
}

type enqRow struct {
	mid, state, headers, at string
	attempt                 int
}

func runEnqueue(t *testing.T, log string, b *enqDB) {
	ctx := context.Background()
	if _, err := b.db.ExecContext(ctx, b.createBiz); err != nil {
		t.Fatal(err)
	}
	ob, err := NewOutbox(b.db, OutboxOptions{})
	if err != nil {
		t.Fatal(err)
	}
	count := func(table string) int {
		var n int
		if err := b.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+table).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	row := func(id int64) enqRow {
		var r enqRow
		if err := b.db.QueryRowContext(ctx, b.row, id).Scan(&r.mid, &r.state, &r.attempt, &r.headers, &r.at); err != nil {
			t.Fatal(err)
		}
		r.mid = strings.ToLower(r.mid)
		return r
	}
	// sent waits for the row's delivery: a deadline, not a timed assertion
	sent := func(id int64) enqRow {
		for i := 0; i < 1200; i++ {
			r := row(id)
			if r.state == "sent" {
				return r
			}
			if r.state == "dead" {
				t.Fatalf("row %d went dead", id)
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Fatalf("row %d was not delivered", id)
		return enqRow{}
	}
	inTx := func(ctx context.Context, commit bool, work func(tx *sql.Tx)) {
		tx, err := b.db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		work(tx)
		if commit {
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
		}
	}
	enqueue := func(ctx context.Context, tx *sql.Tx, msgs ...OutboxMessage) []int64 {
		ids, err := ob.Enqueue(ctx, tx, msgs...)
		if err != nil {
			t.Fatal(err)
		}
		return ids
	}
	write := func(tx *sql.Tx, n int) {
		if _, err := tx.ExecContext(ctx, "INSERT INTO "+b.biz+" (n) VALUES ("+b.p(1)+")", n); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("commit_and_rollback_together", func(t *testing.T) {
		biz0, out0 := count(b.biz), count("queuebox.outbox")
		inTx(ctx, false, func(tx *sql.Tx) {
			write(tx, 1)
			enqueue(ctx, tx, OutboxMessage{Topic: "enq.go.together", Key: "k-together", Payload: map[string]int{"n": 1}})
		})
		if got := [2]int{count(b.biz), count("queuebox.outbox")}; got != [2]int{biz0, out0} {
			t.Fatalf("rolled back: %v rows, want %v", got, [2]int{biz0, out0})
		}
		var ids []int64
		inTx(ctx, true, func(tx *sql.Tx) {
			write(tx, 2)
			ids = enqueue(ctx, tx, OutboxMessage{Topic: "enq.go.together", Key: "k-together", Payload: map[string]int{"n": 2}})
		})
		if got := [2]int{count(b.biz), count("queuebox.outbox")}; got != [2]int{biz0 + 1, out0 + 1} {
			t.Fatalf("committed: %v rows, want %v", got, [2]int{biz0 + 1, out0 + 1})
		}
		reqs := sinkRequests(t, log, sent(ids[0]).mid)
		if len(reqs) != 1 || !regexp.MustCompile(`"n":\s*2\b`).MatchString(reqs[0].Body) {
			t.Fatalf("the sink got %+v", reqs)
		}
	})

	t.Run("trace_context", func(t *testing.T) {
		span := TraceContext{TraceID: randomHex(16), SpanID: randomHex(8), TraceFlags: 1, TraceState: "congo=t61"}
		var id int64
		inTx(ctx, true, func(tx *sql.Tx) {
			id = enqueue(WithTraceContext(ctx, span), tx, OutboxMessage{Topic: "enq.go.traced", Payload: "traced"})[0]
		})
		r := sent(id)
		var h map[string]string
		if err := json.Unmarshal([]byte(r.headers), &h); err != nil {
			t.Fatal(err)
		}
		if want := "00-" + span.TraceID + "-" + span.SpanID + "-01"; h["traceparent"] != want || h["tracestate"] != "congo=t61" {
			t.Fatalf("the row's headers %v, want traceparent %s and its tracestate", h, want)
		}
		req := sinkRequests(t, log, r.mid)[0]
		g := regexp.MustCompile(`^00-([0-9a-f]{32})-([0-9a-f]{16})-01$`).FindStringSubmatch(req.Headers["traceparent"])
		if g == nil || g[1] != span.TraceID || g[2] == span.SpanID {
			t.Fatalf("the sink's traceparent %q is not a child of %s", req.Headers["traceparent"], span.SpanID)
		}
		// the caller's traceparent wins; a malformed one is refused, naming the format
		own := "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
		inTx(ctx, true, func(tx *sql.Tx) {
			id = enqueue(WithTraceContext(ctx, span), tx, OutboxMessage{Topic: "enq.go.traced", Payload: 1,
				Headers: map[string]string{"TraceParent": own}})[0]
			_, err := ob.Enqueue(ctx, tx, OutboxMessage{Topic: "enq.go.traced", Payload: 1, Headers: map[string]string{"traceparent": "00-xyz-01"}})
			if err == nil || !strings.Contains(err.Error(), `the traceparent header "00-xyz-01" is malformed: a traceparent is 00-<trace-id: 32 hex>-<parent-id: 16 hex>-<flags: 2 hex>`) {
				t.Fatalf("a malformed traceparent: %v", err)
			}
		})
		if hs := row(id).headers; !strings.Contains(hs, own) || strings.Contains(hs, span.SpanID) {
			t.Fatalf("the caller's traceparent is not the one kept: %s", hs)
		}
		// no traceparent of the caller's: its tracestate (any letter case) gives way to the span's
		inTx(ctx, true, func(tx *sql.Tx) {
			id = enqueue(WithTraceContext(ctx, span), tx, OutboxMessage{Topic: "enq.go.traced", Payload: 1,
				Headers: map[string]string{"TraceState": "caller=1", "x-other": "kept"}})[0]
		})
		h = nil
		if err := json.Unmarshal([]byte(row(id).headers), &h); err != nil {
			t.Fatal(err)
		}
		if want := "00-" + span.TraceID + "-" + span.SpanID + "-01"; len(h) != 3 || h["traceparent"] != want ||
			h["tracestate"] != "congo=t61" || h["x-other"] != "kept" {
			t.Fatalf("a caller's TraceState without a traceparent: headers %v, want the span's traceparent and tracestate only", h)
		}
		inTx(ctx, true, func(tx *sql.Tx) { id = enqueue(ctx, tx, OutboxMessage{Topic: "enq.go.traced", Payload: 1})[0] })
		if hs := strings.ReplaceAll(row(id).headers, " ", ""); hs != "{}" {
			t.Fatalf("no span: headers %s, want none", hs)
		}
	})

	t.Run("batch", func(t *testing.T) {
		out0 := count("queuebox.outbox")
		msgs := make([]OutboxMessage, 5)
		for i := range msgs {
			msgs[i] = OutboxMessage{Topic: "enq.go.batch", Key: "k-batch", Payload: map[string]int{"n": i + 1}}
		}
		var ids []int64
		inTx(ctx, true, func(tx *sql.Tx) { ids = enqueue(ctx, tx, msgs...) })
		if len(ids) != 5 || count("queuebox.outbox") != out0+5 {
			t.Fatalf("ids %v, %d rows added", ids, count("queuebox.outbox")-out0)
		}
		mids := map[string]bool{}
		for _, id := range ids {
			mids[sent(id).mid] = true
		}
		var order []string // the payloads' n in the sink's log order
		for _, r := range sinkRequests(t, log, "") {
			if mids[r.Headers["x-message-id"]] {
				order = append(order, regexp.MustCompile(`"n":\s*(\d+)`).FindStringSubmatch(r.Body)[1])
			}
		}
		if strings.Join(order, ",") != "1,2,3,4,5" {
			t.Fatalf("the sink got the batch in the order %v", order)
		}
		// a bad message refuses the whole batch: nothing written
		inTx(ctx, true, func(tx *sql.Tx) {
			if _, err := ob.Enqueue(ctx, tx, OutboxMessage{Topic: "enq.go.batch", Payload: 1}, OutboxMessage{Payload: 2}); err == nil ||
				!strings.Contains(err.Error(), "message 1: Topic is empty") {
				t.Fatalf("an empty topic: %v", err)
			}
		})
		if count("queuebox.outbox") != out0+5 {
			t.Fatal("a refused batch wrote rows")
		}
		if ob.o.Dialect != SQLServer {
			return
		}
		// SQL Server's [key] is NVARCHAR(400): a longer one refuses the batch before
		// anything is sent, the transaction still usable
		inTx(ctx, true, func(tx *sql.Tx) {
			_, err := ob.Enqueue(ctx, tx, OutboxMessage{Topic: "enq.go.batch", Payload: 1},
				OutboxMessage{Topic: "enq.go.batch", Key: strings.Repeat("k", 401), Payload: 2})
			if err == nil || !strings.Contains(err.Error(), "message 1: Key is 401 characters, SQL Server takes at most 400") {
				t.Fatalf("a 401-character key: %v", err)
			}
			var n int
			if err := tx.QueryRowContext(ctx, "SELECT COUNT(*) FROM queuebox.outbox").Scan(&n); err != nil || n != out0+5 {
				t.Fatalf("in the transaction after the refusal: %d rows, %v; want %d", n, err, out0+5)
			}
		})
		if count("queuebox.outbox") != out0+5 {
			t.Fatal("a refused batch wrote rows")
		}
	})

	t.Run("delayed", func(t *testing.T) {
		at := time.Now().Add(time.Hour).UTC()
		var ids []int64
		inTx(ctx, true, func(tx *sql.Tx) {
			ids = enqueue(ctx, tx, OutboxMessage{Topic: "enq.go.delayed", Payload: "later", ScheduledAt: at},
				OutboxMessage{Topic: "enq.go.delayed", Payload: "now"})
		})
		sent(ids[1]) // written after it and delivered: the outbox has passed the delayed row
		r := row(ids[0])
		if r.state != "pending" || r.attempt != 0 {
			t.Fatalf("the delayed row is %s after %d attempts", r.state, r.attempt)
		}
		// compared as instants, to the millisecond the text holds: Babelfish's
		// style 126 puts a space where SQL Server puts the T and drops a
		// fraction's trailing zeros (.52 for .520)
		got, err := time.Parse("2006-01-02T15:04:05.999999999", strings.Replace(r.at, " ", "T", 1))
		if d := got.Sub(at); err != nil || d <= -time.Millisecond || d >= time.Millisecond {
			t.Fatalf("scheduled_at %s, want %s (%v)", r.at, at.Format(time.RFC3339Nano), err)
		}
		if n := len(sinkRequests(t, log, r.mid)); n != 0 {
			t.Fatalf("the sink saw the delayed row %d times", n)
		}
		if _, err := b.db.ExecContext(ctx, b.due, ids[0]); err != nil {
			t.Fatal(err)
		}
		sent(ids[0])
	})
}

type sinkRequest struct {
	Headers map[string]string `json:"headers"`
	Body    string            `json:"body"`
}

// sinkRequests: the sink's requests for a message id ("" all), in log order
func sinkRequests(t *testing.T, log, mid string) []sinkRequest {
	f, err := os.Open(log)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []sinkRequest
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 4<<20)
	for sc.Scan() {
		var r sinkRequest
		if json.Unmarshal(sc.Bytes(), &r) == nil && (mid == "" || r.Headers["x-message-id"] == mid) {
			out = append(out, r)
		}
	}
	return out
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}
