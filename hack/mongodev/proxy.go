package main

import (
	"bufio"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
	"syscall"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// proxy forwards wire-protocol messages from each client connection to its own backend
// connection, one request/response exchange at a time across all connections.
type proxy struct {
	backendAddr string
	logger      *slog.Logger

	// exchange is held from writing a request to the backend until its response has been
	// read: the backend executes one command at a time.
	exchange sync.Mutex
	// slow is the threshold of the slow-command log (noteSlow); 0: off.
	slow time.Duration
	// ids indexes collection tables for FerretDB's _id lookups (idindex.go); nil: off.
	ids *idIndexer
	// capped keeps capped collections at their size (capped.go).
	capped *cappedCollections

	// insMu guards insGen and inserted: the count of forwarded inserts, and a channel closed
	// at the next one, for the awaitData getMores the proxy parks (awaitdata.go).
	insMu    sync.Mutex
	insGen   uint64
	inserted chan struct{}

	// awaitMu guards awaitCursors: the ids of the tailable cursors the proxy opened for
	// clients' awaitData finds, whose waiting it serves (awaitdata.go).
	awaitMu      sync.Mutex
	awaitCursors map[int64]struct{}

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

func newProxy(backendAddr string, logger *slog.Logger) *proxy {
	return &proxy{backendAddr: backendAddr, logger: logger, conns: make(map[net.Conn]struct{}),
		inserted: make(chan struct{}), awaitCursors: make(map[int64]struct{}), capped: newCappedCollections()}
}

// serve accepts client connections until ln is closed.
func (p *proxy) serve(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) {
				p.logger.Warn("accept", "err", err)
				continue
			}
			p.logger.Error("accept", "err", err)
			return
		}
		if !p.track(c) {
			_ = c.Close()
			continue
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer p.untrack(c)
			p.handle(c)
		}()
	}
}

// closeAll closes every client and backend connection and waits for their handlers.
func (p *proxy) closeAll() {
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	_ = c.Close()
}

func (p *proxy) handle(client net.Conn) {
	backend, err := net.Dial("tcp", p.backendAddr)
	if err != nil {
		p.logger.Warn("dial backend", "err", err)
		return
	}
	if !p.track(backend) {
		_ = backend.Close()
		return
	}
	defer p.untrack(backend)

	log := p.logger.With("client", client.RemoteAddr().String())
	log.Debug("connected")
	cr := bufio.NewReaderSize(client, 64<<10)
	br := bufio.NewReaderSize(backend, 64<<10)
	var seen uint64 // inserts forwarded when this connection's last awaitData getMore looked
	for {
		req, err := readMessage(cr)
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				log.Debug("read request", "err", err)
			}
			log.Debug("disconnected")
			return
		}
		var resps [][]byte
		switch {
		case p.awaitsData(req):
			resps, err = p.awaitData(backend, br, req, &seen)
		case monitoring(req):
			resps, err = forwardAll(backend, br, req)
		default:
			if find := awaitFind(req); find != nil {
				if resps, err = p.roundTrip(backend, br, find); err == nil {
					p.noteAwaitCursor(resps)
				}
				break
			}
			p.forgetCursors(req)
			resps, err = p.roundTrip(backend, br, req)
		}
		if err != nil {
			log.Debug("backend exchange", "err", err)
			return
		}
		// The backend has finished the command: writing to the client needs no lock, so a
		// client that is slow to read cannot stall the others.
		for _, resp := range resps {
			if _, err := client.Write(resp); err != nil {
				log.Debug("write response", "err", err)
				return
			}
		}
	}
}

