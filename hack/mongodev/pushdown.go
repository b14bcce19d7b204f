package main

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// Writes by _id with further conditions, routed around a full scan.
//
// FerretDB v1.24.2's SQLite backend turns a filter into SQL (WHERE _id = ?) only when the
// filter is _id alone; with any other condition it reads every row of the collection and
// filters in Go, so a compare-and-set write ({_id: k, count: {$lt: 3}}) costs O(collection).
// The proxy runs one command at a time, so it can split such a write without a race:
//
//  1. find {_id: k} (pushed down: one row),
//  2. evaluate the rest of the filter on that document itself (plain comparisons of
//     top-level fields only),
//  3. no match: answer as the server would for a write that matched nothing; a match: send
//     the write with the filter {_id: k} alone (pushed down).
//
// A command or a filter outside that narrow shape is forwarded unchanged.

// pushdownWrite handles req when it is such a write; handled is false otherwise (req is
// then to be forwarded as it is). Call with the exchange lock held.
func pushdownWrite(backend io.Writer, br *bufio.Reader, req []byte) (resp []byte, handled bool, err error) {
	w, ok := parseIDWrite(req)
	if !ok {
		return nil, false, nil
	}
	find := bson.D{
		{Key: "find", Value: w.coll}, {Key: "filter", Value: bson.D{{Key: "_id", Value: w.id}}},
		{Key: "limit", Value: int32(1)}, {Key: "singleBatch", Value: true}, {Key: "$db", Value: w.db},
	}
	b, err := bson.Marshal(find)
	if err != nil {
		return nil, false, nil
	}
	if _, err := backend.Write(buildOpMsg(requestID(req), 0, b)); err != nil {
		return nil, true, err
	}
	fresp, err := readMessage(br)
	if err != nil {
		return nil, true, err
	}
	body := opMsgBody(fresp)
	if body == nil || checkOK(fresp) != nil {
		return nil, true, fmt.Errorf("pushdown: find by _id failed")
	}
	var doc bson.Raw
	if batch, ok := body.Lookup("cursor", "firstBatch").ArrayOK(); ok {
		if vals, err := batch.Values(); err == nil && len(vals) > 0 {
			doc, _ = vals[0].DocumentOK()
		}
	}
	matched := false
	if doc != nil {
		m, decided := matchRest(doc, w.rest)
		if !decided {
			// The document's values are not plain comparisons after all: the original
			// command decides (it is correct, only slower).
			if _, err := backend.Write(req); err != nil {
				return nil, true, err
			}
			resp, err := readMessage(br)
			return resp, true, err
		}
		matched = m
	}
	if !matched {
		out, err := bson.Marshal(w.noMatch)
		if err != nil {
			return nil, true, err
		}
		return buildOpMsg(requestID(fresp), requestID(req), out), true, nil
	}
	if _, err := backend.Write(buildOpMsg(requestID(req), 0, w.rewritten)); err != nil {
		return nil, true, err
	}
	resp, err = readMessage(br)
	if err != nil {
		return nil, true, err
	}
	binary.LittleEndian.PutUint32(resp[8:12], uint32(requestID(req)))
	return resp, true, nil
}

// idWrite is a write the proxy can push down.
type idWrite struct {
	coll, db string
	id       string
	rest     bson.D // the filter without _id
	// rewritten is the command with the filter {_id: id} alone (statements in the body).
	rewritten []byte
	// noMatch is the reply to the command when the filter matches nothing.
	noMatch bson.D
}

