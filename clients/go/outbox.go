package queuebox

// The outbox side: enqueue messages in the application's own *sql.Tx
// (docs/enqueue.md).
//
// Wording:
//   - an OutboxMessage is one row of queuebox.outbox; its Payload is
//     encoded with encoding/json (a json.RawMessage goes as it is);
//   - the transaction is the caller's: Enqueue never commits or rolls it
//     back, so the rows commit and roll back with the business writes;
//   - the trace rule: a message whose Headers carry no traceparent (any
//     letter case) gets the context's, from Outbox.TraceContext (default:
//     what WithTraceContext put on the context), as
//     00-<trace-id>-<span-id>-<flags> and its tracestate; a traceparent the
//     caller set is kept, and refused when it is malformed.
//
// A batch is one round trip: on PostgreSQL one statement with one
// parameter, a JSON array read by jsonb_array_elements, whatever its size;
// on SQL Server one batch of single-row INSERTs per 300 messages.  The ids
// follow the order given, so the rows of one key are delivered in it.

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"
	"unicode/utf16"
)

// OutboxMessage is one message to deliver.
type OutboxMessage struct {
	// Topic is routed by the configuration's routes; a topic no route
	// matches goes dead at its claim (docs/enqueue.md).
	Topic string
	// Key orders delivery: rows of one key go one at a time, in id order.
	// "" is none (NULL).
	Key string
	// Payload is encoded with encoding/json.
	Payload interface{}
	// Headers are sent with the delivery; a traceparent here wins over the
	// context's.
	Headers map[string]string
	// ScheduledAt: not delivered before it (zero: now).
	ScheduledAt time.Time
	// MaxAttempts: delivery attempts before the row goes dead (0: the
	// configuration's outbox.maxAttempts).
	MaxAttempts int
}

// OutboxOptions configure an Outbox; the zero value takes the defaults.
type OutboxOptions struct {
	// Dialect is PostgreSQL or SQLServer (default: from the driver).
	Dialect Dialect
	// TraceContext gives the current span of ctx, the parent of the
	// deliveries (default: TraceContextFrom).  With OpenTelemetry:
	// trace.SpanContextFromContext(ctx) turned into a TraceContext.  The
	// library needs no tracing package.
	TraceContext func(ctx context.Context) (TraceContext, bool)
}

// Outbox writes messages into queuebox.outbox in a caller's transaction.
type Outbox struct {
	db    *sql.DB
	o     OutboxOptions
	mu    sync.Mutex
	known bool // a probe succeeded: atP holds
	atP   bool
}

// NewOutbox makes an Outbox for the transactions of db.
func NewOutbox(db *sql.DB, o OutboxOptions) (*Outbox, error) {
	if db == nil {
		return nil, fmt.Errorf("queuebox: NewOutbox: db is nil")
	}
	if o.Dialect == DetectDialect {
		d, err := detectDialect(db.Driver())
		if err != nil {
			return nil, err
		}
		o.Dialect = d
	}
	if o.TraceContext == nil {
		o.TraceContext = TraceContextFrom
	}
	return &Outbox{db: db, o: o}, nil
}

type traceKey struct{}

// WithTraceContext returns a context whose current span is tc: what the
// default OutboxOptions.TraceContext reads.
func WithTraceContext(ctx context.Context, tc TraceContext) context.Context {
	return context.WithValue(ctx, traceKey{}, tc)
}

// TraceContextFrom returns what WithTraceContext put on ctx.
func TraceContextFrom(ctx context.Context) (TraceContext, bool) {
	tc, ok := ctx.Value(traceKey{}).(TraceContext)
	return tc, ok
}

// TraceparentFormat is what a traceparent must look like.
const TraceparentFormat = "00-<trace-id: 32 hex>-<parent-id: 16 hex>-<flags: 2 hex>, in small letters, the ids not all zeros"

// validTraceparent: one the W3C spec lets a receiver use
func validTraceparent(tp string) bool {
	_, ok := (Message{Headers: map[string]string{"traceparent": tp}}).TraceContext()
	return ok
}

// outboxRow: one message as the statement reads it
type outboxRow struct {
	Topic       string            `json:"topic"`
	Key         *string           `json:"key"`
	Payload     string            `json:"payload"`
	Headers     map[string]string `json:"headers"`
	ScheduledAt *string           `json:"scheduledAt"`
	MaxAttempts *int              `json:"maxAttempts"`
}

