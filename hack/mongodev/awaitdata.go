package main

import (
	"bufio"
	"encoding/binary"
	"net"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// A tailable awaitData getMore asks the server to wait up to maxTimeMS for new documents.
// FerretDB v1.24.2 waits by re-running the cursor's query every 10 ms under a context with
// that deadline, which has two costs: with a few tailing clients it slows every other
// command, and the deadline ends SQLite queries mid-call. The SQLite driver FerretDB v1.24.2
// came with (modernc.org/sqlite v1.32.0) then dropped a statement that had already returned
// a row without resetting it: the pooled connection kept a read transaction on a snapshot
// that never moved again, and every later write on it failed with "database is locked
// (517)" (SQLITE_BUSY_SNAPSHOT) or "interrupted (9)", for good (wedge_test.go). The driver
// is newer now (driver_test.go); no deadline reaching SQLite is better still.
//
// So FerretDB never sees an awaitData cursor: the proxy opens it as a plain tailable
// cursor (awaitData: false, awaitFind), remembers its id, and serves the waiting itself. It
// parks such a getMore (without the one-command lock) until an insert has been forwarded or
// the client's maxTimeMS is up, and only then sends it to FerretDB without maxTimeMS:
// FerretDB re-runs the cursor's query once, on a context that no deadline cuts, and answers
// with what the insert added or with an empty batch.

// defaultAwaitMS is how long a getMore on an awaitData cursor waits when it carries no
// maxTimeMS (MongoDB's default).
const defaultAwaitMS = 1000

// maxAwaitCursors bounds the remembered awaitData cursor ids (cursors that clients abandon
// without killCursors are never forgotten otherwise). A forgotten cursor's getMores that
// carry a maxTimeMS still wait; others are answered at once.
const maxAwaitCursors = 4096

// awaitFind returns a copy of req with awaitData set to false when req is a find that opens
// a tailable awaitData cursor, else nil.
func awaitFind(req []byte) []byte {
	body := opMsgBody(req)
	if body == nil || firstKey(body) != "find" {
		return nil
	}
	if v, err := body.LookupErr("awaitData"); err != nil || !v.Equal(bson.RawValue{Type: bson.TypeBoolean, Value: []byte{1}}) {
		return nil
	}
	_, stop, ok := findElement(body, "awaitData")
	if !ok {
		return nil
	}
	out := append([]byte(nil), req...)
	out[headerLen+5+stop-1] = 0 // the boolean's value byte
	return out
}

// noteAwaitCursor remembers the cursor a find opened by awaitFind's copy answered with.
func (p *proxy) noteAwaitCursor(resps [][]byte) {
	if len(resps) != 1 {
		return
	}
	id := cursorID(resps[0])
	if id == 0 {
		return
	}
	p.awaitMu.Lock()
	defer p.awaitMu.Unlock()
	if len(p.awaitCursors) >= maxAwaitCursors {
		clear(p.awaitCursors)
	}
	p.awaitCursors[id] = struct{}{}
}

// forgetCursors forgets the awaitData cursors a killCursors request names.
func (p *proxy) forgetCursors(req []byte) {
	body := opMsgBody(req)
	if body == nil || firstKey(body) != "killCursors" {
		return
	}
	v, err := body.LookupErr("cursors")
	if err != nil {
		return
	}
	arr, ok := v.ArrayOK()
	if !ok {
		return
	}
	vals, _ := arr.Values()
	p.awaitMu.Lock()
	defer p.awaitMu.Unlock()
	for _, v := range vals {
		if id, ok := v.AsInt64OK(); ok {
			delete(p.awaitCursors, id)
		}
	}
}

// awaitsData reports whether req is a getMore that waits for data: one on a cursor opened
// by awaitFind, or one that carries maxTimeMS. (Both MongoDB and FerretDB v1.24.2 accept
// maxTimeMS on getMore only for a tailable awaitData cursor, so the field alone tells one.)
func (p *proxy) awaitsData(req []byte) bool {
	body := opMsgBody(req)
	if body == nil || firstKey(body) != "getMore" {
		return false
	}
	if _, err := body.LookupErr("maxTimeMS"); err == nil {
		return true
	}
	id, ok := body.Lookup("getMore").AsInt64OK()
	if !ok {
		return false
	}
	p.awaitMu.Lock()
	defer p.awaitMu.Unlock()
	_, known := p.awaitCursors[id]
	return known
}

// insertSignal returns the insert generation and a channel closed at the next insert.
func (p *proxy) insertSignal() (uint64, <-chan struct{}) {
	p.insMu.Lock()
	defer p.insMu.Unlock()
	return p.insGen, p.inserted
}

// insertForwarded wakes the parked awaitData getMores.
func (p *proxy) insertForwarded() {
	p.insMu.Lock()
	defer p.insMu.Unlock()
	p.insGen++
	close(p.inserted)
	p.inserted = make(chan struct{})
}

// awaitData serves an awaitData getMore: it asks the backend at once if an insert was
// forwarded since this connection last asked (seen), else parks until the next insert or the
// client's maxTimeMS. It never holds the exchange lock: it only reads.
func (p *proxy) awaitData(backend net.Conn, br *bufio.Reader, req []byte, seen *uint64) ([][]byte, error) {
	body := opMsgBody(req)
	wait := maxTimeMS(body)
	if _, err := body.LookupErr("maxTimeMS"); err != nil {
		wait = defaultAwaitMS
	}
	deadline := time.Now().Add(time.Duration(wait) * time.Millisecond)
	peek := fixupRequest(req) // without maxTimeMS: FerretDB's cursor is a plain tailable one
	for {
		gen, next := p.insertSignal()
		if gen != *seen || !time.Now().Before(deadline) {
			*seen = gen
			resp, err := forward(backend, br, peek)
			if err != nil {
				return nil, err
			}
			if !emptyBatch(resp) || !time.Now().Before(deadline) || cursorID(resp) == 0 {
				if cursorID(resp) == 0 {
					p.awaitMu.Lock()
					delete(p.awaitCursors, body.Lookup("getMore").Int64())
					p.awaitMu.Unlock()
				}
				return [][]byte{resp}, nil
			}
			continue
		}
		t := time.NewTimer(time.Until(deadline))
		select {
		case <-next:
		case <-t.C:
		}
		t.Stop()
	}
}

// forward writes one request and reads its one response.
func forward(backend net.Conn, br *bufio.Reader, req []byte) ([]byte, error) {
	if _, err := backend.Write(req); err != nil {
		return nil, err
	}
	return readMessage(br)
}

// maxTimeMS reads a body's maxTimeMS (0 if absent or not a number).
func maxTimeMS(body bson.Raw) int64 {
	v, err := body.LookupErr("maxTimeMS")
	if err != nil {
		return 0
	}
	if n, ok := v.AsInt64OK(); ok {
		return n
	}
	return 0
}

// cursorID reads a find or getMore reply's cursor.id (0 if absent: no open cursor).
func cursorID(resp []byte) int64 {
	body := opMsgBody(resp)
	if body == nil {
		return 0
	}
	v, err := body.LookupErr("cursor", "id")
	if err != nil {
		return 0
	}
	id, _ := v.AsInt64OK()
	return id
}

// emptyBatch reports whether a getMore reply carries no documents (false when unsure).
func emptyBatch(resp []byte) bool {
	body := opMsgBody(resp)
	if body == nil {
		return false
	}
	v, err := body.LookupErr("cursor", "nextBatch")
	if err != nil {
		return false
	}
	arr, ok := v.ArrayOK()
	if !ok {
		return false
	}
	vals, err := arr.Values()
	return err == nil && len(vals) == 0
}

// commandName returns the first key of an OP_MSG's body section ("" if none).
func commandName(msg []byte) string {
	if opCode(msg) != opMsg || len(msg) < headerLen+5 {
		return ""
	}
	flags := binary.LittleEndian.Uint32(msg[headerLen : headerLen+4])
	end := len(msg)
	if flags&flagChecksumPresent != 0 {
		end -= 4
	}
	for pos := headerLen + 4; pos+5 <= end; {
		size := int(binary.LittleEndian.Uint32(msg[pos+1 : pos+5]))
		if size < 5 || pos+1+size > end {
			return ""
		}
		if msg[pos] == 0 {
			return firstKey(msg[pos+1 : pos+1+size])
		}
		pos += 1 + size
	}
	return ""
}
