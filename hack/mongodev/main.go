// Command mongodev is a MongoDB-wire-compatible development server for tests and `make run`.
//
// It embeds FerretDB (SQLite backend) listening on an internal loopback port and puts in
// front of it a wire-protocol proxy that forwards one command at a time across all client
// connections. FerretDB on its own overbooks conditional `$inc` updates under concurrency
// (e.g. updateOne({count: {$lt: N}}, {$inc: {count: 1}}) lets more than N through);
// serialized, it does not.
//
//	mongodev [--listen 127.0.0.1:27017] [--dir DIR] [--log-level warn]
//
// Once the backend answers, it prints exactly one line to stdout:
//
//	mongodev listening on mongodb://127.0.0.1:27017/
//
// Data lives in a temporary directory that is removed on exit, unless --dir is given. There is
// no durability: SQLite runs with synchronous(OFF) (see sqlitePragmas).
// SIGINT/SIGTERM stop it cleanly; so does end of file on stdin with --exit-on-stdin-eof
// (used by test harnesses so that the server dies with the test process).
//
// The proxy also hides FerretDB v1.24.2 bugs that MongoDB code would trip over (see
// proxy.go and fixups.go): FerretDB answers requests sent with moreToCome (w:0 writes), which
// the proxy drops; it rejects maxTimeMS on distinct, which the proxy strips; and it crashes
// the connection on a createIndexes listing two or more existing indexes, which the proxy
// sends one index at a time.
//
// Not supported by FerretDB v1.24.2 (the proxy does not help): transactions, $expr,
// pipeline-style updates, $lookup, TTL and partial indexes, endSessions (harmless).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/FerretDB/FerretDB/ferretdb"
)

func main() {
	os.Exit(run())
}

func run() int {
	fs := flag.NewFlagSet("mongodev", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:27017", "address the MongoDB wire-protocol proxy listens on (port 0 picks a free port)")
	dir := fs.String("dir", "", "data directory (created if missing, kept on exit); default: a temporary directory removed on exit")
	slow := fs.Duration("slow-command", 100*time.Millisecond, "log (at info level) every command that holds the store for longer than this; 0: never")
	logLevel := fs.String("log-level", "warn", "FerretDB and proxy log level: debug, info, warn or error")
	stdinEOF := fs.Bool("exit-on-stdin-eof", false, "shut down when stdin reaches end of file (the parent process went away)")
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "mongodev: unexpected arguments: %q\n", fs.Args())
		return 2
	}

	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		fmt.Fprintf(os.Stderr, "mongodev: bad --log-level %q: %v\n", *logLevel, err)
		return 2
	}
	logger := slog.New(&quietHandler{slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})})

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *stdinEOF {
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
		go func() {
			_, _ = io.Copy(io.Discard, os.Stdin)
			cancel()
		}()
	}

	ready := func(proxyAddr, _ string) {
		fmt.Printf("mongodev listening on mongodb://%s/\n", proxyAddr)
	}
	if err := serve(ctx, stop, *listen, *dir, *slow, logger, ready); err != nil {
		fmt.Fprintf(os.Stderr, "mongodev: %v\n", err)
		return 1
	}
	return 0
}

// sqlitePragmas are the SQLite URL parameters of every connection to the data files (FerretDB's
// and idindex.go's). synchronous(OFF): a commit does not wait for the disk. SQLite's default in
// WAL mode (FULL) syncs the WAL file at every commit, which on a disk costs each write
// about a millisecond and a half; the development store promises no durability (its data
// lives in a temporary directory), so a crash of the machine may lose or corrupt it. FerretDB
// adds its own busy_timeout, journal_mode(wal) and auto_vacuum to these.
const sqlitePragmas = "_pragma=synchronous(OFF)"