func (o *Outbox) row(i int, m OutboxMessage, trace map[string]string, utcSuffix string) (outboxRow, error) {
	where := fmt.Sprintf("queuebox: Enqueue: message %d", i)
	if m.Topic == "" {
		return outboxRow{}, fmt.Errorf("%s: Topic is empty", where)
	}
	if m.MaxAttempts < 0 {
		return outboxRow{}, fmt.Errorf("%s: MaxAttempts is %d, must be 0 (the configuration's) or more", where, m.MaxAttempts)
	}
	payload, err := json.Marshal(m.Payload)
	if err != nil {
		return outboxRow{}, fmt.Errorf("%s: the payload: %w", where, err)
	}
	r := outboxRow{Topic: m.Topic, Payload: string(payload), Headers: map[string]string{}}
	own := false
	for k, v := range m.Headers {
		r.Headers[k] = v
		if strings.EqualFold(k, "traceparent") {
			if !validTraceparent(v) {
				return outboxRow{}, fmt.Errorf("%s: the traceparent header %q is malformed: a traceparent is %s", where, v, TraceparentFormat)
			}
			own = true
		}
	}
	if !own && trace != nil {
		// the context's tracestate goes with its traceparent: a caller's
		// tracestate (any letter case) without a traceparent is dropped
		for k := range r.Headers {
			if strings.EqualFold(k, "tracestate") {
				delete(r.Headers, k)
			}
		}
		for k, v := range trace {
			r.Headers[k] = v
		}
	}
	if m.Key != "" {
		k := m.Key
		r.Key = &k
	}
	if !m.ScheduledAt.IsZero() {
		at := m.ScheduledAt.UTC().Format("2006-01-02T15:04:05.000000") + utcSuffix
		r.ScheduledAt = &at
	}
	if m.MaxAttempts > 0 {
		n := m.MaxAttempts
		r.MaxAttempts = &n
	}
	return r, nil
}

const pgEnqueue = "INSERT INTO queuebox.outbox (topic, key, payload, headers, scheduled_at, max_attempts)" +
	" SELECT m->>'topic', m->>'key', (m->>'payload')::jsonb, m->'headers'," +
	" coalesce((m->>'scheduledAt')::timestamptz, now()), (m->>'maxAttempts')::int" +
	" FROM jsonb_array_elements($1::jsonb) WITH ORDINALITY AS r(m, n) ORDER BY n RETURNING id"

// SQL Server: one single-row INSERT per message, in one batch (one round
// trip per mssqlPerBatch messages: 6 parameters each, under SQL Server's
// 2100), so the ids follow the statements' order.  Not OPENJSON: Babelfish
// reads its strings still escaped and cuts them at 4000 characters; not
// INSERT ... SELECT ... ORDER BY with OUTPUT INTO: Babelfish refuses the
// pair.  OUTPUT INTO a table variable: OUTPUT without INTO is refused on a
// table with a trigger.
const mssqlPerBatch = 300

// topic and [key] are NVARCHAR(400) on SQL Server, counted in UTF-16 units
const mssqlTextMax = 400

// mssqlCheck refuses what SQL Server's columns cannot take, before sending
func mssqlCheck(i int, m OutboxMessage) error {
	for _, f := range []struct{ name, v string }{{"Topic", m.Topic}, {"Key", m.Key}} {
		if n := len(utf16.Encode([]rune(f.v))); n > mssqlTextMax {
			return fmt.Errorf("queuebox: Enqueue: message %d: %s is %d characters, SQL Server takes at most %d", i, f.name, n, mssqlTextMax)
		}
	}
	return nil
}

func mssqlBatch(rows []outboxRow, native bool) (string, []interface{}, error) {
	var b strings.Builder
	args := make([]interface{}, 0, 6*len(rows))
	// (no SET XACT_ABORT: it would outlive the call on the caller's
	// connection and change how its later statements fail; a failed call is
	// rolled back by the caller, README)
	b.WriteString("SET NOCOUNT ON;\nDECLARE @ids TABLE (id BIGINT NOT NULL);\n")
	for _, r := range rows {
		headers, err := json.Marshal(r.Headers)
		if err != nil {
			return "", nil, err
		}
		var key, at, attempts interface{}
		if r.Key != nil {
			key = *r.Key
		}
		if r.ScheduledAt != nil {
			at = *r.ScheduledAt
		}
		if r.MaxAttempts != nil {
			attempts = int64(*r.MaxAttempts)
		}
		n := len(args)
		args = append(args, r.Topic, key, r.Payload, string(headers), at, attempts)
		fmt.Fprintf(&b, "INSERT INTO queuebox.outbox (topic, [key], payload, headers, scheduled_at, max_attempts) OUTPUT inserted.id INTO @ids"+
			" VALUES (@p%d, @p%d, @p%d, @p%d, ISNULL(CAST(@p%d AS DATETIME2(6)), SYSUTCDATETIME()), @p%d);\n", n+1, n+2, n+3, n+4, n+5, n+6)
	}
	b.WriteString("SELECT id FROM @ids ORDER BY id;")
	if !native {
		return ordinal.ReplaceAllString(b.String(), "?"), args, nil
	}
	return b.String(), args, nil
}