// parseIDWrite recognises update (one statement, no upsert, no multi), delete (one
// statement, limit 1) and findAndModify (no upsert, no sort) whose filter has a string _id
// and at least one more condition, all of them plain comparisons of top-level fields.
func parseIDWrite(req []byte) (idWrite, bool) {
	if opCode(req) != opMsg || moreToCome(req) || len(req) < headerLen+5 {
		return idWrite{}, false
	}
	flags := binary.LittleEndian.Uint32(req[headerLen : headerLen+4])
	if flags&^uint32(flagChecksumPresent) != 0 {
		return idWrite{}, false
	}
	body, seqs, ok := sections(req)
	if !ok {
		return idWrite{}, false
	}
	var cmd bson.D
	if err := bson.Unmarshal(body, &cmd); err != nil || len(cmd) == 0 {
		return idWrite{}, false
	}
	name := cmd[0].Key
	coll, _ := cmd[0].Value.(string)
	db, _ := lookup(cmd, "$db").(string)
	if coll == "" || db == "" {
		return idWrite{}, false
	}
	w := idWrite{coll: coll, db: db}
	switch name {
	case "update", "delete":
		list := "updates"
		if name == "delete" {
			list = "deletes"
		}
		stmts, ok := statements(cmd, seqs, list)
		if !ok || len(stmts) != 1 {
			return idWrite{}, false
		}
		st := stmts[0]
		for _, e := range st {
			switch e.Key {
			case "q", "u":
			case "multi", "upsert":
				if v, _ := e.Value.(bool); v {
					return idWrite{}, false
				}
			case "limit":
				if name != "delete" || !isOne(e.Value) {
					return idWrite{}, false
				}
			default: // arrayFilters, hint, collation, ...: not handled
				return idWrite{}, false
			}
		}
		q, _ := lookup(st, "q").(bson.D)
		id, rest, ok := splitFilter(q)
		if !ok {
			return idWrite{}, false
		}
		w.id, w.rest = id, rest
		st = replace(st, "q", bson.D{{Key: "_id", Value: id}})
		out := make(bson.D, 0, len(cmd)+1)
		for _, e := range cmd {
			if e.Key != list {
				out = append(out, e)
			}
		}
		out = append(out, bson.E{Key: list, Value: bson.A{st}})
		b, err := bson.Marshal(out)
		if err != nil {
			return idWrite{}, false
		}
		w.rewritten = b
		if name == "update" {
			w.noMatch = bson.D{{Key: "n", Value: int32(0)}, {Key: "nModified", Value: int32(0)}, {Key: "ok", Value: 1.0}}
		} else {
			w.noMatch = bson.D{{Key: "n", Value: int32(0)}, {Key: "ok", Value: 1.0}}
		}
		return w, true
	case "findAndModify", "findandmodify":
		if len(seqs) != 0 {
			return idWrite{}, false
		}
		for _, e := range cmd[1:] {
			switch e.Key {
			case "query", "update", "remove", "new", "fields", "$db", "lsid", "txnNumber", "maxTimeMS", "writeConcern", "bypassDocumentValidation", "comment", "$clusterTime", "$readPreference":
			case "upsert":
				if v, _ := e.Value.(bool); v {
					return idWrite{}, false
				}
			default: // sort, arrayFilters, hint, collation, let, ...
				return idWrite{}, false
			}
		}
		q, _ := lookup(cmd, "query").(bson.D)
		id, rest, ok := splitFilter(q)
		if !ok {
			return idWrite{}, false
		}
		w.id, w.rest = id, rest
		b, err := bson.Marshal(replace(cmd, "query", bson.D{{Key: "_id", Value: id}}))
		if err != nil {
			return idWrite{}, false
		}
		w.rewritten = b
		w.noMatch = bson.D{
			{Key: "lastErrorObject", Value: bson.D{{Key: "n", Value: int32(0)}, {Key: "updatedExisting", Value: false}}},
			{Key: "value", Value: nil}, {Key: "ok", Value: 1.0},
		}
		return w, true
	}
	return idWrite{}, false
}

// sections returns an OP_MSG's body and its document sequences by identifier.
func sections(msg []byte) (body bson.Raw, seqs map[string][]bson.Raw, ok bool) {
	flags := binary.LittleEndian.Uint32(msg[headerLen : headerLen+4])
	end := len(msg)
	if flags&flagChecksumPresent != 0 {
		end -= 4
	}
	seqs = map[string][]bson.Raw{}
	pos := headerLen + 4
	for pos < end {
		kind := msg[pos]
		if pos+5 > end {
			return nil, nil, false
		}
		size := int(binary.LittleEndian.Uint32(msg[pos+1 : pos+5]))
		if size < 5 || pos+1+size > end {
			return nil, nil, false
		}
		sec := msg[pos+1 : pos+1+size]
		switch kind {
		case 0:
			body = bson.Raw(sec)
		case 1:
			i := 4
			for i < len(sec) && sec[i] != 0 {
				i++
			}
			if i >= len(sec) {
				return nil, nil, false
			}
			ident := string(sec[4:i])
			for d := i + 1; d < len(sec); {
				if d+4 > len(sec) {
					return nil, nil, false
				}
				n := int(binary.LittleEndian.Uint32(sec[d : d+4]))
				if n < 5 || d+n > len(sec) {
					return nil, nil, false
				}
				seqs[ident] = append(seqs[ident], bson.Raw(sec[d:d+n]))
				d += n
			}
		default:
			return nil, nil, false
		}
		pos += 1 + size
	}
	return body, seqs, body != nil && body.Validate() == nil
}

// statements returns the write statements of list, from the body or a document sequence.
func statements(cmd bson.D, seqs map[string][]bson.Raw, list string) ([]bson.D, bool) {
	var raws []bson.Raw
	if v := lookup(cmd, list); v != nil {
		arr, ok := v.(bson.A)
		if !ok || len(seqs) != 0 {
			return nil, false
		}
		var out []bson.D
		for _, e := range arr {
			d, ok := e.(bson.D)
			if !ok {
				return nil, false
			}
			out = append(out, d)
		}
		return out, true
	}
	if len(seqs) != 1 {
		return nil, false
	}
	raws, ok := seqs[list]
	if !ok {
		return nil, false
	}
	out := make([]bson.D, 0, len(raws))
	for _, r := range raws {
		var d bson.D
		if err := bson.Unmarshal(r, &d); err != nil {
			return nil, false
		}
		out = append(out, d)
	}
	return out, true
}

