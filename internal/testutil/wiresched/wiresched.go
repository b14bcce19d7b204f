// Package wiresched holds the store commands of simulated processes at the wire, so that a
// test decides the order in which they reach the server and what becomes of each: delivered,
// lost before the server sees it, lost after the server applied it (the process hears an
// error, the write stands), or never sent at all (the process is dead). A delivered write can
// be delivered once more later, as a network that duplicates and delays would.
//
// Each simulated process connects its own client to its own listener (Process). Handshake
// and monitoring commands pass at once; every other command waits in Pending until the test
// decides its fate (Run). The package knows nothing of the lease store: it frames MongoDB
// wire messages (a 16-byte header whose first int32 is the length) and reads the command's
// name and first document to describe it.
package wiresched

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// Fate is what becomes of a held command.
type Fate int

const (
	// Deliver sends the command and hands its answer back.
	Deliver Fate = iota
	// LoseBefore breaks the connection before the server sees the command.
	LoseBefore
	// LoseAfter sends the command, waits for the server's answer, and breaks the connection
	// instead of handing it back: the write applied, its process hears a network error.
	LoseAfter
	// Freeze never sends the command: its process is dead from here on.
	Freeze
)

func (f Fate) String() string {
	return [...]string{"deliver", "lose-before", "lose-after", "freeze"}[f]
}

// Command is one held command of a process.
type Command struct {
	// Proc is the process that sent it; Seq numbers commands in the order they arrived.
	Proc int
	Seq  int
	// Name is the command's name ("update", "findAndModify", ...), Target its collection.
	Name   string
	Target string
	// Doc is a short text of the command's first statement (filter and update).
	Doc string

	req  []byte
	fate chan Fate
	done chan struct{}
	// broken: the process's side of the connection was gone when the command was delivered
	// (its driver gave up waiting): the write reached the server, the answer nobody.
	broken bool
}

// Broken reports whether the command's process had given up on it when it was delivered:
// a write delivered late, as a network that delays would (a fault of its own).
func (c *Command) Broken() bool { return c.broken }

func (c *Command) String() string {
	return fmt.Sprintf("p%d #%d %s %s %s", c.Proc, c.Seq, c.Name, c.Target, c.Doc)
}

// Write reports whether the command changes documents (what a late duplicate may repeat).
func (c *Command) Write() bool {
	switch c.Name {
	case "insert", "update", "delete", "findAndModify":
		return true
	}
	return false
}

// Scheduler holds the commands of every process.
type Scheduler struct {
	backend string

	mu      sync.Mutex
	pending []*Command
	seq     int
	arrived chan struct{}
	lns     []net.Listener
	conns   []net.Conn
	closed  chan struct{}
	wg      sync.WaitGroup
}

// New returns a scheduler that forwards to the server at backend (host:port).
func New(backend string) *Scheduler {
	return &Scheduler{backend: backend, arrived: make(chan struct{}), closed: make(chan struct{})}
}

// Process opens the listener of process id and returns its address.
func (s *Scheduler) Process(id int) (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	s.mu.Lock()
	s.lns = append(s.lns, ln)
	s.mu.Unlock()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				s.serve(id, c)
			}()
		}
	}()
	return ln.Addr().String(), nil
}

// Close stops every listener and connection; held commands are never sent.
func (s *Scheduler) Close() {
	s.mu.Lock()
	select {
	case <-s.closed:
	default:
		close(s.closed)
	}
	for _, ln := range s.lns {
		_ = ln.Close()
	}
	for _, c := range s.conns {
		_ = c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// Pending returns the held commands, oldest first.
func (s *Scheduler) Pending() []*Command {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*Command(nil), s.pending...)
}

// Await waits until ready reports true of the held commands, or until timeout; it reports
// whether ready did.
func (s *Scheduler) Await(timeout time.Duration, ready func([]*Command) bool) bool {
	deadline := time.Now().Add(timeout)
	for {
		s.mu.Lock()
		ok := ready(append([]*Command(nil), s.pending...))
		ch := s.arrived
		s.mu.Unlock()
		if ok {
			return true
		}
		left := time.Until(deadline)
		if left <= 0 {
			return false
		}
		select {
		case <-ch:
		case <-time.After(left):
		}
	}
}

// Run decides the fate of c, a held command, and returns when it is settled: answered (or
// its connection broken) for Deliver, LoseBefore and LoseAfter, at once for Freeze.
func (s *Scheduler) Run(c *Command, f Fate) {
	s.mu.Lock()
	for i, p := range s.pending {
		if p == c {
			s.pending = append(s.pending[:i], s.pending[i+1:]...)
			break
		}
	}
	s.mu.Unlock()
	c.fate <- f
	if f != Freeze {
		<-c.done
	}
}

// Replay delivers c, a write delivered before, once more, on a connection of its own, and
// drops the answer: a late duplicate of the network.
func (s *Scheduler) Replay(c *Command) error {
	conn, err := net.DialTimeout("tcp", s.backend, 5*time.Second)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := conn.Write(c.req); err != nil {
		return err
	}
	_, err = readMessage(bufio.NewReader(conn))
	return err
}

func (s *Scheduler) track(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-s.closed:
		return false
	default:
	}
	s.conns = append(s.conns, c)
	return true
}

