package queuebox

import (
	"encoding/json"
	"fmt"
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
