package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
)

// MongoDB wire protocol: every message starts with a 16-byte header of four little-endian
// int32: messageLength (including the header), requestID, responseTo, opCode.
const (
	headerLen = 16

	opMsg = 2013

	// OP_MSG flagBits.
	flagChecksumPresent = 1 << 0
	flagMoreToCome      = 1 << 1

	// maxMessageLen bounds what the proxy accepts (MongoDB's maxMessageSizeBytes is 48 MB).
	maxMessageLen = 64 << 20
)

// readMessage reads one complete wire-protocol message (header included).
func readMessage(r io.Reader) ([]byte, error) {
	var hdr [headerLen]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	n := int32(binary.LittleEndian.Uint32(hdr[0:4]))
	if n < headerLen || n > maxMessageLen {
		return nil, fmt.Errorf("bad message length %d", n)
	}
	msg := make([]byte, n)
	copy(msg, hdr[:])
	if _, err := io.ReadFull(r, msg[headerLen:]); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return msg, nil
}

func opCode(msg []byte) int32 { return int32(binary.LittleEndian.Uint32(msg[12:16])) }

// moreToCome reports whether msg is an OP_MSG with the moreToCome flag: sent by a client,
// no response follows; sent by a server (exhaust), another response follows.
func moreToCome(msg []byte) bool {
	return len(msg) >= headerLen+4 && opCode(msg) == opMsg &&
		binary.LittleEndian.Uint32(msg[headerLen:headerLen+4])&flagMoreToCome != 0
}

// pingMessage builds OP_MSG {ping: 1, $db: "admin"}.
func pingMessage(id int32) []byte {
	var doc []byte
	doc = binary.LittleEndian.AppendUint32(doc, 0) // length, patched below
	doc = append(doc, 0x10)                        // int32
	doc = append(doc, "ping\x00"...)
	doc = binary.LittleEndian.AppendUint32(doc, 1)
	doc = append(doc, 0x02) // string
	doc = append(doc, "$db\x00"...)
	doc = binary.LittleEndian.AppendUint32(doc, uint32(len("admin")+1))
	doc = append(doc, "admin\x00"...)
	doc = append(doc, 0x00)
	binary.LittleEndian.PutUint32(doc[0:4], uint32(len(doc)))

	msg := make([]byte, headerLen, headerLen+4+1+len(doc))
	msg = binary.LittleEndian.AppendUint32(msg, 0) // flagBits
	msg = append(msg, 0)                           // section kind 0: body
	msg = append(msg, doc...)
	binary.LittleEndian.PutUint32(msg[0:4], uint32(len(msg)))
	binary.LittleEndian.PutUint32(msg[4:8], uint32(id))
	binary.LittleEndian.PutUint32(msg[12:16], opMsg)
	return msg
}

// checkOK checks that an OP_MSG reply's body has a numeric "ok" field equal to 1.
func checkOK(msg []byte) error {
	if opCode(msg) != opMsg {
		return fmt.Errorf("unexpected reply opCode %d", opCode(msg))
	}
	body := msg[headerLen:]
	if len(body) < 5 || body[4] != 0 {
		return errors.New("reply without body section")
	}
	doc := body[5:]
	if len(doc) < 5 {
		return errors.New("short reply document")
	}
	dl := int(binary.LittleEndian.Uint32(doc[0:4]))
	if dl < 5 || dl > len(doc) {
		return errors.New("bad reply document length")
	}
	doc = doc[4 : dl-1]
	for len(doc) > 0 {
		typ := doc[0]
		doc = doc[1:]
		end := 0
		for end < len(doc) && doc[end] != 0 {
			end++
		}
		if end == len(doc) {
			return errors.New("bad reply document")
		}
		name := string(doc[:end])
		doc = doc[end+1:]
		size, err := bsonValueSize(typ, doc)
		if err != nil {
			return err
		}
		if name == "ok" {
			var ok float64
			switch typ {
			case 0x01:
				ok = math.Float64frombits(binary.LittleEndian.Uint64(doc))
			case 0x10:
				ok = float64(int32(binary.LittleEndian.Uint32(doc)))
			case 0x12:
				ok = float64(int64(binary.LittleEndian.Uint64(doc)))
			default:
				return fmt.Errorf("reply ok field has BSON type %#x", typ)
			}
			if ok != 1 {
				return fmt.Errorf("reply ok = %v", ok)
			}
			return nil
		}
		doc = doc[size:]
	}
	return errors.New(`reply has no "ok" field`)
}

// bsonValueSize returns the encoded size of a BSON value of type typ at the start of b.
func bsonValueSize(typ byte, b []byte) (int, error) {
	size := -1
	switch typ {
	case 0x01, 0x09, 0x11, 0x12: // double, datetime, timestamp, int64
		size = 8
	case 0x02, 0x0D, 0x0E: // string, javascript, symbol
		if len(b) >= 4 {
			size = 4 + int(binary.LittleEndian.Uint32(b))
		}
	case 0x03, 0x04, 0x0F: // document, array, code with scope
		if len(b) >= 4 {
			size = int(binary.LittleEndian.Uint32(b))
		}
	case 0x05: // binary
		if len(b) >= 4 {
			size = 5 + int(binary.LittleEndian.Uint32(b))
		}
	case 0x07: // ObjectId
		size = 12
	case 0x08: // bool
		size = 1
	case 0x06, 0x0A, 0x7F, 0xFF: // undefined, null, maxKey, minKey
		size = 0
	case 0x0B: // regex: two cstrings
		zeros := 0
		for i, c := range b {
			if c == 0 {
				zeros++
				if zeros == 2 {
					size = i + 1
					break
				}
			}
		}
	case 0x0C: // DBPointer
		if len(b) >= 4 {
			size = 4 + int(binary.LittleEndian.Uint32(b)) + 12
		}
	case 0x10: // int32
		size = 4
	case 0x13: // decimal128
		size = 16
	}
	if size < 0 || size > len(b) {
		return 0, fmt.Errorf("bad BSON value of type %#x", typ)
	}
	return size, nil
}

func requestID(msg []byte) int32 { return int32(binary.LittleEndian.Uint32(msg[4:8])) }
