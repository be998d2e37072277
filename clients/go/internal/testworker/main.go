// Command testworker is a worker process for TAP 034's process scenarios
// (two workers on one source, kill -9 mid-handler), as
// clients/c/test/qbi_test_worker.c is for TAP 032: it runs the Go library
// on a source until SIGTERM, its handler idempotent as the spec says (the
// effect keyed by source and idempotency key, so a message run twice
// applies once).
//
//	testworker NAME LEASE_MS HANDLER_MS [BATCH [SOURCE]]
//
// The database: QBI_TEST_PGHOST, QBI_TEST_PGPORT; QBI_TEST_PGDATABASE and
// QBI_TEST_PGUSER default to postgres.  HANDLER_MS -1: a no-op handler
// (bench/pull measures the library's own cost with it).
package main

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	queuebox "github.com/alternayte/queuebox/clients/go"
	_ "github.com/lib/pq"
)

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func number(arg, what string) int {
	n, err := strconv.Atoi(arg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "testworker: %s is not a number: %q\n", what, arg)
		os.Exit(2)
	}
	return n
}

func main() {
	args := os.Args[1:]
	if len(args) < 3 || len(args) > 5 {
		fmt.Fprintln(os.Stderr, "usage: testworker NAME LEASE_MS HANDLER_MS [BATCH [SOURCE]]")
		os.Exit(2)
	}
	name := args[0]
	lease := number(args[1], "LEASE_MS")
	handlerMS := number(args[2], "HANDLER_MS")
	batch, source := 5, "jobs"
	if len(args) > 3 {
		batch = number(args[3], "BATCH")
	}
	if len(args) > 4 {
		source = args[4]
	}
	dsn := fmt.Sprintf("host=%s port=%s dbname=%s user=%s sslmode=disable",
		env("QBI_TEST_PGHOST", "/tmp"), env("QBI_TEST_PGPORT", "5432"),
		env("QBI_TEST_PGDATABASE", "postgres"), env("QBI_TEST_PGUSER", "postgres"))
	db, err := sql.Open("postgres", dsn)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	defer db.Close()
	db.SetMaxOpenConns(4)
	worker, err := queuebox.NewInboxWorker(db, queuebox.Options{
		Source: source, BatchSize: batch, LeaseMS: lease,
		PollInterval: 50 * time.Millisecond, ShutdownGrace: 5 * time.Second,
		// a worker that cannot claim says so (the library prints nothing by default)
		Logger: queuebox.LoggerFunc(func(level queuebox.Level, message string) {
			if level >= queuebox.LevelWarn {
				fmt.Fprintln(os.Stderr, message)
			}
		}),
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	fmt.Println("ready")
	err = worker.Run(ctx, func(ctx context.Context, m queuebox.Message, tx *sql.Tx) error {
		if handlerMS < 0 {
			return nil
		}
		// the effect first, then the slow part: a kill in between leaves it uncommitted
		if _, err := tx.ExecContext(ctx, "INSERT INTO effects (source, idempotency_key, worker) VALUES ($1, $2, $3)"+
			" ON CONFLICT (source, idempotency_key) DO NOTHING", m.Source, m.IdempotencyKey, name); err != nil {
			return err
		}
		select {
		case <-time.After(time.Duration(handlerMS) * time.Millisecond):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	c := worker.Counters()
	fmt.Printf("%s: claimed %d completed %d retried %d dead %d lease_lost %d\n",
		name, c.Claimed, c.Completed, c.Retried, c.Dead, c.LeaseLost)
}
