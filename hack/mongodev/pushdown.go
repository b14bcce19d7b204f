package main

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"strings"
	"sync/atomic"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// Writes by _id with further conditions, routed around a full scan.
//
// FerretDB v1.24.2's SQLite backend turns a filter into SQL (WHERE _id = ?) only when the
// filter is _id alone; with any other condition, or with _id: {$in: [...]}, it reads every
// row of the collection and filters in Go, so a compare-and-set write ({_id: k, count:
// {$lt: 3}}) or a release's decrement ({_id: {$in: keys}, count: {$gt: 0}}, multi) costs
// O(collection). The proxy runs one command at a time, so it can split such a write without
// a race:
//
//  1. find {_id: k} for each id (pushed down: one row each),
//  2. evaluate the rest of the filter on each document itself (plain comparisons of
//     top-level fields only),
//  3. no match: answer as the server would for a write that matched nothing; otherwise send
//     the write with the filter {_id: k} alone (pushed down) for each matching document,
//     and answer with the summed counts.
//
// A command or a filter outside that narrow shape is forwarded unchanged, and so is one
// whose documents hold values the proxy does not compare (before anything is written).

// writeFallbacks counts the writes parsed for a push-down that the server had to decide after
// all (a scan of the collection), for tests.
var writeFallbacks atomic.Int64

// pushdownWrite handles req when it is such a write; handled is false otherwise (req is
// then to be forwarded as it is). Call with the exchange lock held.
func pushdownWrite(backend io.Writer, br *bufio.Reader, req []byte) (resp []byte, handled bool, err error) {
	w, ok := parseIDWrite(req)
	if !ok {
		return nil, false, nil
	}
	var matched []string
	for _, id := range w.ids {
		doc, err := findByID(backend, br, req, w.db, w.coll, id)
		if err != nil {
			return nil, true, err
		}
		if doc == nil {
			continue
		}
		m, decided := matchRest(doc, w.rest)
		if !decided {
			// The document's values are not plain comparisons after all: the original
			// command decides (it is correct, only slower). Nothing was written yet.
			writeFallbacks.Add(1)
			if _, err := backend.Write(fixupRequest(req)); err != nil {
				return nil, true, err
			}
			resp, err := readMessage(br)
			return resp, true, err
		}
		if m {
			matched = append(matched, id)
		}
	}
	if len(matched) == 0 {
		out, err := bson.Marshal(w.noMatch)
		if err != nil {
			return nil, true, err
		}
		return buildOpMsg(0, requestID(req), out), true, nil
	}
	if !w.multi {
		return exchange(backend, br, req, w.rewrite(matched[0]))
	}
	// One update per matching document; the reply sums them (as updateMany's does).
	var n, modified int64
	for _, id := range matched {
		resp, _, err := exchange(backend, br, req, w.rewrite(id))
		if err != nil {
			return nil, true, err
		}
		body := opMsgBody(resp)
		if body == nil || checkOK(resp) != nil || body.Lookup("writeErrors").Type != 0 {
			return resp, true, nil // the server's own error, for the statement that failed
		}
		n += intValue(body.Lookup("n"))
		modified += intValue(body.Lookup("nModified"))
	}
	out, err := bson.Marshal(bson.D{{Key: "n", Value: int32(n)}, {Key: "nModified", Value: int32(modified)}, {Key: "ok", Value: 1.0}})
	if err != nil {
		return nil, true, err
	}
	return buildOpMsg(0, requestID(req), out), true, nil
}

// findByID reads the document with _id id of collection db.coll (nil when there is none).
func findByID(backend io.Writer, br *bufio.Reader, req []byte, db, coll, id string) (bson.Raw, error) {
	find := bson.D{
		{Key: "find", Value: coll}, {Key: "filter", Value: bson.D{{Key: "_id", Value: id}}},
		{Key: "limit", Value: int32(1)}, {Key: "singleBatch", Value: true}, {Key: "$db", Value: db},
	}
	b, err := bson.Marshal(find)
	if err != nil {
		return nil, err
	}
	if _, err := backend.Write(buildOpMsg(requestID(req), 0, b)); err != nil {
		return nil, err
	}
	fresp, err := readMessage(br)
	if err != nil {
		return nil, err
	}
	body := opMsgBody(fresp)
	if body == nil || checkOK(fresp) != nil {
		return nil, fmt.Errorf("pushdown: find by _id failed")
	}
	if batch, ok := body.Lookup("cursor", "firstBatch").ArrayOK(); ok {
		if vals, err := batch.Values(); err == nil && len(vals) > 0 {
			doc, _ := vals[0].DocumentOK()
			return doc, nil
		}
	}
	return nil, nil
}

