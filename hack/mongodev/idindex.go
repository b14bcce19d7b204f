package main

import (
	"database/sql"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"slices"
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
//
// Beside it, each table gets an index on every field of indexedFields, which the proxy reads
// itself to answer finds by those fields (findpush.go).
type idIndexer struct {
	dir    string
	logger *slog.Logger

	mu     sync.Mutex
	dbs    map[string]*sql.DB
	done   map[string]bool   // "db\x00collection" whose table has the indexes
	tables map[string]string // "db\x00collection" -> its SQLite table
}

func newIDIndexer(dir string, logger *slog.Logger) *idIndexer {
	return &idIndexer{dir: dir, logger: logger, dbs: map[string]*sql.DB{}, done: map[string]bool{}, tables: map[string]string{}}
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
		qs := []string{fmt.Sprintf(`CREATE INDEX IF NOT EXISTS %q ON %q (_ferretdb_sjson->'$._id')`, t.name+"_mongodev_id", t.name)}
		for _, f := range indexedFields {
			qs = append(qs,
				fmt.Sprintf(`CREATE INDEX IF NOT EXISTS %q ON %q (_ferretdb_sjson->>'$.%s')`, t.name+"_mongodev_"+f, t.name, f),
				fmt.Sprintf(`CREATE INDEX IF NOT EXISTS %q ON %q (json_type(_ferretdb_sjson, '$.%s'))`, t.name+"_mongodev_"+f+"_type", t.name, f))
		}
		for _, q := range qs {
			if _, err := conn.Exec(q); err != nil {
				return fmt.Errorf("%s: %w", t.coll, err)
			}
		}
		x.done[key] = true
		x.tables[key] = t.name
	}
	return nil
}

// idsWhere returns the _ids of the documents of db.coll whose top-level field (one of
// indexedFields) equals value, read through the field's index, and with them those whose field
// is an array that contains the value (MongoDB's equality matches those; the caller leaves
// them to the server). ok is false when the collection has no such index yet or the read fails.
// Call with the exchange lock held, so that the read sees every command answered before.
func (x *idIndexer) idsWhere(db, coll, field, value string, limit int) (ids []string, ok bool) {
	if x == nil || !slices.Contains(indexedFields, field) {
		return nil, false
	}
	key := db + "\x00" + coll
	if !x.known(db, coll) {
		if err := x.index(db); err != nil {
			return nil, false
		}
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	table, conn := x.tables[key], x.dbs[db]
	if table == "" || conn == nil {
		return nil, false
	}
	q := fmt.Sprintf(`SELECT _ferretdb_sjson->>'$._id' FROM %[1]q WHERE _ferretdb_sjson->>'$.%[2]s' = ?
		OR (json_type(_ferretdb_sjson, '$.%[2]s') = 'array' AND EXISTS (SELECT 1 FROM json_each(_ferretdb_sjson, '$.%[2]s') WHERE value = ?))
		LIMIT ?`, table, field)
	rows, err := conn.Query(q, value, value, limit+1)
	if err != nil {
		return nil, false
	}
	defer func() { _ = rows.Close() }()
	for rows.Next() {
		var id sql.NullString
		if err := rows.Scan(&id); err != nil || !id.Valid {
			return nil, false
		}
		ids = append(ids, id.String)
	}
	if rows.Err() != nil || len(ids) > limit {
		return nil, false
	}
	return ids, true
}

// forget drops what is known of db (a dropped collection may come back without the index).
func (x *idIndexer) forget(db string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for k := range x.done {
		if len(k) > len(db) && k[:len(db)] == db && k[len(db)] == 0 {
			delete(x.done, k)
			delete(x.tables, k)
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