// serve runs FerretDB and the proxy until ctx is done. ready is called with the proxy's and
// FerretDB's addresses once FerretDB answers and the proxy listens. stopSignals is called
// once shutdown starts, so that a second SIGINT kills the process the default way.
func serve(ctx context.Context, stopSignals func(), listen, dir string, slow time.Duration, logger *slog.Logger, ready func(proxyAddr, backendAddr string)) error {
	dataDir, cleanup, err := prepareDir(dir)
	if err != nil {
		return err
	}
	defer cleanup()

	fdb, err := ferretdb.New(&ferretdb.Config{
		Listener:  ferretdb.ListenerConfig{TCP: "127.0.0.1:0"},
		Logger:    logger,
		Handler:   "sqlite",
		SQLiteURL: (&url.URL{Scheme: "file", Path: dataDir + "/", RawQuery: sqlitePragmas}).String(),
	})
	if err != nil {
		return fmt.Errorf("start FerretDB: %w", err)
	}
	// The listener is bound by New, so the URI (with the picked port) is known already.
	u, err := url.Parse(fdb.MongoDBURI())
	if err != nil {
		return fmt.Errorf("FerretDB URI: %w", err)
	}
	backendAddr := u.Host

	fdbCtx, fdbCancel := context.WithCancel(context.Background())
	defer fdbCancel()
	fdbDone := make(chan struct{})
	go func() {
		defer close(fdbDone)
		_ = fdb.Run(fdbCtx)
	}()
	stopBackend := func() {
		fdbCancel()
		select {
		case <-fdbDone:
		case <-time.After(10 * time.Second):
			logger.Warn("FerretDB did not stop within 10s")
		}
	}

	if err := waitBackend(ctx, backendAddr, 30*time.Second); err != nil {
		stopBackend()
		return fmt.Errorf("FerretDB at %s did not answer: %w", backendAddr, err)
	}

	ln, err := net.Listen("tcp", listen)
	if err != nil {
		stopBackend()
		return fmt.Errorf("listen: %w", err)
	}
	p := newProxy(backendAddr, logger)
	p.slow = slow
	p.ids = newIDIndexer(dataDir, logger)
	defer p.ids.close()
	served := make(chan struct{})
	go func() {
		defer close(served)
		p.serve(ln)
	}()

	ready(ln.Addr().String(), backendAddr)

	<-ctx.Done()
	stopSignals()
	logger.Info("shutting down")
	_ = ln.Close()
	<-served
	p.closeAll()
	stopBackend()
	return nil
}

// prepareDir returns the absolute data directory and a function that removes it when it is
// a temporary one.
func prepareDir(dir string) (string, func(), error) {
	if dir == "" {
		tmp, err := os.MkdirTemp("", "mongodev-")
		if err != nil {
			return "", nil, err
		}
		return tmp, func() { _ = os.RemoveAll(tmp) }, nil
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", nil, err
	}
	if err := os.MkdirAll(abs, 0o755); err != nil {
		return "", nil, err
	}
	return strings.TrimSuffix(abs, "/"), func() {}, nil
}

// waitBackend pings addr until it answers {ok: 1} or the timeout expires.
func waitBackend(ctx context.Context, addr string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var lastErr error
	for {
		if lastErr = pingOnce(addr, time.Until(deadline)); lastErr == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return lastErr
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func pingOnce(addr string, timeout time.Duration) error {
	if timeout < time.Second {
		timeout = time.Second
	}
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return err
	}
	defer func() { _ = c.Close() }()
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write(pingMessage(1)); err != nil {
		return err
	}
	resp, err := readMessage(c)
	if err != nil {
		return err
	}
	return checkOK(resp)
}

// quietHandler demotes FerretDB's warnings about error responses ("Response header: ...",
// "Response message: ..." for every reply with ok: 0, such as a duplicate key or the
// unsupported endSessions every driver sends on disconnect) to debug: they are routine for
// a test server. Errors (responses that close the connection) stay errors.
type quietHandler struct{ slog.Handler }

func (h *quietHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Level == slog.LevelWarn && strings.HasPrefix(r.Message, "Response ") {
		r.Level = slog.LevelDebug
		if !h.Enabled(ctx, r.Level) {
			return nil
		}
	}
	return h.Handler.Handle(ctx, r)
}

func (h *quietHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &quietHandler{h.Handler.WithAttrs(attrs)}
}

func (h *quietHandler) WithGroup(name string) slog.Handler {
	return &quietHandler{h.Handler.WithGroup(name)}
}