// exchange sends a rewritten command body on behalf of req and returns the reply, marked as
// the answer to req.
func exchange(backend io.Writer, br *bufio.Reader, req, body []byte) ([]byte, bool, error) {
	if body == nil {
		return nil, true, fmt.Errorf("pushdown: cannot rewrite the command")
	}
	if _, err := backend.Write(fixupRequest(buildOpMsg(requestID(req), 0, body))); err != nil {
		return nil, true, err
	}
	resp, err := readMessage(br)
	if err != nil {
		return nil, true, err
	}
	binary.LittleEndian.PutUint32(resp[8:12], uint32(requestID(req)))
	return resp, true, nil
}

// intValue reads an int32, int64 or double reply field (0 when absent).
func intValue(v bson.RawValue) int64 {
	switch v.Type {
	case bson.TypeInt32:
		return int64(v.Int32())
	case bson.TypeInt64:
		return v.Int64()
	case bson.TypeDouble:
		return int64(v.Double())
	}
	return 0
}

// idWrite is a write the proxy can push down.
type idWrite struct {
	coll, db string
	// ids are the documents the filter names (one, unless multi).
	ids  []string
	rest bson.D // the filter without _id
	// multi: an update of every matching document (updateMany with _id: {$in: ids}).
	multi bool
	// rewrite returns the command with the filter {_id: id} alone (one statement, not
	// multi), or nil when it cannot be encoded.
	rewrite func(id string) []byte
	// noMatch is the reply to the command when the filter matches nothing.
	noMatch bson.D
}

// parseIDWrite recognises update (one statement, no upsert; multi only with _id: {$in:
// [strings]}), delete (one statement, limit 1) and findAndModify (no upsert, no sort) whose
// filter has a string _id and at least one more condition, or a list of string _ids, and
// otherwise only plain comparisons of top-level fields.
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
			case "multi":
				if v, _ := e.Value.(bool); v {
					if name != "update" {
						return idWrite{}, false
					}
					w.multi = true
				}
			case "upsert":
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
		ids, rest, ok := splitFilter(q)
		if !ok || w.multi != (len(ids) != 1 || isInList(q)) {
			return idWrite{}, false
		}
		w.ids, w.rest = ids, rest
		w.rewrite = func(id string) []byte {
			one := replace(replace(st, "q", bson.D{{Key: "_id", Value: id}}), "multi", false)
			out := make(bson.D, 0, len(cmd)+1)
			for _, e := range cmd {
				if e.Key != list {
					out = append(out, e)
				}
			}
			out = append(out, bson.E{Key: list, Value: bson.A{one}})
			b, err := bson.Marshal(out)
			if err != nil {
				return nil
			}
			return b
		}
		if w.rewrite(ids[0]) == nil {
			return idWrite{}, false
		}
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
		ids, rest, ok := splitFilter(q)
		if !ok || isInList(q) {
			return idWrite{}, false
		}
		w.ids, w.rest = ids, rest
		w.rewrite = func(id string) []byte {
			b, err := bson.Marshal(replace(cmd, "query", bson.D{{Key: "_id", Value: id}}))
			if err != nil {
				return nil
			}
			return b
		}
		if w.rewrite(ids[0]) == nil {
			return idWrite{}, false
		}
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

// splitFilter splits a filter into its string _id (or the distinct strings of _id: {$in:
// [...]}) and the other conditions, each a plain comparison of a top-level field. A single
// _id needs other conditions (alone, FerretDB pushes it down itself).
func splitFilter(q bson.D) (ids []string, rest bson.D, ok bool) {
	found, list := false, false
	for _, e := range q {
		if e.Key == "_id" {
			if found {
				return nil, nil, false
			}
			found = true
			if s, isString := e.Value.(string); isString {
				ids = []string{s}
				continue
			}
			in, isIn := inList(e.Value)
			if !isIn {
				return nil, nil, false
			}
			ids, list = in, true
			continue
		}
		if !plainCondition(e) {
			return nil, nil, false
		}
		rest = append(rest, e)
	}
	return ids, rest, found && len(ids) > 0 && (list || len(rest) > 0)
}

