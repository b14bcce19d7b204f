package tenantview

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"net/http"
)

// Cookie names. The session cookie only binds the form token to the browser that loaded the
// page; it carries no credentials (those stay in the kubeconfig of the process).
const (
	sessionCookie = "lease_ui_session"
	flashCookie   = "lease_ui_flash"
	csrfField     = "csrf"
)

// sessions issues per-browser-session CSRF tokens: a random session ID in a SameSite=Strict,
// HttpOnly cookie and, in every form, an HMAC of that ID under a key that lives only in this
// process. A POST without both, or with a token of another session, is refused before the
// API is called (docs/tenant-view.md, "Revoking").
type sessions struct {
	key []byte
}

func newSessions() (*sessions, error) {
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	return &sessions{key: key}, nil
}

// token returns the CSRF token of r's session, starting a session (a cookie on w) when r
// has none.
func (s *sessions) token(w http.ResponseWriter, r *http.Request) string {
	if c, err := r.Cookie(sessionCookie); err == nil && validSessionID(c.Value) {
		return s.sign(c.Value)
	}
	raw := make([]byte, 32)
	_, _ = rand.Read(raw) // crypto/rand.Read never fails on supported platforms (Go 1.24+)
	id := base64.RawURLEncoding.EncodeToString(raw)
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: id, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode})
	return s.sign(id)
}

// valid reports whether the form token of r belongs to r's session.
func (s *sessions) valid(r *http.Request) bool {
	c, err := r.Cookie(sessionCookie)
	if err != nil || !validSessionID(c.Value) {
		return false
	}
	got := r.PostFormValue(csrfField)
	return got != "" && hmac.Equal([]byte(got), []byte(s.sign(c.Value)))
}

func (s *sessions) sign(id string) string {
	m := hmac.New(sha256.New, s.key)
	m.Write([]byte(id))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

func validSessionID(id string) bool {
	b, err := base64.RawURLEncoding.DecodeString(id)
	return err == nil && len(b) == 32
}
