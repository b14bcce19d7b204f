package main

import (
	"bytes"
	"encoding/binary"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// buildMsg builds an OP_MSG with a body section for cmd, a kind-1 section, and maybe a checksum.
func buildMsg(t *testing.T, flags uint32, cmd bson.D, checksum bool) []byte {
	t.Helper()
	body, err := bson.Marshal(cmd)
	if err != nil {
		t.Fatal(err)
	}
	seq, _ := bson.Marshal(bson.D{{Key: "q", Value: 1}})
	msg := make([]byte, headerLen)
	msg = binary.LittleEndian.AppendUint32(msg, flags)
	msg = append(msg, 0)
	msg = append(msg, body...)
	msg = append(msg, 1)
	msg = binary.LittleEndian.AppendUint32(msg, uint32(4+len("updates")+1+len(seq)))
	msg = append(msg, "updates\x00"...)
	msg = append(msg, seq...)
	if checksum {
		msg = binary.LittleEndian.AppendUint32(msg, 0xdeadbeef)
	}
	binary.LittleEndian.PutUint32(msg[0:4], uint32(len(msg)))
	binary.LittleEndian.PutUint32(msg[12:16], opMsg)
	return msg
}

func TestFixupRequest(t *testing.T) {
	distinct := bson.D{{Key: "distinct", Value: "c"}, {Key: "key", Value: "pod"}, {Key: "maxTimeMS", Value: int64(999)}, {Key: "$db", Value: "d"}}
	for _, checksum := range []bool{false, true} {
		flags := uint32(0)
		if checksum {
			flags = flagChecksumPresent
		}
		in := buildMsg(t, flags, distinct, checksum)
		out := fixupRequest(in)
		want := buildMsg(t, 0, bson.D{{Key: "distinct", Value: "c"}, {Key: "key", Value: "pod"}, {Key: "$db", Value: "d"}}, false)
		if !bytes.Equal(out, want) {
			t.Errorf("checksum=%v:\n got % x\nwant % x", checksum, out, want)
		}
		got, err := readMessage(bytes.NewReader(out))
		if err != nil || !bytes.Equal(got, out) {
			t.Errorf("re-read: %v", err)
		}
	}

	// Any other command loses it too, getMore included (the proxy serves an awaitData
	// cursor's wait): FerretDB would end SQLite statements mid-call.
	update := bson.D{{Key: "update", Value: "c"}, {Key: "maxTimeMS", Value: int64(5)}, {Key: "$db", Value: "d"}}
	if out, want := fixupRequest(buildMsg(t, 0, update, false)),
		buildMsg(t, 0, bson.D{{Key: "update", Value: "c"}, {Key: "$db", Value: "d"}}, false); !bytes.Equal(out, want) {
		t.Errorf("update with maxTimeMS:\n got % x\nwant % x", out, want)
	}
	getMore := bson.D{{Key: "getMore", Value: int64(7)}, {Key: "collection", Value: "c"}, {Key: "maxTimeMS", Value: int64(5)}}
	if out, want := fixupRequest(buildMsg(t, 0, getMore, false)),
		buildMsg(t, 0, getMore[:2], false); !bytes.Equal(out, want) {
		t.Errorf("getMore with maxTimeMS:\n got % x\nwant % x", out, want)
	}

	// Left alone: commands without maxTimeMS, other opcodes, garbage.
	for _, in := range [][]byte{
		buildMsg(t, flagMoreToCome, bson.D{{Key: "distinct", Value: "c"}, {Key: "key", Value: "pod"}}, false),
		pingMessage(3),
		append(make([]byte, 12), 0xd4, 0x07, 0, 0), // OP_QUERY header only
		append(buildMsg(t, 0, distinct, false)[:headerLen+6], 0xff, 0xff),
	} {
		if out := fixupRequest(in); !bytes.Equal(out, in) {
			t.Errorf("changed % x\n     to % x", in, out)
		}
	}
}

func TestMoreToCome(t *testing.T) {
	if moreToCome(pingMessage(1)) {
		t.Error("ping has moreToCome")
	}
	if !moreToCome(buildMsg(t, flagMoreToCome, bson.D{{Key: "insert", Value: "c"}}, false)) {
		t.Error("moreToCome not seen")
	}
}

func TestSplitCreateIndexes(t *testing.T) {
	idx := func(name string) bson.D {
		return bson.D{{Key: "key", Value: bson.D{{Key: name, Value: int32(1)}, {Key: "b", Value: int32(-1)}}}, {Key: "name", Value: name}}
	}
	cmd := func(indexes ...any) bson.D {
		return bson.D{{Key: "createIndexes", Value: "c"}, {Key: "indexes", Value: bson.A(indexes)}, {Key: "maxTimeMS", Value: int64(7)}, {Key: "$db", Value: "d"}}
	}
	body, _ := bson.Marshal(cmd(idx("x"), idx("y")))
	in := buildOpMsg(42, 0, body)
	subs := splitCreateIndexes(in)
	if len(subs) != 2 {
		t.Fatalf("%d sub-commands", len(subs))
	}
	for i, name := range []string{"x", "y"} {
		want, _ := bson.Marshal(cmd(idx(name)))
		if !bytes.Equal(subs[i], buildOpMsg(42, 0, want)) {
			t.Errorf("sub-command %d: % x", i, subs[i])
		}
	}
	one, _ := bson.Marshal(cmd(idx("x")))
	for _, msg := range [][]byte{
		buildOpMsg(1, 0, one),
		buildMsg(t, 0, cmd(idx("x"), idx("y")), false), // has a document sequence section
		buildMsg(t, flagMoreToCome, cmd(idx("x"), idx("y")), false),
		pingMessage(2),
	} {
		if subs := splitCreateIndexes(msg); subs != nil {
			t.Errorf("split % x", msg)
		}
	}
}

func TestAwaitFind(t *testing.T) {
	body := func(cmd bson.D) []byte {
		b, err := bson.Marshal(cmd)
		if err != nil {
			t.Fatal(err)
		}
		return buildOpMsg(1, 0, b)
	}
	find := func(awaitData bool) bson.D {
		return bson.D{{Key: "find", Value: "events"}, {Key: "filter", Value: bson.D{}}, {Key: "tailable", Value: true},
			{Key: "awaitData", Value: awaitData}, {Key: "batchSize", Value: int32(1)}, {Key: "$db", Value: "d"}}
	}
	if got, want := awaitFind(body(find(true))), body(find(false)); !bytes.Equal(got, want) {
		t.Errorf("awaitData find:\n got % x\nwant % x", got, want)
	}
	for name, in := range map[string][]byte{
		"awaitData false": body(find(false)),
		"no awaitData":    body(bson.D{{Key: "find", Value: "events"}, {Key: "tailable", Value: true}, {Key: "$db", Value: "d"}}),
		"not a find":      body(bson.D{{Key: "aggregate", Value: "events"}, {Key: "awaitData", Value: true}, {Key: "$db", Value: "d"}}),
		"ping":            pingMessage(2),
	} {
		if got := awaitFind(in); got != nil {
			t.Errorf("%s: rewritten to % x", name, got)
		}
	}
}
