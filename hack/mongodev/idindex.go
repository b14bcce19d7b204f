package main

import (
	"database/sql"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"sync"

	_ "modernc.org/sqlite" // the driver FerretDB's SQLite backend registers too
)

// idIndexer gives every collection table the SQLite index that FerretDB's own lookups by _id
// can use.
//
// FerretDB v1.24.2 creates the _id index on the expression _ferretdb_sjson->"_id", but its
// queries and writes by _id say WHERE _ferretdb_sjson->'$._id' = ? (metadata.IDColumn). SQLite
// uses an expression index only for the same expression, so every findOne, update, delete and
// findAndModify by _id scanned the whole table. An index on the expression the queries use
// makes them O(log n). FerretDB does not know of it (listIndexes reads FerretDB's metadata),
// and dropping the collection drops it with the table.
type idIndexer struct {
	dir    string
	logger *slog.Logger

	mu   sync.Mutex
	dbs  map[string]*sql.DB
	done map[string]bool // "db\x00collection" whose table has the index
}

func newIDIndexer(dir string, logger *slog.Logger) *idIndexer {
	return &idIndexer{dir: dir, logger: logger, dbs: map[string]*sql.DB{}, done: map[string]bool{}}
}

// afterCommand looks at a command the backend has just run: after one that may have created
// a collection, it indexes the collection's table; after a drop, it forgets it. Call with the
// exchange lock held, so that no other command runs meanwhile.
func (x *idIndexer) afterCommand(req []byte) {
	if x == nil {
		return
	}
	body := opMsgBody(req)
	if body == nil {
		if b, _, ok := sections(req); ok {
			body = b
		}
	}
	if body == nil {
		return
	}
	elems, err := body.Elements()
	if err != nil || len(elems) == 0 {
		return
	}
	db, _ := body.Lookup("$db").StringValueOK()
	coll, _ := elems[0].Value().StringValueOK()
	if db == "" {
		return
	}
	switch elems[0].Key() {
	case "insert", "update", "findAndModify", "findandmodify", "create", "createIndexes":
		if coll == "" || x.known(db, coll) {
			return
		}
		if err := x.index(db); err != nil {
			x.logger.Warn("indexing _id for FerretDB's lookups", "db", db, "err", err)
		}
	case "drop", "dropDatabase":
		x.forget(db)
	}
}

func (x *idIndexer) known(db, coll string) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.done[db+"\x00"+coll]
}

// index adds the index to every collection table of db that lacks it.
func (x *idIndexer) index(db string) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	conn, ok := x.dbs[db]
	if !ok {
		file := filepath.Join(x.dir, db+".sqlite")
		if _, err := os.Stat(file); err != nil {
			return nil // nothing created yet
		}
		u := &url.URL{Scheme: "file", Path: file, RawQuery: "_pragma=busy_timeout(10000)&" + sqlitePragmas}
		var err error
		if conn, err = sql.Open("sqlite", u.String()); err != nil {
			return err
		}
		conn.SetMaxOpenConns(1)
		x.dbs[db] = conn
	}
	rows, err := conn.Query(`SELECT name, table_name FROM "_ferretdb_collections"`)
	if err != nil {
		return err
	}
	type table struct{ coll, name string }
	var tables []table
	for rows.Next() {
		var t table
		if err := rows.Scan(&t.coll, &t.name); err != nil {
			_ = rows.Close()
			return err
		}
		tables = append(tables, t)
	}
	_ = rows.Close()
	for _, t := range tables {
		key := db + "\x00" + t.coll
		if x.done[key] {
			continue
		}
		q := fmt.Sprintf(`CREATE INDEX IF NOT EXISTS %q ON %q (_ferretdb_sjson->'$._id')`, t.name+"_mongodev_id", t.name)
		if _, err := conn.Exec(q); err != nil {
			return fmt.Errorf("%s: %w", t.coll, err)
		}
		x.done[key] = true
	}
	return nil
}

// forget drops what is known of db (a dropped collection may come back without the index).
func (x *idIndexer) forget(db string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for k := range x.done {
		if len(k) > len(db) && k[:len(db)] == db && k[len(db)] == 0 {
			delete(x.done, k)
		}
	}
	if conn, ok := x.dbs[db]; ok {
		_ = conn.Close()
		delete(x.dbs, db)
	}
}

// close releases the connections.
func (x *idIndexer) close() {
	if x == nil {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	for db, conn := range x.dbs {
		_ = conn.Close()
		delete(x.dbs, db)
	}
}