// inList returns the distinct strings of {$in: [strings]}.
func inList(v any) ([]string, bool) {
	ops, isDoc := v.(bson.D)
	if !isDoc || len(ops) != 1 || ops[0].Key != "$in" {
		return nil, false
	}
	arr, isArr := ops[0].Value.(bson.A)
	if !isArr {
		return nil, false
	}
	seen := map[string]bool{}
	var out []string
	for _, x := range arr {
		s, isString := x.(string)
		if !isString {
			return nil, false
		}
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out, true
}

// isInList reports whether q names its documents by _id: {$in: [...]}.
func isInList(q bson.D) bool {
	_, ok := inList(lookup(q, "_id"))
	return ok
}

// plainCondition: a top-level field (no dot, no $) compared with a scalar, directly (equality)
// or with $eq, $ne, $lt, $lte, $gt, $gte; or, alone, the negation of one order comparison
// with a number ({queued: {$not: {$gt: 0}}}, the lease store's queue barrier).
func plainCondition(e bson.E) bool {
	if _, ok := existsCond(e.Value); ok && plainPath(e.Key) {
		return true // {a.b: {$exists: bool}}: the lease store's entries (slots.<holder>)
	}
	if e.Key == "" || e.Key[0] == '$' || containsDot(e.Key) {
		return false
	}
	if _, ok := negatedOrder(e.Value); ok {
		return true
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
		if want, ok := existsCond(e.Value); ok {
			if _, present := lookupPath(fields, e.Key); present != want {
				return false, true
			}
			continue
		}
		v := lookup(fields, e.Key)
		if inner, ok := negatedOrder(e.Value); ok {
			m, decided := matchNegated(v, inner)
			if !decided || !m {
				return false, decided
			}
			continue
		}
		conds := bson.D{{Key: "$eq", Value: e.Value}}
		if ops, isDoc := e.Value.(bson.D); isDoc {
			conds = ops
		}
		if v == nil {
			// Missing or null, compared with a scalar (never null here): only $ne matches.
			for _, c := range conds {
				if c.Key != "$ne" {
					return false, true
				}
			}
			continue
		}
		got, ok := scalar(v)
		if !ok {
			return false, false
		}
		for _, c := range conds {
			want, _ := scalar(c.Value)
			cmp, comparable := compareScalars(got, want)
			if !comparable {
				return false, false
			}
			if !holds(c.Key, cmp) {
				return false, true
			}
		}
	}
	return true, true
}

// negatedOrder recognises {$not: {<op>: <number>}} with op one of $lt, $lte, $gt, $gte, and
// returns the inner comparison.
func negatedOrder(v any) (bson.E, bool) {
	ops, isDoc := v.(bson.D)
	if !isDoc || len(ops) != 1 || ops[0].Key != "$not" {
		return bson.E{}, false
	}
	inner, isDoc := ops[0].Value.(bson.D)
	if !isDoc || len(inner) != 1 {
		return bson.E{}, false
	}
	switch inner[0].Key {
	case "$lt", "$lte", "$gt", "$gte":
	default:
		return bson.E{}, false
	}
	if n, ok := scalar(inner[0].Value); !ok || n.kind != 'n' {
		return bson.E{}, false
	}
	return inner[0], true
}

// matchNegated evaluates {$not: {inner}} on a field's value v (nil: missing or null). An order
// comparison with a number matches numbers only, so $not matches a missing or null field;
// other types are left to the server.
func matchNegated(v any, inner bson.E) (matched, decided bool) {
	if v == nil {
		return true, true
	}
	got, ok := scalar(v)
	if !ok || got.kind != 'n' {
		return false, false
	}
	want, _ := scalar(inner.Value)
	cmp, _ := compareScalars(got, want)
	return !holds(inner.Key, cmp), true
}

// holds applies a comparison operator to the order of two values (-1, 0, 1).
func holds(op string, cmp int) bool {
	switch op {
	case "$eq":
		return cmp == 0
	case "$ne":
		return cmp != 0
	case "$lt":
		return cmp < 0
	case "$lte":
		return cmp <= 0
	case "$gt":
		return cmp > 0
	case "$gte":
		return cmp >= 0
	}
	return false
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

// existsCond returns the operand of {$exists: bool}.
func existsCond(v any) (want, ok bool) {
	d, isDoc := v.(bson.D)
	if !isDoc || len(d) != 1 || d[0].Key != "$exists" {
		return false, false
	}
	want, ok = d[0].Value.(bool)
	return want, ok
}

// plainPath reports whether key is a field path of plain names (a.b.c, no $, no empty name).
func plainPath(key string) bool {
	if key == "" {
		return false
	}
	for _, name := range strings.Split(key, ".") {
		if name == "" || name[0] == '$' {
			return false
		}
	}
	return true
}

// lookupPath follows a dotted path through embedded documents; present is false when a name
// is missing or a step is no document (an array is no document here: its elements are not
// looked into).
func lookupPath(d bson.D, path string) (v any, present bool) {
	names := strings.Split(path, ".")
	for i, name := range names {
		found := false
		for _, e := range d {
			if e.Key == name {
				v, found = e.Value, true
				break
			}
		}
		if !found {
			return nil, false
		}
		if i == len(names)-1 {
			return v, true
		}
		next, isDoc := v.(bson.D)
		if !isDoc {
			return nil, false
		}
		d = next
	}
	return nil, false
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
