package server

import (
	"encoding/base64"
	"encoding/json"
	"log/slog"
	"net/http"
	"strconv"

	"github.com/musterhq/muster/internal/registry"
)

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// list is the envelope of every paginated answer. NextCursor is set when
// another page may follow; pass it back as ?cursor=.
type list[T any] struct {
	Items      []T    `json:"items"`
	NextCursor string `json:"next_cursor,omitempty"`
}

// pageParams reads ?limit= and ?cursor= (an opaque token from a previous
// page).
func pageParams(r *http.Request) (limit int, after string, p *Problem) {
	q := r.URL.Query()
	limit = registry.DefaultPageSize
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > registry.MaxPageSize {
			return 0, "", problem(http.StatusBadRequest, "bad-parameter",
				"limit must be a whole number from 1 to "+strconv.Itoa(registry.MaxPageSize))
		}
		limit = n
	}
	if c := q.Get("cursor"); c != "" {
		b, err := base64.RawURLEncoding.DecodeString(c)
		if err != nil {
			return 0, "", problem(http.StatusBadRequest, "bad-parameter", "cursor is not one this API issued")
		}
		after = string(b)
	}
	return limit, after, nil
}

func nextCursor(n, limit int, last string) string {
	if n < limit {
		return ""
	}
	return base64.RawURLEncoding.EncodeToString([]byte(last))
}

func fieldError(field, msg string) registry.FieldError {
	return registry.FieldError{Field: field, Message: msg}
}

// levelFor keeps the access log quiet at volume: successes are debug (the
// metrics count them), refusals info, unavailability (503: a dependency
// away, a rebuild, admission) a warning, and only real failures errors.
func levelFor(status int) slog.Level {
	switch {
	case status == 503:
		return slog.LevelWarn
	case status >= 500:
		return slog.LevelError
	case status >= 400:
		return slog.LevelInfo
	}
	return slog.LevelDebug
}
