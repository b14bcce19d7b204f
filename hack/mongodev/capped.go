package main

import (
	"bufio"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// Capped collections.
//
// MongoDB removes a capped collection's oldest documents as it inserts new ones. FerretDB
// v1.24.2 trims a capped collection only from a background task that its embedded form leaves
// off (no cleanup interval), or at a compact command: on the development server a capped
// collection grew without end. A tailable cursor's getMore re-runs its query over the whole
// collection (awaitdata.go), so every awaitData wake-up cost more the longer the server ran:
// with three processes tailing the lease operator's events, those getMores took two thirds of
// the server's CPU after ten seconds of contention.
//
// So the proxy trims them itself: it learns which collections are capped (from their create
// command, or by asking once per collection at its first insert) and, every trimEvery inserts
// into one, sends the backend a compact for it, which removes the documents beyond its
// maximum count (and beyond its size), oldest first. A capped collection then holds at most
// its maximum plus trimEvery documents.

// trimEvery is how many inserts into a capped collection go by between two trims.
const trimEvery = 8

// cappedCollections tracks which collections are capped and how many inserts each took since
// its last trim. Its methods run under the exchange lock (roundTrip).
type cappedCollections struct {
	mu     sync.Mutex
	capped map[string]bool // "db.collection": capped or not, as far as known
	since  map[string]int  // capped "db.collection": inserts since its last trim
	reqID  atomic.Int32
}

func newCappedCollections() *cappedCollections {
	return &cappedCollections{capped: map[string]bool{}, since: map[string]int{}}
}

// namespace reads a command's database and collection (its first element's value).
func namespace(body bson.Raw) (db, coll string, ok bool) {
	first, err := body.IndexErr(0)
	if err != nil {
		return "", "", false
	}
	coll, ok1 := first.Value().StringValueOK()
	db, ok2 := body.Lookup("$db").StringValueOK()
	return db, coll, ok1 && ok2
}

// beforeCommand updates what is known from a command about to be forwarded: a create says
// whether its collection is capped; a drop or dropDatabase makes it unknown again.
func (c *cappedCollections) beforeCommand(req []byte) {
	body, _, ok := sections(req)
	if !ok {
		return
	}
	name := commandName(req)
	switch name {
	case "create", "drop", "dropDatabase":
	default:
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if name == "dropDatabase" {
		db, _ := body.Lookup("$db").StringValueOK()
		for ns := range c.capped {
			if strings.HasPrefix(ns, db+".") {
				delete(c.capped, ns)
				delete(c.since, ns)
			}
		}
		return
	}
	db, coll, ok := namespace(body)
	if !ok {
		return
	}
	ns := db + "." + coll
	delete(c.capped, ns)
	delete(c.since, ns)
	if name == "create" {
		if capped, ok := body.Lookup("capped").BooleanOK(); ok && capped {
			c.capped[ns] = true
		}
		// An uncapped create is not recorded: if it fails because the collection exists,
		// the collection is what it was, and the next insert asks.
	}
}

// afterInsert counts an insert that the backend answered and trims its collection every
// trimEvery inserts if it is capped. An error is one of the exchange with the backend (the
// connection is then unusable); a failed trim is otherwise left to the next one.
func (c *cappedCollections) afterInsert(backend net.Conn, br *bufio.Reader, req []byte) error {
	body, _, ok := sections(req)
	if !ok {
		return nil
	}
	db, coll, ok := namespace(body)
	if !ok {
		return nil
	}
	ns := db + "." + coll
	c.mu.Lock()
	capped, known := c.capped[ns]
	c.mu.Unlock()
	if !known {
		var err error
		if capped, err = c.ask(backend, br, db, coll); err != nil {
			return err
		}
		c.mu.Lock()
		c.capped[ns] = capped
		c.mu.Unlock()
	}
	if !capped {
		return nil
	}
	c.mu.Lock()
	c.since[ns]++
	due := c.since[ns] >= trimEvery
	if due {
		c.since[ns] = 0
	}
	c.mu.Unlock()
	if !due {
		return nil
	}
	_, err := c.command(backend, br, bson.D{{Key: "compact", Value: coll}, {Key: "$db", Value: db}})
	return err
}

// ask reads whether db.coll is capped (listCollections). A collection that is not listed
// (an insert that failed before creating it) counts as not capped.
func (c *cappedCollections) ask(backend net.Conn, br *bufio.Reader, db, coll string) (bool, error) {
	resp, err := c.command(backend, br, bson.D{
		{Key: "listCollections", Value: 1},
		{Key: "filter", Value: bson.D{{Key: "name", Value: coll}}},
		{Key: "$db", Value: db},
	})
	if err != nil || resp == nil {
		return false, err
	}
	batch, ok := resp.Lookup("cursor", "firstBatch").ArrayOK()
	if !ok {
		return false, nil
	}
	first, err := batch.IndexErr(0)
	if err != nil {
		return false, nil
	}
	doc, ok := first.DocumentOK()
	if !ok {
		return false, nil
	}
	capped, _ := doc.Lookup("options", "capped").BooleanOK()
	return capped, nil
}

// command sends one command of the proxy's own to the backend and reads its reply: the
// reply's body, nil when the backend answered an error (left alone: the proxy's own commands
// only help).
func (c *cappedCollections) command(backend net.Conn, br *bufio.Reader, cmd bson.D) (bson.Raw, error) {
	b, err := bson.Marshal(cmd)
	if err != nil {
		return nil, fmt.Errorf("capped collections: %w", err)
	}
	resp, err := forward(backend, br, buildOpMsg(-1-c.reqID.Add(1)&0x3fffffff, 0, b))
	if err != nil {
		return nil, err
	}
	if checkOK(resp) != nil {
		return nil, nil
	}
	return opMsgBody(resp), nil
}
