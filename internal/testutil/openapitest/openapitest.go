// Package openapitest checks HTTP exchanges against the OpenAPI document of the admission
// API (api/openapi/lease-api.yaml) with kin-openapi's openapi3filter. Test servers wrap
// their handler with Conformance; every request the tests send and every answer is
// validated, and Unexercised tells which documented answers no test produced.
package openapitest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"

	"github.com/vancetope/lease-operator/api/openapi"
)

// Spec returns the parsed and validated document.
var Spec = sync.OnceValues(func() (*openapi3.T, error) {
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(openapi.YAML)
	if err != nil {
		return nil, fmt.Errorf("loading the OpenAPI document: %w", err)
	}
	if err := doc.Validate(loader.Context); err != nil {
		return nil, fmt.Errorf("the OpenAPI document is invalid: %w", err)
	}
	return doc, nil
})

var specRouter = sync.OnceValues(func() (routers.Router, error) {
	doc, err := Spec()
	if err != nil {
		return nil, err
	}
	return legacy.NewRouter(doc)
})

// seen records "METHOD path status" of every validated answer.
var seen = struct {
	sync.Mutex
	m map[string]bool
}{m: map[string]bool{}}

// Conformance wraps the API handler of a test server: an answer whose status or body the
// document does not describe fails t, and so does a request the server accepted (2xx) that
// the document refuses. A path or method the document lacks must be answered 404 or 405.
func Conformance(t testing.TB, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			t.Errorf("reading the request body: %v", err)
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		rec := httptest.NewRecorder()
		next.ServeHTTP(rec, r)
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		_, _ = w.Write(rec.Body.Bytes())
		if err := validateExchange(r, body, rec); err != nil {
			t.Errorf("OpenAPI: %s %s answered %d %s: %v", r.Method, r.URL.Path, rec.Code, truncateBody(rec.Body.Bytes()), err)
		}
	})
}

func validateExchange(r *http.Request, body []byte, rec *httptest.ResponseRecorder) error {
	router, err := specRouter()
	if err != nil {
		return err
	}
	req := r.Clone(context.Background())
	req.Body = io.NopCloser(bytes.NewReader(body))
	route, params, err := router.FindRoute(req)
	if err != nil {
		// A route the document does not have must be one the server does not serve.
		var re *routers.RouteError
		if errors.As(err, &re) && ((re.Reason == routers.ErrPathNotFound.Error() && rec.Code == http.StatusNotFound) ||
			(re.Reason == routers.ErrMethodNotAllowed.Error() && rec.Code == http.StatusMethodNotAllowed)) {
			return nil
		}
		return fmt.Errorf("not in the document: %w", err)
	}
	in := &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route,
		Options: &openapi3filter.Options{MultiError: true}}
	if rec.Code < 300 {
		if err := openapi3filter.ValidateRequest(context.Background(), in); err != nil {
			return fmt.Errorf("the server accepted a request the document refuses: %w", err)
		}
	}
	out := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: rec.Code, Header: rec.Header(),
		Options: &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true}}
	out.SetBodyBytes(rec.Body.Bytes())
	if err := openapi3filter.ValidateResponse(context.Background(), out); err != nil {
		return fmt.Errorf("the answer is not as documented: %w", err)
	}
	seen.Lock()
	seen.m[fmt.Sprintf("%s %s %d", route.Method, route.Path, rec.Code)] = true
	seen.Unlock()
	return nil
}

func truncateBody(b []byte) string {
	if len(b) > 300 {
		return string(b[:300]) + "…"
	}
	return string(b)
}

// documentedAnswers lists "METHOD path status" of every answer in the document.
func documentedAnswers() ([]string, error) {
	doc, err := Spec()
	if err != nil {
		return nil, err
	}
	var out []string
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			for status := range op.Responses.Map() {
				out = append(out, fmt.Sprintf("%s %s %s", method, path, status))
			}
		}
	}
	sort.Strings(out)
	return out, nil
}

// Unexercised returns the documented answers ("METHOD path status") no exchange produced.
func Unexercised() ([]string, error) {
	all, err := documentedAnswers()
	if err != nil {
		return nil, err
	}
	seen.Lock()
	defer seen.Unlock()
	var missing []string
	for _, a := range all {
		if !seen.m[a] {
			missing = append(missing, a)
		}
	}
	return missing, nil
}
