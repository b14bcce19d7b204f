package tenantview

import (
	"context"
	"embed"
	"encoding/base64"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/clock"
)

// Paths of the view.
const (
	PathIndex  = "/"
	PathRevoke = "/revoke"
	PathStatic = "/static/"
	// PathEvents streams server-sent events: "change" when what the page shows changed.
	PathEvents = "/events"
)

// DefaultTimeout bounds the API calls of one page.
const DefaultTimeout = 15 * time.Second

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// Option configures a Server.
type Option func(*Server)

// WithClock sets the clock ages and idle times are measured with (tests).
func WithClock(c clock.PassiveClock) Option { return func(s *Server) { s.clock = c } }

// WithLogger sets the logger (default: discard).
func WithLogger(l logr.Logger) Option { return func(s *Server) { s.log = l } }

// WithTimeout bounds the API calls of one request.
func WithTimeout(d time.Duration) Option { return func(s *Server) { s.timeout = d } }

// Server serves the view of one namespace.
type Server struct {
	src       Source
	namespace string
	clock     clock.PassiveClock
	log       logr.Logger
	timeout   time.Duration
	sessions  *sessions
	pages     map[string]*template.Template
}

// New returns the view of namespace over src.
func New(src Source, namespace string, opts ...Option) (*Server, error) {
	if src == nil {
		return nil, errors.New("tenant view: a source is required")
	}
	if errs := validation.IsDNS1123Label(namespace); len(errs) > 0 {
		return nil, fmt.Errorf("tenant view: namespace %q: %s", namespace, strings.Join(errs, "; "))
	}
	ss, err := newSessions()
	if err != nil {
		return nil, fmt.Errorf("tenant view: session key: %w", err)
	}
	s := &Server{src: src, namespace: namespace, clock: clock.RealClock{}, log: logr.Discard(),
		timeout: DefaultTimeout, sessions: ss, pages: map[string]*template.Template{}}
	for _, opt := range opts {
		opt(s)
	}
	for _, page := range []string{"index", "confirm", "error"} {
		t, err := template.New("layout.html").Funcs(template.FuncMap{"idleLabel": idleLabel}).
			ParseFS(templateFS, "templates/layout.html", "templates/partials.html", "templates/"+page+".html")
		if err != nil {
			return nil, fmt.Errorf("tenant view: template %s: %w", page, err)
		}
		s.pages[page] = t
	}
	return s, nil
}

// HostsOf returns the Host header values under which a listener on addr is reached from
// this machine. Handler refuses every other Host, so that a web page of another origin
// cannot read the view through a DNS name rebound to 127.0.0.1.
func HostsOf(addr net.Addr) []string {
	tcp, ok := addr.(*net.TCPAddr)
	if !ok {
		return []string{addr.String()}
	}
	port := fmt.Sprint(tcp.Port)
	hosts := []string{net.JoinHostPort(tcp.IP.String(), port)}
	if tcp.IP.IsLoopback() || tcp.IP.IsUnspecified() {
		hosts = append(hosts, net.JoinHostPort("localhost", port), net.JoinHostPort("127.0.0.1", port), net.JoinHostPort("::1", port))
	}
	return hosts
}