// serve carries one client connection of process proc.
func (s *Scheduler) serve(proc int, client net.Conn) {
	defer func() { _ = client.Close() }()
	if !s.track(client) {
		return
	}
	backend, err := net.DialTimeout("tcp", s.backend, 5*time.Second)
	if err != nil {
		return
	}
	defer func() { _ = backend.Close() }()
	if !s.track(backend) {
		return
	}
	cr, br := bufio.NewReader(client), bufio.NewReader(backend)
	for {
		req, err := readMessage(cr)
		if err != nil {
			return
		}
		name, target, doc := describe(req)
		if passes(name) {
			if !exchange(client, backend, br, req) {
				return
			}
			continue
		}
		c := &Command{Proc: proc, Name: name, Target: target, Doc: doc, req: req,
			fate: make(chan Fate, 1), done: make(chan struct{})}
		s.mu.Lock()
		s.seq++
		c.Seq = s.seq
		s.pending = append(s.pending, c)
		close(s.arrived)
		s.arrived = make(chan struct{})
		s.mu.Unlock()
		var f Fate
		select {
		case f = <-c.fate:
		case <-s.closed:
			return
		}
		switch f {
		case Freeze:
			<-s.closed
			return
		case LoseBefore:
			close(c.done)
			return
		case LoseAfter:
			_, _ = backend.Write(req)
			_, _ = readMessage(br)
			close(c.done)
			return
		}
		ok := exchange(client, backend, br, req)
		c.broken = !ok
		close(c.done)
		if !ok {
			return
		}
	}
}

// exchange sends req and hands every answer back (an exhaust answer is followed by more).
func exchange(client, backend net.Conn, br *bufio.Reader, req []byte) bool {
	if _, err := backend.Write(req); err != nil {
		return false
	}
	if moreToCome(req) {
		return true
	}
	for {
		resp, err := readMessage(br)
		if err != nil {
			return false
		}
		if _, err := client.Write(resp); err != nil {
			return false
		}
		if !moreToCome(resp) {
			return true
		}
	}
}

// passes lists the commands that are never held: handshakes, monitoring, sessions.
func passes(name string) bool {
	switch name {
	case "hello", "isMaster", "ismaster", "ping", "buildInfo", "buildinfo", "endSessions",
		"saslStart", "saslContinue", "getParameter", "killCursors", "":
		return true
	}
	return false
}

const (
	headerLen     = 16
	opMsg         = 2013
	flagMoreCome  = 1 << 1
	maxMessageLen = 64 << 20
)

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

func moreToCome(msg []byte) bool {
	return len(msg) >= headerLen+4 && int32(binary.LittleEndian.Uint32(msg[12:16])) == opMsg &&
		binary.LittleEndian.Uint32(msg[headerLen:headerLen+4])&flagMoreCome != 0
}

// describe reads an OP_MSG's command name, its collection and a short text of its first
// statement: the body's filter or query, or the first document of a document sequence
// (updates, deletes, documents).
func describe(msg []byte) (name, target, doc string) {
	if len(msg) < headerLen+5 || int32(binary.LittleEndian.Uint32(msg[12:16])) != opMsg {
		return "", "", ""
	}
	var body bson.Raw
	var first bson.Raw
	rest := msg[headerLen+4:]
	for len(rest) > 0 {
		kind := rest[0]
		rest = rest[1:]
		switch kind {
		case 0:
			if len(rest) < 4 {
				return name, target, doc
			}
			n := int(binary.LittleEndian.Uint32(rest))
			if n > len(rest) {
				return name, target, doc
			}
			body = bson.Raw(rest[:n])
			rest = rest[n:]
		case 1:
			if len(rest) < 4 {
				return name, target, doc
			}
			n := int(binary.LittleEndian.Uint32(rest))
			if n > len(rest) {
				return name, target, doc
			}
			seq := rest[4:n]
			rest = rest[n:]
			i := strings.IndexByte(string(seq), 0)
			if i < 0 {
				continue
			}
			docs := seq[i+1:]
			if len(docs) >= 4 && first == nil {
				m := int(binary.LittleEndian.Uint32(docs))
				if m <= len(docs) {
					first = bson.Raw(docs[:m])
				}
			}
		default:
			return name, target, doc
		}
	}
	if body == nil {
		return "", "", ""
	}
	if e, err := body.IndexErr(0); err == nil {
		name = e.Key()
		target, _ = e.Value().StringValueOK()
	}
	var parts []string
	for _, k := range []string{"query", "filter", "update", "updates", "deletes"} {
		if v, err := body.LookupErr(k); err == nil {
			parts = append(parts, k+"="+v.String())
		}
	}
	if first != nil {
		parts = append(parts, first.String())
	}
	doc = strings.Join(parts, " ")
	if len(doc) > 240 {
		doc = doc[:240] + "…"
	}
	return name, target, doc
}
