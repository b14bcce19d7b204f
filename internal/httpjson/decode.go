// Package httpjson is the one way the project's HTTP APIs speak JSON: request bodies read strictly (bounded
// size, exactly one object, no unknown fields, errors naming the field), answers written with one
// writer, and one error body for every error answer.
package httpjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strconv"
	"strings"

	"github.com/vancetope/lease-operator/internal/lease"
)

// Decode reads the body of r into dst: at most maxBody bytes, exactly one JSON object, no
// unknown fields. With required false an empty body is accepted (dst is left as it is).
// It returns nil or the field at fault.
func Decode(w http.ResponseWriter, r *http.Request, maxBody int64, dst any, required bool) *lease.InvalidError {
	return decode(json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody)), maxBody, dst, required)
}

// DecodeBytes decodes a body already read (and bounded) into dst as Decode does: exactly one
// JSON object, no unknown fields, required. It returns nil or the field at fault.
func DecodeBytes(body []byte, dst any) *lease.InvalidError {
	return decode(json.NewDecoder(bytes.NewReader(body)), int64(len(body)), dst, true)
}

func decode(dec *json.Decoder, maxBody int64, dst any, required bool) *lease.InvalidError {
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		if !required && errors.Is(err, io.EOF) {
			return nil
		}
		return fieldError(err, maxBody)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return fieldError(err, maxBody)
		}
		return &lease.InvalidError{Field: "body", Detail: "must hold exactly one JSON object"}
	}
	return nil
}

func fieldError(err error, maxBody int64) *lease.InvalidError {
	var (
		mbe *http.MaxBytesError
		se  *json.SyntaxError
		te  *json.UnmarshalTypeError
	)
	switch {
	case errors.As(err, &mbe):
		return &lease.InvalidError{Field: "body", Detail: fmt.Sprintf("exceeds %d bytes", maxBody)}
	case errors.Is(err, io.EOF):
		return &lease.InvalidError{Field: "body", Detail: "is empty; want a JSON object"}
	case errors.Is(err, io.ErrUnexpectedEOF):
		return &lease.InvalidError{Field: "body", Detail: "is truncated JSON"}
	case errors.As(err, &se):
		return &lease.InvalidError{Field: "body", Detail: fmt.Sprintf("is malformed JSON at offset %d: %v", se.Offset, se)}
	case errors.As(err, &te):
		field := te.Field
		if field == "" {
			field = "body"
		}
		return &lease.InvalidError{Field: field, Detail: fmt.Sprintf("must be a JSON %s, not %s", kind(te), te.Value)}
	}
	// encoding/json has no typed error for an unknown field.
	if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		if unq, uerr := strconv.Unquote(name); uerr == nil {
			name = unq
		}
		return &lease.InvalidError{Field: name, Detail: "is not a known field"}
	}
	return &lease.InvalidError{Field: "body", Detail: err.Error()}
}

func kind(te *json.UnmarshalTypeError) string {
	if te.Type == nil {
		return "value of another type"
	}
	switch te.Type.Kind() {
	case reflect.String:
		return "string"
	case reflect.Bool:
		return "boolean"
	case reflect.Map, reflect.Struct, reflect.Pointer:
		return "object"
	case reflect.Slice, reflect.Array:
		return "array"
	default:
		return "number"
	}
}
