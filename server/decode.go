package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"
)

// decodeJSON reads exactly one JSON object from the body into v, refusing a
// wrong content type (415), a body over the limit (413), malformed JSON,
// unknown fields, wrong types and trailing data (400). Nothing is applied
// when it fails, because the domain is only called with a decoded value.
func (s *Server) decodeJSON(w http.ResponseWriter, r *http.Request, v any) *Problem {
	if p := jsonContentType(r); p != nil {
		return p
	}
	body := http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes)
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return decodeProblem(err, s.cfg.MaxBodyBytes)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return decodeProblem(err, s.cfg.MaxBodyBytes)
		}
		return problem(http.StatusBadRequest, "malformed-json", "the body must hold one JSON object and nothing after it")
	}
	return nil
}

// jsonContentType refuses a body that is not UTF-8 JSON (415).
func jsonContentType(r *http.Request) *Problem {
	ct := r.Header.Get("Content-Type")
	mt, params, err := mime.ParseMediaType(ct)
	if err != nil || mt != "application/json" {
		return problem(http.StatusUnsupportedMediaType, "unsupported-media-type",
			fmt.Sprintf("the body must be application/json, got %q", ct))
	}
	if cs, ok := params["charset"]; ok && !strings.EqualFold(cs, "utf-8") {
		return problem(http.StatusUnsupportedMediaType, "unsupported-media-type",
			fmt.Sprintf("the body must be UTF-8 JSON, got charset %q", cs))
	}
	return nil
}

func decodeProblem(err error, limit int64) *Problem {
	var (
		mbe *http.MaxBytesError
		se  *json.SyntaxError
		ute *json.UnmarshalTypeError
	)
	switch {
	case errors.As(err, &mbe):
		return problem(http.StatusRequestEntityTooLarge, "body-too-large",
			fmt.Sprintf("the body is larger than the %d-byte limit", limit))
	case errors.Is(err, io.EOF):
		return problem(http.StatusBadRequest, "malformed-json", "the body is empty; a JSON object was expected")
	case errors.Is(err, io.ErrUnexpectedEOF):
		return problem(http.StatusBadRequest, "malformed-json", "the JSON body ends too early")
	case errors.As(err, &se):
		return problem(http.StatusBadRequest, "malformed-json",
			fmt.Sprintf("the body is not valid JSON (at byte %d): %s", se.Offset, se.Error()))
	case errors.As(err, &ute):
		field := ute.Field
		if field == "" {
			field = "(body)"
		}
		p := problem(http.StatusBadRequest, "malformed-json",
			fmt.Sprintf("field %s must be %s, got JSON %s", field, jsonKind(ute.Type.Kind().String()), ute.Value))
		p.Errors = append(p.Errors, fieldError(field, fmt.Sprintf("wrong type: got %s", ute.Value)))
		return p
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		name := strings.TrimPrefix(err.Error(), "json: unknown field ")
		p := problem(http.StatusBadRequest, "unknown-field",
			fmt.Sprintf("the body has a field muster does not know: %s", name))
		p.Errors = append(p.Errors, fieldError(strings.Trim(name, `"`), "unknown field"))
		return p
	}
	return problem(http.StatusBadRequest, "malformed-json", "the body could not be decoded: "+err.Error())
}

func jsonKind(goKind string) string {
	switch goKind {
	case "string":
		return "a string"
	case "bool":
		return "a boolean"
	case "slice", "array":
		return "an array"
	case "map", "struct":
		return "an object"
	}
	return "a number"
}
