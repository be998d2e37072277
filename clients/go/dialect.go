package queuebox

import (
	"database/sql/driver"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// Dialect is the database a worker talks to: the five statements of
// examples/pull/sql/postgresql or of examples/pull/sql/sqlserver.
type Dialect int

const (
	// DetectDialect (the zero value) takes the dialect from the driver of
	// the *sql.DB: lib/pq and pgx are PostgreSQL, go-mssqldb is SQL Server.
	DetectDialect Dialect = iota
	// PostgreSQL: the extension's functions, with $1 parameters.
	PostgreSQL
	// SQLServer: the T-SQL procedures of queuebox-mssqld's schema, with
	// go-mssqldb's @p1 parameters (driver name "sqlserver"), or ? under
	// its older name "mssql": Run finds out which.
	SQLServer
)

func (d Dialect) String() string {
	switch d {
	case DetectDialect:
		return "DetectDialect"
	case PostgreSQL:
		return "PostgreSQL"
	case SQLServer:
		return "SQLServer"
	}
	return fmt.Sprintf("Dialect(%d)", int(d))
}

// detectDialect tells the dialect from the driver's type.
func detectDialect(drv driver.Driver) (Dialect, error) {
	t := fmt.Sprintf("%T", drv)
	switch {
	case strings.HasPrefix(t, "*pq."), t == "*stdlib.Driver":
		return PostgreSQL, nil
	case strings.HasPrefix(t, "*mssql."):
		return SQLServer, nil
	}
	return DetectDialect, fmt.Errorf("queuebox: cannot tell the dialect from the driver %s: set Options.Dialect to queuebox.PostgreSQL or queuebox.SQLServer", t)
}

// statements: the five statements as one dialect sends them, and how it
// reads a claim token.
type statements struct {
	claim, renew, complete, retry, dead string
	// token turns the claim_token column, as the driver gives it, into the
	// text the other four bind
	token func(raw []byte) (string, error)
}

var postgresStatements = statements{
	claim: "SELECT id, claim_token, source, idempotency_key, event_type, aggregate_id," +
		" payload, headers, attempt, created_at FROM queuebox.inbox_claim($1, $2, $3)",
	renew:    "SELECT queuebox.inbox_renew($1, $2, $3)",
	complete: "SELECT queuebox.inbox_complete($1, $2)",
	retry:    "SELECT queuebox.inbox_retry($1, $2, $3, $4)",
	dead:     "SELECT queuebox.inbox_dead($1, $2, $3)",
	token:    func(raw []byte) (string, error) { return uuidText(raw, false) },
}

// sqlServerStatements: native (go-mssqldb's "sqlserver" driver name binds
// @p1, @p2, ...) or with ? (its "mssql" name rewrites ? and $1 itself)
func sqlServerStatements(native bool) statements {
	st := statements{
		claim:    "EXEC queuebox.inbox_claim @source = @p1, @batch_size = @p2, @lease_ms = @p3",
		renew:    "EXEC queuebox.inbox_renew @id = @p1, @claim_token = @p2, @lease_ms = @p3",
		complete: "EXEC queuebox.inbox_complete @id = @p1, @claim_token = @p2",
		retry:    "EXEC queuebox.inbox_retry @id = @p1, @claim_token = @p2, @delay_ms = @p3, @error = @p4",
		dead:     "EXEC queuebox.inbox_dead @id = @p1, @claim_token = @p2, @error = @p3",
		token:    func(raw []byte) (string, error) { return uuidText(raw, true) },
	}
	if !native {
		for _, s := range []*string{&st.claim, &st.renew, &st.complete, &st.retry, &st.dead} {
			*s = ordinal.ReplaceAllString(*s, "?")
		}
	}
	return st
}

var ordinal = regexp.MustCompile(`@p[0-9]+`)

// uuidText: a claim token as text.  A driver gives it as text (lib/pq) or
// as 16 bytes: in network order from PostgreSQL, in SQL Server's order
// (the first three groups little-endian) from go-mssqldb.
func uuidText(raw []byte, mixedEndian bool) (string, error) {
	switch len(raw) {
	case 36:
		return string(raw), nil
	case 16:
		b := append([]byte(nil), raw...)
		if mixedEndian {
			b[0], b[1], b[2], b[3] = b[3], b[2], b[1], b[0]
			b[4], b[5] = b[5], b[4]
			b[6], b[7] = b[7], b[6]
		}
		h := hex.EncodeToString(b)
		return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:], nil
	}
	return "", fmt.Errorf("queuebox: the claim token %q is neither 16 bytes nor 36 characters", raw)
}

// claimLockTimeout: Msg 51000 from the SQL Server claim (another claim of
// the source held its application lock for 10 s), a temporary failure
func claimLockTimeout(err error) bool {
	if err == nil {
		return false
	}
	var numbered interface{ SQLErrorNumber() int32 }
	if errors.As(err, &numbered) {
		return numbered.SQLErrorNumber() == 51000
	}
	// a driver without error numbers: the procedure's own words
	return strings.Contains(err.Error(), "another claim of this source held its lock")
}
