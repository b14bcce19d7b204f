package main

import (
	"bufio"
	"encoding/binary"
	"io"
	"slices"
	"sync/atomic"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// Finds by an indexed field, answered through an index.
//
// FerretDB v1.24.2's SQLite backend reads every row of a collection for a find whose filter is
// anything but _id alone, and evaluates the filter in Go: a view of one tenant's ten holders
// costs a pass over all of them (1.4 s at 10 000 holders). The proxy keeps a SQLite index on
// each field of indexedFields (idIndexer) and answers a find with an equality on one of them
// itself:
//
//  1. read the _ids of the documents whose field has the value, through the index;
//  2. find each by _id alone (pushed down: one row each);
//  3. evaluate the whole filter on each document (plain comparisons of top-level fields),
//     sort, limit and project as asked, and answer with one batch and no cursor.
//
// Anything outside that narrow shape is forwarded unchanged, and so is a find whose
// documents hold a value the proxy does not compare, or that matches more than
// maxIndexedFind documents (a pass over the collection then costs about the same).

// indexedFields are the top-level fields the proxy indexes: the lease store's tenant, the
// condition of every per-tenant view, and a holder's public ID (a view of one holder).
var indexedFields = []string{"tenant", "pid"}

// indexedAnswers counts the finds answered through an index (for tests and the debug log).
var indexedAnswers atomic.Int64

// maxIndexedFind bounds the documents the proxy reads one by one for a find.
const maxIndexedFind = 1000

// maxIndexedReply bounds the documents of one answer in bytes (a message holds 48 MB; a
// larger result is the server's, with a cursor).
const maxIndexedReply = 8 << 20

// fieldFind is a find the proxy can answer through an index.
type fieldFind struct {
	db, coll string
	field    string   // the indexed field
	values   []string // its value, or the values of an $in of strings
	filter   bson.D   // the rest of the filter, each condition plain
	sortKey  string   // "" for none
	sortDir  int
	limit    int
	project  projection
}

// projection is a find's projection of top-level fields: the fields kept (include) or
// dropped, and whether _id is kept.
type projection struct {
	fields  []string
	include bool
	dropID  bool
	set     bool
}

// answerFieldFind answers req when it is such a find; handled is false otherwise (req is then
// to be forwarded as it is; nothing was written). Call with the exchange lock held.
func answerFieldFind(backend io.Writer, br *bufio.Reader, ids *idIndexer, req []byte) (resp []byte, handled bool, err error) {
	f, ok := parseFieldFind(req)
	if !ok {
		return nil, false, nil
	}
	var matchIDs []string
	for _, v := range f.values {
		some, ok := ids.idsWhere(f.db, f.coll, f.field, v, maxIndexedFind)
		if !ok {
			return nil, false, nil
		}
		for _, id := range some {
			if !slices.Contains(matchIDs, id) {
				matchIDs = append(matchIDs, id)
			}
		}
		if len(matchIDs) > maxIndexedFind {
			return nil, false, nil
		}
	}
	type found struct {
		doc bson.Raw
		key scalarValue
	}
	var docs []found
	for _, id := range matchIDs {
		doc, err := findByID(backend, br, req, f.db, f.coll, id)
		if err != nil {
			return nil, true, err
		}
		if doc == nil {
			return nil, false, nil // an _id that is no string: the server decides
		}
		m, decided := matchRest(doc, f.filter)
		if !decided {
			return nil, false, nil
		}
		if !m {
			continue
		}
		d := found{doc: doc}
		if f.sortKey != "" {
			v, err := doc.LookupErr(f.sortKey)
			if err != nil {
				return nil, false, nil // a missing sort key sorts as null: the server's rule
			}
			var x any
			if v.Unmarshal(&x) != nil {
				return nil, false, nil
			}
			if d.key, ok = scalar(x); !ok {
				return nil, false, nil
			}
		}
		docs = append(docs, d)
	}
	if f.sortKey != "" {
		comparable := true
		slices.SortStableFunc(docs, func(a, b found) int {
			c, ok := compareScalars(a.key, b.key)
			if !ok {
				comparable = false
			}
			return c * f.sortDir
		})
		if !comparable {
			return nil, false, nil
		}
	}
	if f.limit > 0 && len(docs) > f.limit {
		docs = docs[:f.limit]
	}
	batch := make(bson.A, 0, len(docs))
	size := 0
	for _, d := range docs {
		out, ok := f.project.apply(d.doc)
		if !ok {
			return nil, false, nil
		}
		if size += len(out); size > maxIndexedReply {
			return nil, false, nil
		}
		batch = append(batch, out)
	}
	body, err := bson.Marshal(bson.D{
		{Key: "cursor", Value: bson.D{{Key: "firstBatch", Value: batch}, {Key: "id", Value: int64(0)}, {Key: "ns", Value: f.db + "." + f.coll}}},
		{Key: "ok", Value: 1.0},
	})
	if err != nil {
		return nil, false, nil
	}
	indexedAnswers.Add(1)
	return buildOpMsg(0, requestID(req), body), true, nil
}

// parseFieldFind recognises a find whose filter has a string equality (or an $in of strings)
// on an indexed field and otherwise only plain conditions, with at most a sort on one top-level field, a limit, and a
// projection of top-level fields.
func parseFieldFind(req []byte) (fieldFind, bool) {
	if opCode(req) != opMsg || moreToCome(req) || len(req) < headerLen+5 {
		return fieldFind{}, false
	}
	if binary.LittleEndian.Uint32(req[headerLen:headerLen+4])&^uint32(flagChecksumPresent) != 0 {
		return fieldFind{}, false
	}
	body, seqs, ok := sections(req)
	if !ok || len(seqs) != 0 {
		return fieldFind{}, false
	}
	var cmd bson.D
	if err := bson.Unmarshal(body, &cmd); err != nil || len(cmd) == 0 || cmd[0].Key != "find" {
		return fieldFind{}, false
	}
	f := fieldFind{sortDir: 1}
	f.coll, _ = cmd[0].Value.(string)
	f.db, _ = lookup(cmd, "$db").(string)
	if f.coll == "" || f.db == "" {
		return fieldFind{}, false
	}
	for _, e := range cmd[1:] {
		switch e.Key {
		case "$db", "lsid", "$clusterTime", "$readPreference", "maxTimeMS", "comment", "batchSize", "singleBatch", "txnNumber":
		case "filter":
			filter, isDoc := e.Value.(bson.D)
			if !isDoc {
				return fieldFind{}, false
			}
			f.filter = filter
		case "sort":
			sort, isDoc := e.Value.(bson.D)
			if !isDoc || len(sort) > 1 {
				return fieldFind{}, false
			}
			if len(sort) == 1 {
				dir, isNum := scalar(sort[0].Value)
				if !isNum || dir.kind != 'n' || (dir.num != 1 && dir.num != -1) || sort[0].Key == "" || sort[0].Key[0] == '$' || containsDot(sort[0].Key) {
					return fieldFind{}, false
				}
				f.sortKey, f.sortDir = sort[0].Key, int(dir.num)
			}
		case "limit":
			n, isNum := scalar(e.Value)
			if !isNum || n.kind != 'n' || n.num < 0 || n.num != float64(int(n.num)) {
				return fieldFind{}, false
			}
			f.limit = int(n.num)
		case "projection":
			p, isDoc := e.Value.(bson.D)
			if !isDoc {
				return fieldFind{}, false
			}
			if f.project, ok = parseProjection(p); !ok {
				return fieldFind{}, false
			}
		default: // skip, hint, collation, tailable, min, max, let, ...: not handled
			return fieldFind{}, false
		}
	}
	rest := bson.D{}
	for _, e := range f.filter {
		if vs, ok := stringIn(e.Value); ok && f.field == "" && slices.Contains(indexedFields, e.Key) {
			// The documents read through the index are those the $in matches (an array
			// field's included): the condition is not evaluated again.
			f.field, f.values = e.Key, vs
			continue
		}
		if !plainCondition(e) {
			return fieldFind{}, false
		}
		if v, isString := e.Value.(string); isString && f.field == "" && slices.Contains(indexedFields, e.Key) {
			f.field, f.values = e.Key, []string{v}
		}
		rest = append(rest, e)
	}
	f.filter = rest
	return f, f.field != ""
}

// stringIn returns the values of {$in: [strings]} (at most maxIndexedFind of them).
func stringIn(v any) ([]string, bool) {
	d, isDoc := v.(bson.D)
	if !isDoc || len(d) != 1 || d[0].Key != "$in" {
		return nil, false
	}
	arr, isArr := d[0].Value.(bson.A)
	if !isArr || len(arr) == 0 || len(arr) > maxIndexedFind {
		return nil, false
	}
	out := make([]string, 0, len(arr))
	for _, x := range arr {
		s, isString := x.(string)
		if !isString {
			return nil, false
		}
		out = append(out, s)
	}
	return out, true
}

// parseProjection accepts {field: 1|true, ...} or {field: 0|false, ...} on top-level fields,
// with _id: 0 allowed beside inclusions.
func parseProjection(p bson.D) (projection, bool) {
	out := projection{set: len(p) > 0}
	mode := 0 // 1 include, -1 exclude
	for _, e := range p {
		if e.Key == "" || e.Key[0] == '$' || containsDot(e.Key) {
			return projection{}, false
		}
		var on bool
		switch v := e.Value.(type) {
		case bool:
			on = v
		default:
			n, ok := scalar(v)
			if !ok || n.kind != 'n' || (n.num != 0 && n.num != 1) {
				return projection{}, false
			}
			on = n.num == 1
		}
		if e.Key == "_id" {
			out.dropID = !on
			continue
		}
		m := -1
		if on {
			m = 1
		}
		if mode != 0 && mode != m {
			return projection{}, false
		}
		mode = m
		out.fields = append(out.fields, e.Key)
	}
	out.include = mode == 1
	if mode == 0 && out.dropID {
		out.include = false // {_id: 0}: every field but _id
	}
	return out, true
}

// apply returns doc as the projection shapes it.
func (p projection) apply(doc bson.Raw) (bson.Raw, bool) {
	if !p.set {
		return doc, true
	}
	elems, err := doc.Elements()
	if err != nil {
		return nil, false
	}
	out := bson.D{}
	for _, e := range elems {
		k := e.Key()
		keep := !p.include
		switch {
		case k == "_id":
			keep = !p.dropID
		case slices.Contains(p.fields, k):
			keep = p.include
		}
		if keep {
			out = append(out, bson.E{Key: k, Value: e.Value()})
		}
	}
	b, err := bson.Marshal(out)
	if err != nil {
		return nil, false
	}
	return b, true
}
