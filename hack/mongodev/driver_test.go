package main

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"testing"
	"time"
)

// TestCancelledQueriesLeaveConnectionsUsable cuts SQLite queries by their contexts at every
// point of their run, on a pool set up as FerretDB sets up its own (WAL, a busy timeout, up to
// 100 connections), and then writes from two of the pool's connections: every write must
// succeed. A connection that a cut query left with an unreset statement (an open read
// transaction on an old snapshot, or a pending interrupt) answers every write with
// "database is locked (517)" or "interrupted (9)", for good.
//
// modernc.org/sqlite v1.32.0 failed this within a few dozen queries ("interrupted (9)" on
// nearly every later write); later versions close the statement of a cut query, discard an
// interrupted connection (driver.Validator) and roll back a transaction whose commit failed.
// The proxy keeps FerretDB's deadlines away from SQLite as well (awaitdata.go, fixups.go).
func TestCancelledQueriesLeaveConnectionsUsable(t *testing.T) {
	u := &url.URL{Scheme: "file", Path: t.TempDir() + "/t.sqlite",
		RawQuery: "_pragma=busy_timeout(10000)&_pragma=journal_mode(wal)&" + sqlitePragmas}
	db, err := sql.Open("sqlite", u.String())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = db.Close() }()
	db.SetMaxOpenConns(100)
	db.SetMaxIdleConns(100)
	if _, err := db.Exec(`CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)`); err != nil {
		t.Fatal(err)
	}
	for i := range 2000 {
		if _, err := db.Exec(`INSERT INTO t (v) VALUES (?)`, fmt.Sprint("value", i)); err != nil {
			t.Fatal(err)
		}
	}

	ctx := context.Background()
	failed := 0
	for i := range 2000 {
		// Deadlines from 0 to 200 µs end the query before, during and after its first step.
		qctx, cancel := context.WithTimeout(ctx, time.Duration(i%200)*time.Microsecond)
		if rows, err := db.QueryContext(qctx, `SELECT v FROM t ORDER BY v DESC`); err == nil {
			for rows.Next() {
			}
			_ = rows.Close()
		}
		cancel()

		// Two connections of the pool (the one just used first): one commits, then the
		// other writes after that commit.
		c1, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		c2, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range []*sql.Conn{c1, c2} {
			if _, err := c.ExecContext(ctx, `UPDATE t SET v = v WHERE id = 1`); err != nil {
				if failed++; failed <= 3 {
					t.Errorf("query %d: a write after it: %v", i, err)
				}
			}
		}
		_ = c1.Close()
		_ = c2.Close()
	}
	if failed > 0 {
		t.Errorf("%d writes failed in all", failed)
	}
}
