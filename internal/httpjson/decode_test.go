package httpjson_test

import (
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/vancetope/lease-operator/internal/httpjson"
	"github.com/vancetope/lease-operator/internal/lease"
)

func TestDecode(t *testing.T) {
	type body struct {
		Name  string `json:"name"`
		Count int    `json:"count"`
	}
	cases := map[string]struct {
		in       string
		required bool
		want     *lease.InvalidError // nil: decoded
		detail   string              // substring of the detail
	}{
		"valid":                  {in: `{"name":"a","count":1}`, required: true},
		"empty, optional":        {in: ``},
		"empty, required":        {in: ``, required: true, want: &lease.InvalidError{Field: "body"}, detail: "empty"},
		"unknown field":          {in: `{"name":"a","colour":"red"}`, required: true, want: &lease.InvalidError{Field: "colour"}, detail: "not a known field"},
		"wrong type":             {in: `{"count":"many"}`, required: true, want: &lease.InvalidError{Field: "count"}, detail: "number"},
		"malformed":              {in: `{"name":`, required: true, want: &lease.InvalidError{Field: "body"}, detail: "truncated"},
		"two objects":            {in: `{} {}`, required: true, want: &lease.InvalidError{Field: "body"}, detail: "exactly one"},
		"over the size limit":    {in: `{"name":"` + strings.Repeat("x", 100) + `"}`, required: true, want: &lease.InvalidError{Field: "body"}, detail: "exceeds 64 bytes"},
		"not an object (string)": {in: `"hello"`, required: true, want: &lease.InvalidError{Field: "body"}, detail: "object"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			r := httptest.NewRequest("POST", "/", strings.NewReader(tc.in))
			var got body
			fe := httpjson.Decode(httptest.NewRecorder(), r, 64, &got, tc.required)
			if tc.want == nil {
				if fe != nil {
					t.Fatalf("Decode = %v, want success", fe)
				}
				return
			}
			if fe == nil {
				t.Fatalf("Decode succeeded with %+v, want an error on %s", got, tc.want.Field)
			}
			if diff := cmp.Diff(tc.want.Field, fe.Field); diff != "" || !strings.Contains(fe.Detail, tc.detail) {
				t.Errorf("Decode = %v, want field %s with %q", fe, tc.want.Field, tc.detail)
			}
		})
	}
}

// DecodeBytes is Decode on a body already read (and bounded) by its caller: the same strict
// rules, the body required.
func TestDecodeBytes(t *testing.T) {
	type body struct {
		Name string `json:"name"`
	}
	for in, want := range map[string]string{
		`{"name":"a"}`:   "",
		``:               "body",
		`{"colour":"r"}`: "colour",
		`{} {}`:          "body",
		`{"name":1}`:     "name",
	} {
		var got body
		fe := httpjson.DecodeBytes([]byte(in), &got)
		if (fe == nil) != (want == "") || fe != nil && fe.Field != want {
			t.Errorf("DecodeBytes(%q) = %v, want field %q", in, fe, want)
		}
	}
}
