package main

import (
	"bufio"
	"encoding/binary"
	"math"
	"net"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// A tailable awaitData getMore asks the server to wait up to maxTimeMS for new documents.
// FerretDB v1.24.2 waits by re-running the cursor's query every 10 ms, which, with a few
// tailing clients, slows every other command of the server. The proxy sees every insert, so
// it parks such a getMore itself (without the one-command lock) until an insert has been
// forwarded or the client's maxTimeMS is up, and only then sends it to FerretDB with a short
// maxTimeMS (awaitPeekMS): FerretDB then answers with what the insert added, or with an
// empty batch.

// awaitPeekMS is the maxTimeMS of the getMores the proxy sends for a parked one: long enough
// for FerretDB's first look to return what is there (it pauses 10 ms after finding data),
// short enough to bound its polling when there is nothing.
const awaitPeekMS = 100

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
	deadline := time.Now().Add(time.Duration(maxTimeMS(body)) * time.Millisecond)
	peek := withMaxTimeMS(req, awaitPeekMS)
	for {
		gen, next := p.insertSignal()
		if gen != *seen || !time.Now().Before(deadline) {
			*seen = gen
			resp, err := forward(backend, br, peek)
			if err != nil {
				return nil, err
			}
			if !emptyBatch(resp) || !time.Now().Before(deadline) {
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

// withMaxTimeMS returns a copy of an OP_MSG (a single body section, no flags: see
// opMsgBody) whose body's maxTimeMS is ms, or req itself when it cannot be rewritten.
func withMaxTimeMS(req []byte, ms int64) []byte {
	body := opMsgBody(req)
	if body == nil {
		return req
	}
	start, stop, ok := findElement(body, "maxTimeMS")
	if !ok {
		return req
	}
	out := append([]byte(nil), req...)
	off := headerLen + 5 + start // the element's type byte
	value := out[headerLen+5+stop-8:]
	switch out[off] {
	case 0x10: // int32
		binary.LittleEndian.PutUint32(out[headerLen+5+stop-4:], uint32(ms))
	case 0x12: // int64
		binary.LittleEndian.PutUint64(value, uint64(ms))
	case 0x01: // double
		binary.LittleEndian.PutUint64(value, math.Float64bits(float64(ms)))
	default:
		return req
	}
	return out
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