// splitFilter splits a filter into its string _id and the other conditions, when there are
// some and each is a plain comparison of a top-level field.
func splitFilter(q bson.D) (id string, rest bson.D, ok bool) {
	found := false
	for _, e := range q {
		if e.Key == "_id" {
			s, isString := e.Value.(string)
			if !isString || found {
				return "", nil, false
			}
			id, found = s, true
			continue
		}
		if !plainCondition(e) {
			return "", nil, false
		}
		rest = append(rest, e)
	}
	return id, rest, found && len(rest) > 0
}

// plainCondition: a top-level field (no dot, no $) compared with a scalar, directly (equality)
// or with $eq, $ne, $lt, $lte, $gt, $gte.
func plainCondition(e bson.E) bool {
	if e.Key == "" || e.Key[0] == '$' || containsDot(e.Key) {
		return false
	}
	if ops, isDoc := e.Value.(bson.D); isDoc {
		if len(ops) == 0 {
			return false
		}
		for _, op := range ops {
			switch op.Key {
			case "$eq", "$ne", "$lt", "$lte", "$gt", "$gte":
				if _, ok := scalar(op.Value); !ok {
					return false
				}
			default:
				return false
			}
		}
		return true
	}
	_, ok := scalar(e.Value)
	return ok
}

// matchRest evaluates plain conditions on doc; decided is false when a value is not one the
// proxy compares (then the server must decide).
func matchRest(doc bson.Raw, rest bson.D) (matched, decided bool) {
	var fields bson.D
	if err := bson.Unmarshal(doc, &fields); err != nil {
		return false, false
	}
	for _, e := range rest {
		v := lookup(fields, e.Key)
		if v == nil {
			return false, false // missing or null: leave MongoDB's null semantics to the server
		}
		got, ok := scalar(v)
		if !ok {
			return false, false
		}
		conds := bson.D{{Key: "$eq", Value: e.Value}}
		if ops, isDoc := e.Value.(bson.D); isDoc {
			conds = ops
		}
		for _, c := range conds {
			want, _ := scalar(c.Value)
			cmp, comparable := compareScalars(got, want)
			if !comparable {
				return false, false
			}
			var ok bool
			switch c.Key {
			case "$eq":
				ok = cmp == 0
			case "$ne":
				ok = cmp != 0
			case "$lt":
				ok = cmp < 0
			case "$lte":
				ok = cmp <= 0
			case "$gt":
				ok = cmp > 0
			case "$gte":
				ok = cmp >= 0
			}
			if !ok {
				return false, true
			}
		}
	}
	return true, true
}

// scalarValue is a comparable value: a number (as float64), a string, a bool or a date.
type scalarValue struct {
	kind byte // 'n' number, 's' string, 'b' bool, 'd' date
	num  float64
	str  string
	date int64
	b    bool
}

func scalar(v any) (scalarValue, bool) {
	switch x := v.(type) {
	case int32:
		return scalarValue{kind: 'n', num: float64(x)}, true
	case int64:
		if x > 1<<53 || x < -(1<<53) {
			return scalarValue{}, false
		}
		return scalarValue{kind: 'n', num: float64(x)}, true
	case float64:
		if x != x { // NaN
			return scalarValue{}, false
		}
		return scalarValue{kind: 'n', num: x}, true
	case string:
		return scalarValue{kind: 's', str: x}, true
	case bool:
		return scalarValue{kind: 'b', b: x}, true
	case bson.DateTime:
		return scalarValue{kind: 'd', date: int64(x)}, true
	}
	return scalarValue{}, false
}

// compareScalars orders two values of the same kind; different kinds are not compared here.
func compareScalars(a, b scalarValue) (int, bool) {
	if a.kind != b.kind {
		return 0, false
	}
	switch a.kind {
	case 'n':
		return cmpOrdered(a.num, b.num), true
	case 's':
		return cmpOrdered(a.str, b.str), true
	case 'd':
		return cmpOrdered(a.date, b.date), true
	default:
		if a.b == b.b {
			return 0, true
		}
		if !a.b {
			return -1, true
		}
		return 1, true
	}
}

func cmpOrdered[T int64 | float64 | string](a, b T) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func lookup(d bson.D, key string) any {
	for _, e := range d {
		if e.Key == key {
			return e.Value
		}
	}
	return nil
}

func replace(d bson.D, key string, v any) bson.D {
	out := make(bson.D, len(d))
	copy(out, d)
	for i := range out {
		if out[i].Key == key {
			out[i].Value = v
		}
	}
	return out
}

func isOne(v any) bool {
	switch x := v.(type) {
	case int32:
		return x == 1
	case int64:
		return x == 1
	case float64:
		return x == 1
	}
	return false
}

func containsDot(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == '.' {
			return true
		}
	}
	return false
}
