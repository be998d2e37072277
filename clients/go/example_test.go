package queuebox_test

// The examples of the spec's "Consume the inbox" page (and README.md),
// made to compile: go vet and go test build them.  They need a database,
// so they have no Output comment and are not run.

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	queuebox "github.com/alternayte/queuebox/clients/go"
	_ "github.com/lib/pq"
)

func openDB() *sql.DB {
	db, err := sql.Open("postgres", os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	return db
}

// Run a pull worker: the handler writes through tx; the worker completes
// the message in that transaction.
func ExampleNewInboxWorker() {
	db := openDB()
	worker, err := queuebox.NewInboxWorker(db, queuebox.Options{
		Source:    "orders",
		BatchSize: 10,
		LeaseMS:   30_000,
	})
	if err != nil {
		log.Fatal(err)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	err = worker.Run(ctx, func(ctx context.Context, message queuebox.Message, tx *sql.Tx) error {
		var order struct {
			ID    string `json:"id"`
			Total int    `json:"total"`
		}
		if err := message.UnmarshalPayload(&order); err != nil {
			return err
		}

		_, err := tx.ExecContext(ctx, "INSERT INTO orders (id, total) VALUES ($1, $2)", order.ID, order.Total)
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
}

// Decide what a failure does: a payload that does not parse goes straight
// to dead, the rest backs off.
func ExampleRetryPolicyFunc() {
	db := openDB()
	policy := queuebox.RetryPolicyFunc(func(message queuebox.Message, failure error) queuebox.FailureAction {
		var syntax *json.SyntaxError
		if errors.As(failure, &syntax) {
			return queuebox.DeadLetter()
		}
		if message.Attempt >= 5 {
			return queuebox.DeadLetter()
		}
		return queuebox.RetryAfter(time.Duration(1<<message.Attempt) * time.Second)
	})

	worker, err := queuebox.NewInboxWorker(db, queuebox.Options{Source: "orders", RetryPolicy: policy})
	if err != nil {
		log.Fatal(err)
	}
	_ = worker
}

// Raise the concurrency: four handlers at once, never two messages of one
// aggregate; a logger and the counters.
func ExampleOptions_maxConcurrency() {
	db := openDB()
	db.SetMaxOpenConns(8) // at least MaxConcurrency + 2
	worker, err := queuebox.NewInboxWorker(db, queuebox.Options{
		Source:         "orders",
		MaxConcurrency: 4,
		ShutdownGrace:  10 * time.Second,
		Logger: queuebox.LoggerFunc(func(level queuebox.Level, message string) {
			if level >= queuebox.LevelWarn {
				log.Printf("inbox %s: %s", level, message)
			}
		}),
	})
	if err != nil {
		log.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	if err := worker.Run(ctx, func(ctx context.Context, m queuebox.Message, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, "INSERT INTO orders_seen (source, idempotency_key) VALUES ($1, $2)"+
			" ON CONFLICT DO NOTHING", m.Source, m.IdempotencyKey)
		return err
	}); err != nil {
		log.Fatal(err)
	}
	c := worker.Counters()
	log.Printf("claimed %d completed %d retried %d dead %d lease lost %d",
		c.Claimed, c.Completed, c.Retried, c.Dead, c.LeaseLost)
}

// On SQL Server: go-mssqldb's "sqlserver" driver (the database as a
// parameter of its URL), the SQL Server dialect (found from the driver, or
// named), @p1 parameters in the handler's own statements.
func ExampleSQLServer() {
	// import _ "github.com/denisenkom/go-mssqldb" (or github.com/microsoft/go-mssqldb)
	db, err := sql.Open("sqlserver", "sqlserver://app:secret@db:1433?database=app")
	if err != nil {
		log.Fatal(err)
	}
	worker, err := queuebox.NewInboxWorker(db, queuebox.Options{
		Source:           "orders",
		Dialect:          queuebox.SQLServer,
		StatementTimeout: 60 * time.Second, // the default; less than 30 s is refused
	})
	if err != nil {
		log.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	err = worker.Run(ctx, func(ctx context.Context, m queuebox.Message, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, "INSERT INTO dbo.orders_seen (source, idempotency_key) VALUES (@p1, @p2)",
			m.Source, m.IdempotencyKey)
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
}