// Handler returns the view's routes, answering only requests whose Host is one of hosts.
func (s *Server) Handler(hosts ...string) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+PathIndex+"{$}", s.index)
	mux.HandleFunc("GET "+PathRevoke, s.confirm)
	mux.HandleFunc("POST "+PathRevoke, s.revoke)
	mux.HandleFunc("GET "+PathEvents, s.events)
	static, _ := fs.Sub(staticFS, "static") // the directory is embedded above
	mux.Handle("GET "+PathStatic, http.StripPrefix(PathStatic, http.FileServerFS(static)))
	allowed := map[string]bool{}
	for _, h := range hosts {
		allowed[h] = true
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		securityHeaders(w.Header())
		if !allowed[r.Host] {
			http.Error(w, "unexpected Host header: open the address kubectl lease ui printed", http.StatusMisdirectedRequest)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// securityHeaders keep the pages self-contained: nothing is loaded from elsewhere, no inline
// script runs, no other site frames them, and no page is cached.
func securityHeaders(h http.Header) {
	h.Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; script-src 'self'; img-src 'self'; connect-src 'self'; "+
		"form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	// same-origin, not no-referrer: with no-referrer Chromium sends "Origin: null" on the
	// view's own form POSTs, which the Origin check refuses.
	h.Set("Referrer-Policy", "same-origin")
	h.Set("Cache-Control", "no-store")
}

// flash is the message shown once after a revocation.
type flash struct {
	Kind   string // "revoked" or "gone"
	Holder string
}

// indexData is the main page's model.
type indexData struct {
	Page
	CSRF  string
	Flash *flash
	Title string
}

func (s *Server) index(w http.ResponseWriter, r *http.Request) {
	token := s.sessions.token(w, r)
	fl := s.takeFlash(w, r)
	ctx, cancel := context.WithTimeout(r.Context(), s.timeout)
	defer cancel()
	holders, err := s.src.ListHolders(ctx, s.namespace)
	if err != nil {
		s.apiError(w, r, "listing the holders", err)
		return
	}
	counters, err := s.src.ListCounters(ctx, s.namespace)
	if err != nil {
		s.apiError(w, r, "listing the counters", err)
		return
	}
	waiters, err := s.src.ListWaiters(ctx, s.namespace)
	if err != nil {
		s.apiError(w, r, "listing the waiters", err)
		return
	}
	can, err := s.src.CanRevoke(ctx, s.namespace)
	if err != nil {
		// Without an answer the button is not shown; the list is still useful.
		s.log.Error(err, "Asking whether holders may be revoked", "namespace", s.namespace)
		can = false
	}
	page := buildPage(s.namespace, s.clock.Now(), holders, counters, waiters, can)
	s.render(w, http.StatusOK, "index", indexData{Page: page, CSRF: token, Flash: fl, Title: "Leases in " + s.namespace})
}

// confirmData is the confirmation page's model.
type confirmData struct {
	Namespace string
	Holder    HolderRow
	CanRevoke bool
	CSRF      string
	Title     string
}

// confirm is the step between the revoke link and the POST: it shows the holder and asks.
func (s *Server) confirm(w http.ResponseWriter, r *http.Request) {
	token := s.sessions.token(w, r)
	name := r.URL.Query().Get("holder")
	if !validHolderName(name) {
		s.render(w, http.StatusBadRequest, "error", s.errorData("No such holder", "The link names no valid holder.", ""))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.timeout)
	defer cancel()
	holders, err := s.src.ListHolders(ctx, s.namespace)
	if err != nil {
		s.apiError(w, r, "reading the holder", err)
		return
	}
	var found *Holder
	for i := range holders {
		if holders[i].Name == name {
			found = &holders[i]
		}
	}
	if found == nil {
		s.setFlash(w, flash{Kind: "gone", Holder: name})
		http.Redirect(w, r, PathIndex, http.StatusSeeOther)
		return
	}
	can, err := s.src.CanRevoke(ctx, s.namespace)
	if err != nil {
		s.log.Error(err, "Asking whether holders may be revoked", "namespace", s.namespace)
	}
	rows := buildPage(s.namespace, s.clock.Now(), []Holder{*found}, nil, nil, can).Holders
	s.render(w, http.StatusOK, "confirm", confirmData{Namespace: s.namespace, Holder: rows[0], CanRevoke: can, CSRF: token,
		Title: "Revoke holder " + name})
}

// revoke deletes the leaseholder through the API. It does not consult CanRevoke: the API
// decides, and its 403 is shown as such.
func (s *Server) revoke(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 4096)
	if origin := r.Header.Get("Origin"); origin != "" && origin != "http://"+r.Host {
		s.render(w, http.StatusForbidden, "error", s.errorData("Request refused",
			"The form was sent from another site ("+origin+"). Nothing was revoked.", ""))
		return
	}
	if !s.sessions.valid(r) {
		s.render(w, http.StatusForbidden, "error", s.errorData("Request refused",
			"The form did not come from this page or has expired. Nothing was revoked; reload the page and try again.", ""))
		return
	}
	name := r.PostFormValue("holder")
	if !validHolderName(name) {
		s.render(w, http.StatusBadRequest, "error", s.errorData("No such holder", "The form names no valid holder. Nothing was revoked.", ""))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.timeout)
	defer cancel()
	err := s.src.RevokeHolder(ctx, s.namespace, name)
	switch {
	case err == nil:
		s.log.Info("Revoked holder", "namespace", s.namespace, "holder", name)
		s.setFlash(w, flash{Kind: "revoked", Holder: name})
	case apierrors.IsNotFound(err):
		s.setFlash(w, flash{Kind: "gone", Holder: name})
	default:
		s.apiError(w, r, "revoking holder "+name, err)
		return
	}
	http.Redirect(w, r, PathIndex, http.StatusSeeOther)
}

// errorPage is the error page's model.
type errorPage struct {
	Namespace string
	CSRF      string // no form on error pages
	Title     string
	Heading   string
	Message   string
	Detail    string
}

func (s *Server) errorData(heading, message, detail string) errorPage {
	return errorPage{Namespace: s.namespace, Title: heading, Heading: heading, Message: message, Detail: detail}
}

// apiError shows an error of the live API: a 403 as "not allowed for this tenant", with
// the API's own message underneath.
func (s *Server) apiError(w http.ResponseWriter, _ *http.Request, op string, err error) {
	switch {
	case apierrors.IsForbidden(err):
		s.render(w, http.StatusForbidden, "error", s.errorData("Not allowed for this tenant",
			fmt.Sprintf("Your Kubernetes credentials do not allow %s in namespace %s. Ask the tenant's administrator for a RoleBinding.", op, s.namespace),
			err.Error()))
	case apierrors.IsNotFound(err) && !strings.HasPrefix(op, "revoking"):
		s.render(w, http.StatusBadGateway, "error", s.errorData("The live lease API is not installed",
			"The cluster does not serve leaseholders and leasecounters (live.lease.vancetope.io/v1alpha1): the lease manager and its APIService must be installed.",
			err.Error()))
	case apierrors.IsUnauthorized(err):
		s.render(w, http.StatusUnauthorized, "error", s.errorData("Not signed in",
			"The Kubernetes API did not accept the credentials of your kubeconfig ("+op+"). Log in again and restart kubectl lease ui.",
			err.Error()))
	default:
		s.log.Error(err, "Live API call failed", "op", op, "namespace", s.namespace)
		s.render(w, http.StatusBadGateway, "error", s.errorData("The lease API did not answer",
			"Calling the live lease API failed while "+op+". Check that the lease manager is running and try again.", err.Error()))
	}
}

func (s *Server) render(w http.ResponseWriter, status int, page string, data any) {
	var b strings.Builder
	if err := s.pages[page].Execute(&b, data); err != nil {
		s.log.Error(err, "Rendering page", "page", page)
		http.Error(w, "rendering the page failed", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(b.String())) // a failed write means the browser left
}

// setFlash remembers a message for the next page the browser loads.
func (s *Server) setFlash(w http.ResponseWriter, f flash) {
	v := base64.RawURLEncoding.EncodeToString([]byte(f.Kind + "\x00" + f.Holder))
	http.SetCookie(w, &http.Cookie{Name: flashCookie, Value: v, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode})
}

// takeFlash returns and clears the message set by the previous request.
func (s *Server) takeFlash(w http.ResponseWriter, r *http.Request) *flash {
	c, err := r.Cookie(flashCookie)
	if err != nil {
		return nil
	}
	http.SetCookie(w, &http.Cookie{Name: flashCookie, Path: "/", MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteStrictMode})
	raw, err := base64.RawURLEncoding.DecodeString(c.Value)
	if err != nil {
		return nil
	}
	kind, holder, ok := strings.Cut(string(raw), "\x00")
	if !ok || (kind != "revoked" && kind != "gone") || !validHolderName(holder) {
		return nil
	}
	return &flash{Kind: kind, Holder: holder}
}

// validHolderName accepts what can be a leaseholder's name (a public holder ID): an object name.
func validHolderName(name string) bool {
	return name != "" && len(validation.IsDNS1123Subdomain(name)) == 0
}

// idleLabel is the words next to an idle time, so that the mark is not colour alone.
func idleLabel(s IdleState) string {
	switch s {
	case IdleNear:
		return "close to TTL"
	case IdleOver:
		return "past TTL, due for reaping"
	}
	return ""
}