// native: on SQL Server, whether the driver binds @p1 (driver name
// "sqlserver") or ? ("mssql").  Probed on tx itself (a second connection of
// the pool could wait for one the caller holds, under the caller's
// deadline), @p1 first: the "mssql" driver refuses it before sending, so
// the probe never fails in the caller's transaction.  Only a success is
// kept: a failed probe (a cancelled ctx, say) is tried again next call.
// (sql.Named binds @p1 on "sqlserver" only: "mssql" counts just ?, $n and
// :name in the text and refuses the arguments.)
func (o *Outbox) native(ctx context.Context, tx *sql.Tx) (bool, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.known {
		return o.atP, nil
	}
	var one int
	err := tx.QueryRowContext(ctx, "SELECT CAST(@p1 AS INT)", 1).Scan(&one)
	atP := err == nil
	if err != nil {
		err = tx.QueryRowContext(ctx, "SELECT CAST(? AS INT)", 1).Scan(&one)
	}
	if err != nil {
		return false, fmt.Errorf("queuebox: Enqueue: cannot tell how the driver binds parameters: %w", err)
	}
	o.known, o.atP = true, atP
	return atP, nil
}

// Enqueue writes msgs into queuebox.outbox in tx, in one round trip (on
// SQL Server one per 300 messages), and returns their ids in the order
// given.
func (o *Outbox) Enqueue(ctx context.Context, tx *sql.Tx, msgs ...OutboxMessage) ([]int64, error) {
	if len(msgs) == 0 {
		return nil, nil
	}
	var trace map[string]string
	if tc, ok := o.o.TraceContext(ctx); ok {
		trace = map[string]string{"traceparent": fmt.Sprintf("00-%s-%s-%02x", tc.TraceID, tc.SpanID, tc.TraceFlags)}
		if !validTraceparent(trace["traceparent"]) {
			return nil, fmt.Errorf("queuebox: Enqueue: the context's trace gives the traceparent %q, which is malformed: a traceparent is %s",
				trace["traceparent"], TraceparentFormat)
		}
		if tc.TraceState != "" {
			trace["tracestate"] = tc.TraceState
		}
	}
	suffix := "Z" // SQL Server's DATETIME2 has no zone: UTC, as SYSUTCDATETIME()
	if o.o.Dialect == SQLServer {
		suffix = ""
	}
	rows := make([]outboxRow, len(msgs))
	for i, m := range msgs {
		r, err := o.row(i, m, trace, suffix)
		if err == nil && o.o.Dialect == SQLServer {
			err = mssqlCheck(i, m)
		}
		if err != nil {
			return nil, err
		}
		rows[i] = r
	}
	if o.o.Dialect == PostgreSQL {
		doc, err := json.Marshal(rows)
		if err != nil {
			return nil, fmt.Errorf("queuebox: Enqueue: %w", err)
		}
		return o.query(ctx, tx, pgEnqueue, string(doc))
	}
	native, err := o.native(ctx, tx)
	if err != nil {
		return nil, err
	}
	var ids []int64
	for start := 0; start < len(rows); start += mssqlPerBatch {
		end := start + mssqlPerBatch
		if end > len(rows) {
			end = len(rows)
		}
		stmt, args, err := mssqlBatch(rows[start:end], native)
		if err != nil {
			return nil, fmt.Errorf("queuebox: Enqueue: %w", err)
		}
		got, err := o.query(ctx, tx, stmt, args...)
		if err != nil {
			return nil, err
		}
		ids = append(ids, got...)
	}
	return ids, nil
}

// query runs an enqueue statement; the ids it returns, in ascending order
func (o *Outbox) query(ctx context.Context, tx *sql.Tx, stmt string, args ...interface{}) ([]int64, error) {
	res, err := tx.QueryContext(ctx, stmt, args...)
	if err != nil {
		return nil, fmt.Errorf("queuebox: Enqueue: %w", err)
	}
	defer res.Close()
	var ids []int64
	for res.Next() {
		var id int64
		if err := res.Scan(&id); err != nil {
			return nil, fmt.Errorf("queuebox: Enqueue: %w", err)
		}
		ids = append(ids, id)
	}
	if err := res.Err(); err != nil {
		return nil, fmt.Errorf("queuebox: Enqueue: %w", err)
	}
	sort.Slice(ids, func(a, b int) bool { return ids[a] < ids[b] })
	return ids, nil
}
