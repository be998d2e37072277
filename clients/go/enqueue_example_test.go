package queuebox_test

// docs/enqueue.md's Go example, word for word in payOrder (TAP 064 checks
// that the page's block is this function's body), run on PostgreSQL when
// TAP 064 gives a database and a sink (QBI_TEST_PGHOST, QBI_TEST_SINK_LOG).

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"testing"
	"time"

	queuebox "github.com/alternayte/queuebox/clients/go"
)

func payOrder(ctx context.Context, db *sql.DB, outbox *queuebox.Outbox) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()

	if _, err := tx.ExecContext(ctx, "UPDATE shop_orders SET status = 'paid' WHERE id = $1", 42); err != nil {
		return err
	}
	_, err = outbox.Enqueue(ctx, tx,
		queuebox.OutboxMessage{Topic: "orders.paid", Key: "order-42", Payload: map[string]int{"id": 42}},
		queuebox.OutboxMessage{Topic: "orders.reminder", Key: "order-42", Payload: map[string]int{"id": 42},
			ScheduledAt: time.Now().Add(24 * time.Hour)})
	if err != nil {
		return err
	}
	return tx.Commit()
}

func TestEnqueueDocsExample(t *testing.T) {
	host := os.Getenv("QBI_TEST_PGHOST")
	if host == "" || os.Getenv("QBI_TEST_SINK_LOG") == "" {
		t.Skip("QBI_TEST_PGHOST and QBI_TEST_SINK_LOG are not set (TAP 064 runs this test)")
	}
	db, err := sql.Open("postgres", fmt.Sprintf("host=%s port=%s dbname=postgres user=postgres sslmode=disable",
		host, os.Getenv("QBI_TEST_PGPORT")))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, "DROP TABLE IF EXISTS shop_orders; CREATE TABLE shop_orders (id int PRIMARY KEY, status text);"+
		" INSERT INTO shop_orders VALUES (42, 'new'); DELETE FROM queuebox.outbox WHERE key = 'order-42'"); err != nil {
		t.Fatal(err)
	}
	outbox, err := queuebox.NewOutbox(db, queuebox.OutboxOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := payOrder(ctx, db, outbox); err != nil {
		t.Fatal(err)
	}
	var status, topics string
	if err := db.QueryRowContext(ctx, "SELECT (SELECT status FROM shop_orders WHERE id = 42),"+
		" (SELECT string_agg(topic || ':' || (scheduled_at > now() + interval '23 hours')::text, ',' ORDER BY id)"+
		" FROM queuebox.outbox WHERE key = 'order-42')").Scan(&status, &topics); err != nil {
		t.Fatal(err)
	}
	if status != "paid" || topics != "orders.paid:false,orders.reminder:true" {
		t.Fatalf("the example wrote status %q and rows %q", status, topics)
	}
}