// roundTrip writes req to the backend and reads its responses, under the global lock. (A
// getMore that may wait for data goes to awaitData instead, without the lock: holding it
// while the backend waits would stall every other client for up to its maxTimeMS.)
// A response with moreToCome (exhaust) is followed by more responses, read until one
// without it.
//
// A request with moreToCome (e.g. a w:0 write) expects no response, and the client gets
// none. FerretDB v1.24.2 answers it all the same (internal/clientconn/conn.go answers every
// request), so the proxy reads that answer and drops it: forwarding it would hand the
// client a stale reply to its next request, and not reading it would leave it in the
// backend connection to be taken for the reply to the next request.
func (p *proxy) roundTrip(backend net.Conn, br *bufio.Reader, req []byte) ([][]byte, error) {
	p.exchange.Lock()
	defer p.exchange.Unlock()
	defer p.noteSlow(req, time.Now())
	if commandName(req) == "insert" {
		defer p.insertForwarded() // after the answer: the documents are there
	}

	if subs := splitCreateIndexes(req); subs != nil {
		resp, err := createIndexesOneByOne(backend, br, req, subs)
		if err != nil {
			return nil, err
		}
		return [][]byte{resp}, nil
	}
	defer p.ids.afterCommand(req)
	p.capped.beforeCommand(req)
	if resp, handled, err := answerFieldFind(backend, br, p.ids, req); handled {
		if err != nil {
			return nil, err
		}
		return [][]byte{resp}, nil
	}
	if resp, handled, err := pushdownWrite(backend, br, req); handled {
		if err != nil {
			return nil, err
		}
		return [][]byte{resp}, nil
	}
	if _, err := backend.Write(fixupRequest(req)); err != nil {
		return nil, err
	}
	if moreToCome(req) {
		if _, err := readMessage(br); err != nil {
			return nil, err
		}
		return nil, nil
	}
	var resps [][]byte
	for {
		resp, err := readMessage(br)
		if err != nil {
			return nil, err
		}
		resps = append(resps, resp)
		if !moreToCome(resp) {
			if commandName(req) == "insert" && checkOK(resp) == nil {
				if err := p.capped.afterInsert(backend, br, req); err != nil {
					return nil, err
				}
			}
			return resps, nil
		}
	}
}

// noteSlow logs req (at info level) when it held the exchange lock since start for longer than
// the proxy's slow threshold (--slow-command): every other client waited that long.
func (p *proxy) noteSlow(req []byte, start time.Time) {
	if d := time.Since(start); p.slow > 0 && d > p.slow {
		p.logger.Info("slow command", "command", commandName(req), "target", commandTarget(req), "held", d.Round(time.Millisecond))
	}
}

// commandTarget is the collection req works on: its first element's value for most commands,
// the collection field of a getMore (whose first element is the cursor's id), or "".
func commandTarget(req []byte) string {
	body, _, ok := sections(req)
	if !ok {
		return ""
	}
	doc := bson.Raw(body)
	first, err := doc.IndexErr(0)
	if err != nil {
		return ""
	}
	if first.Key() == "getMore" {
		s, _ := doc.Lookup("collection").StringValueOK()
		return s
	}
	s, _ := first.Value().StringValueOK()
	return s
}

// monitoring reports whether req is a handshake or monitoring command (hello, isMaster),
// forwarded without the exchange lock. FerretDB answers them without touching its database,
// and the driver measures its round-trip time on them: queued behind a long command, they
// would inflate that estimate, from which the driver derives every command's maxTimeMS (the
// operation's remaining time minus it); FerretDB then interrupts ordinary commands at a
// maxTimeMS of a few milliseconds ("interrupted (9)"), as seen under load on make run and in
// e2e. ping is not one of them: FerretDB reads its database's status for it, and a read
// beside a write makes SQLite answer "database is locked".
func monitoring(req []byte) bool {
	if moreToCome(req) {
		return false
	}
	switch commandName(req) {
	case "hello", "isMaster", "ismaster":
		return true
	}
	return false
}

// forwardAll writes req and reads its response without the lock.
func forwardAll(backend net.Conn, br *bufio.Reader, req []byte) ([][]byte, error) {
	if _, err := backend.Write(fixupRequest(req)); err != nil {
		return nil, err
	}
	resp, err := readMessage(br)
	if err != nil {
		return nil, err
	}
	return [][]byte{resp}, nil
}
