package main

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// Workarounds for FerretDB v1.24.2 bugs that a real MongoDB does not have, applied by the
// proxy so that code written for MongoDB works unchanged against mongodev.

// fixupRequest works around request fields FerretDB v1.24.2 rejects although MongoDB accepts
// them, and returns the message to forward (msg itself when nothing changes):
//
//   - maxTimeMS, which the Go driver adds to every command whose context has a deadline, is
//     dropped from every command. distinct with it fails with (FailedToParse) distinct:
//     unknown field "maxTimeMS"; on any other command FerretDB turns it into a context
//     deadline that ends SQLite statements mid-call, which on this one-command-at-a-time
//     server is a matter of queueing, not of the command, and which can leave the pooled
//     SQLite connection broken for good (awaitdata.go). The client's own deadline still
//     applies: it stops waiting, and the proxy lets the command finish and drops its answer.
//     On getMore, maxTimeMS says how long an awaitData cursor waits: the proxy serves that
//     wait itself (awaitdata.go).
func fixupRequest(msg []byte) []byte {
	if opCode(msg) != opMsg || len(msg) < headerLen+5 {
		return msg
	}
	flags := binary.LittleEndian.Uint32(msg[headerLen : headerLen+4])
	end := len(msg)
	if flags&flagChecksumPresent != 0 {
		end -= 4
	}
	// Find the body section (kind 0).
	pos := headerLen + 4
	for pos < end {
		kind := msg[pos]
		if pos+5 > end {
			return msg
		}
		size := int(binary.LittleEndian.Uint32(msg[pos+1 : pos+5]))
		if size < 5 || pos+1+size > end {
			return msg
		}
		if kind != 0 {
			pos += 1 + size // kind 1: int32 size covers identifier and documents
			continue
		}
		doc := msg[pos+1 : pos+1+size]
		start, stop, ok := findElement(doc, "maxTimeMS")
		if !ok {
			return msg
		}
		removed := stop - start
		out := make([]byte, 0, len(msg)-removed)
		out = append(out, msg[:pos+1+start]...)
		out = append(out, msg[pos+1+stop:end]...)
		// The checksum (if any) no longer matches: drop it and its flag.
		binary.LittleEndian.PutUint32(out[0:4], uint32(len(out)))
		binary.LittleEndian.PutUint32(out[headerLen:headerLen+4], flags&^flagChecksumPresent)
		binary.LittleEndian.PutUint32(out[pos+1:pos+5], uint32(size-removed))
		return out
	}
	return msg
}

// firstKey returns the name of a BSON document's first element ("" if none or malformed).
func firstKey(doc []byte) string {
	if len(doc) < 6 || doc[4] == 0 {
		return ""
	}
	for i := 5; i < len(doc); i++ {
		if doc[i] == 0 {
			return string(doc[5:i])
		}
	}
	return ""
}

// findElement returns the byte range [start, stop) of the top-level element name in doc.
func findElement(doc []byte, name string) (start, stop int, ok bool) {
	pos := 4
	last := len(doc) - 1 // the document's terminating 0
	for pos < last {
		start = pos
		typ := doc[pos]
		pos++
		i := pos
		for i < last && doc[i] != 0 {
			i++
		}
		if i >= last {
			return 0, 0, false
		}
		key := string(doc[pos:i])
		pos = i + 1
		size, err := bsonValueSize(typ, doc[pos:last])
		if err != nil {
			return 0, 0, false
		}
		pos += size
		if key == name {
			return start, pos, true
		}
	}
	return 0, 0, false
}

// opMsgBody returns the body document (section kind 0) of an OP_MSG without moreToCome,
// checksum or document-sequence sections, or nil.
func opMsgBody(msg []byte) bson.Raw {
	if opCode(msg) != opMsg || len(msg) < headerLen+5+5 {
		return nil
	}
	if binary.LittleEndian.Uint32(msg[headerLen:headerLen+4]) != 0 || msg[headerLen+4] != 0 {
		return nil
	}
	doc := bson.Raw(msg[headerLen+5:])
	if int(binary.LittleEndian.Uint32(doc[0:4])) != len(doc) || doc.Validate() != nil {
		return nil
	}
	return doc
}

