// Command fenced-store is an example of a service a lease protects, guarded by fences
// (docs/fencing.md): a small document store that one holder at a time may write. Every write
// carries the writer's lease fence in the header Lease-Fence; the store keeps the highest
// fence it has seen per document (leaseclient.Guard) and refuses a write with a lower one,
// with 409. So a holder that paused past its TTL, was reaped, and whose slot went to another
// holder, cannot overwrite its successor's work when it resumes.
//
//	fenced-store -listen 127.0.0.1:8099
//	curl -X PUT -H 'Lease-Fence: 7' --data 'chapter 1' http://127.0.0.1:8099/docs/thesis
//	curl http://127.0.0.1:8099/docs/thesis
//
// It prints "listening on ADDR" once it serves.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"strconv"
	"sync"

	"github.com/vancetope/lease-operator/pkg/leaseclient"
)

// HeaderFence is the request header that carries the writer's lease fence.
const HeaderFence = "Lease-Fence"

// store keeps documents by name, each with the fence of its last write.
type store struct {
	guard leaseclient.Guard
	mu    sync.Mutex
	docs  map[string]doc
}

type doc struct {
	Body  string `json:"body"`
	Fence int64  `json:"fence"`
}

func (s *store) put(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	fence, err := strconv.ParseInt(r.Header.Get(HeaderFence), 10, 64)
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "header " + HeaderFence + " must carry the writer's lease fence"})
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
		return
	}
	// The guard decides and the write happens under one lock: no higher fence can be
	// admitted between the two.
	err = s.guard.Do(name, fence, func() error {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.docs[name] = doc{Body: string(body), Fence: fence}
		return nil
	})
	var stale *leaseclient.StaleFenceError
	switch {
	case errors.As(err, &stale):
		writeJSON(w, http.StatusConflict, map[string]any{"error": "STALE_FENCE", "message": stale.Error(), "highest": stale.Highest})
	case err != nil:
		writeJSON(w, http.StatusInternalServerError, map[string]string{"error": err.Error()})
	default:
		writeJSON(w, http.StatusOK, doc{Body: string(body), Fence: fence})
	}
}

func (s *store) get(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	d, ok := s.docs[r.PathValue("name")]
	s.mu.Unlock()
	if !ok {
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "no such document"})
		return
	}
	writeJSON(w, http.StatusOK, d)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func main() {
	listen := flag.String("listen", "127.0.0.1:8099", "address to serve on")
	flag.Parse()
	s := &store{docs: map[string]doc{}}
	mux := http.NewServeMux()
	mux.HandleFunc("PUT /docs/{name}", s.put)
	mux.HandleFunc("GET /docs/{name}", s.get)
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("listening on %s\n", ln.Addr())
	log.Fatal(http.Serve(ln, mux)) //nolint:gosec // an example; see docs/fencing.md
}
