package queuebox

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Message is one claimed inbox message of a pull source.
type Message struct {
	// ID is the inbox row's id.
	ID int64
	// Source is the pull source the message arrived on.
	Source string
	// IdempotencyKey identifies the message within its source: make a
	// handler idempotent on (Source, IdempotencyKey).
	IdempotencyKey string
	// EventType is empty when the message has none.
	EventType string
	// AggregateID is the unit of order, empty when the message has none.
	AggregateID string
	// Payload is the message's JSON document.
	Payload json.RawMessage
	// Headers are the received headers (a value that is not a JSON
	// string is kept as its JSON text).
	Headers map[string]string
	// Attempt counts the attempts made before this one (0 the first time).
	Attempt int
	// CreatedAt is when the message was stored.
	CreatedAt time.Time

	claimToken string
}

// TraceContext is the W3C trace context a message arrived with: its
// traceparent and tracestate headers (docs/observability.md).
type TraceContext struct {
	TraceID    string // 32 lower-case hex digits
	SpanID     string // the sender's span: 16 lower-case hex digits
	TraceFlags byte
	TraceState string
}

var traceparentRe = regexp.MustCompile(`^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$`)

// TraceContext returns the trace context the message arrived with (its
// traceparent header in any letter case), or false when it has none or the
// spec says to ignore it.  Start the handler's span as its child, e.g. with
// OpenTelemetry in Options.StartSpan.
func (m Message) TraceContext() (TraceContext, bool) {
	var tp, ts string
	for k, v := range m.Headers {
		switch strings.ToLower(k) {
		case "traceparent":
			tp = v
		case "tracestate":
			ts = v
		}
	}
	g := traceparentRe.FindStringSubmatch(tp)
	if g == nil || g[1] == "ff" || (g[1] == "00" && g[5] != "") ||
		strings.Trim(g[2], "0") == "" || strings.Trim(g[3], "0") == "" {
		return TraceContext{}, false
	}
	flags, _ := strconv.ParseUint(g[4], 16, 8)
	return TraceContext{TraceID: g[2], SpanID: g[3], TraceFlags: byte(flags), TraceState: ts}, true
}

// UnmarshalPayload decodes the payload into v, as json.Unmarshal does; its
// error (a *json.SyntaxError, a *json.UnmarshalTypeError) is returned
// unwrapped, so a retry policy can tell a payload that never parses.
func (m Message) UnmarshalPayload(v interface{}) error {
	return json.Unmarshal(m.Payload, v)
}

// parseHeaders reads the headers column, a JSON object.
func parseHeaders(raw []byte) (map[string]string, error) {
	out := map[string]string{}
	if len(raw) == 0 {
		return out, nil
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return nil, fmt.Errorf("headers: %w", err)
	}
	for k, v := range fields {
		var s string
		if json.Unmarshal(v, &s) == nil {
			out[k] = s
		} else {
			out[k] = string(v)
		}
	}
	return out, nil
}