// buildOpMsg builds an OP_MSG with the given body.
func buildOpMsg(requestID, responseTo int32, body []byte) []byte {
	msg := make([]byte, headerLen, headerLen+5+len(body))
	msg = binary.LittleEndian.AppendUint32(msg, 0) // flagBits
	msg = append(msg, 0)                           // body section
	msg = append(msg, body...)
	binary.LittleEndian.PutUint32(msg[0:4], uint32(len(msg)))
	binary.LittleEndian.PutUint32(msg[4:8], uint32(requestID))
	binary.LittleEndian.PutUint32(msg[8:12], uint32(responseTo))
	binary.LittleEndian.PutUint32(msg[12:16], opMsg)
	return msg
}

// splitCreateIndexes returns, for a createIndexes command with more than one index, one
// createIndexes command per index (same fields otherwise); nil for any other message.
//
// FerretDB v1.24.2 panics (and drops the connection) on a createIndexes whose list holds two
// or more indexes that already exist, like a second EnsureIndexes: validateIndexesForCreation
// deletes skipped indexes from its filtered copy at their index in the original list.
// One index per command avoids that.
func splitCreateIndexes(msg []byte) [][]byte {
	body := opMsgBody(msg)
	if body == nil {
		return nil
	}
	elems, err := body.Elements()
	if err != nil || len(elems) == 0 || elems[0].Key() != "createIndexes" {
		return nil
	}
	idxVal, err := body.LookupErr("indexes")
	if err != nil {
		return nil
	}
	arr, ok := idxVal.ArrayOK()
	if !ok {
		return nil
	}
	indexes, err := arr.Values()
	if err != nil || len(indexes) < 2 {
		return nil
	}
	// Rebuild byte by byte (no decoding: index key order and value types must not change).
	subs := make([][]byte, 0, len(indexes))
	for _, idx := range indexes {
		var arr []byte
		arr = binary.LittleEndian.AppendUint32(arr, 0)
		arr = append(arr, byte(idx.Type))
		arr = append(arr, "0\x00"...)
		arr = append(arr, idx.Value...)
		arr = append(arr, 0)
		binary.LittleEndian.PutUint32(arr[0:4], uint32(len(arr)))

		var doc []byte
		doc = binary.LittleEndian.AppendUint32(doc, 0)
		for _, e := range elems {
			if e.Key() != "indexes" {
				doc = append(doc, e...)
				continue
			}
			doc = append(doc, byte(bson.TypeArray))
			doc = append(doc, "indexes\x00"...)
			doc = append(doc, arr...)
		}
		doc = append(doc, 0)
		binary.LittleEndian.PutUint32(doc[0:4], uint32(len(doc)))
		subs = append(subs, buildOpMsg(requestID(msg), 0, doc))
	}
	return subs
}

// createIndexesOneByOne sends the commands from splitCreateIndexes and combines their replies
// into one reply to req: the first failure, or numIndexesBefore of the first, numIndexesAfter
// of the last, createdCollectionAutomatically or note as MongoDB sets them.
func createIndexesOneByOne(backend io.Writer, br *bufio.Reader, req []byte, subs [][]byte) ([]byte, error) {
	var before, after bson.RawValue
	created, createdSet := false, false
	var lastResp []byte
	for i, sub := range subs {
		if _, err := backend.Write(fixupRequest(sub)); err != nil {
			return nil, err
		}
		resp, err := readMessage(br)
		if err != nil {
			return nil, err
		}
		lastResp = resp
		body := opMsgBody(resp)
		if body == nil {
			return nil, fmt.Errorf("createIndexes: unexpected reply to a split command")
		}
		if checkOK(resp) != nil {
			return resp, nil // the error, as the backend worded it
		}
		if i == 0 {
			before = body.Lookup("numIndexesBefore")
		}
		after = body.Lookup("numIndexesAfter")
		if v, ok := body.Lookup("createdCollectionAutomatically").BooleanOK(); ok {
			createdSet = true
			created = created || v
		}
	}
	var res bson.D
	if before.Type != 0 {
		res = append(res, bson.E{Key: "numIndexesBefore", Value: before})
	}
	if after.Type != 0 {
		res = append(res, bson.E{Key: "numIndexesAfter", Value: after})
	}
	if createdSet {
		res = append(res, bson.E{Key: "createdCollectionAutomatically", Value: created})
	} else {
		res = append(res, bson.E{Key: "note", Value: "all indexes already exist"})
	}
	res = append(res, bson.E{Key: "ok", Value: 1.0})
	b, err := bson.Marshal(res)
	if err != nil {
		return nil, err
	}
	return buildOpMsg(requestID(lastResp), requestID(req), b), nil
}
