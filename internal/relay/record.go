package relay

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	jsonv2 "github.com/go-json-experiment/json"
	"strconv"
	"time"

	"github.com/musterhq/muster/internal/registry"
	"github.com/musterhq/muster/internal/stream"
)

// Record kinds.
const (
	KindSnapshot  = "snapshot"
	KindUpdate    = "update"
	KindHeartbeat = "heartbeat"
)

// Record is one line of a peer stream (GET /v1/peer/updates).
type Record struct {
	// Kind is snapshot (a view the peer holds, sent when the stream
	// opens and after its tap overflowed), update (one publication of the
	// peer's own) or heartbeat.
	Kind    string `json:"kind"`
	Service string `json:"service,omitempty"`
	Version uint64 `json:"version,omitempty"`
	// View is the full view at Version, as the publisher encoded it.
	View json.RawMessage `json:"view,omitempty"`
	// Delta, in an update, is the delta from FromVersion to Version;
	// absent for a service's first view.
	Delta       json.RawMessage `json:"delta,omitempty"`
	FromVersion uint64          `json:"from_version,omitempty"`
	// Withdrawal marks a delta that takes capacity away.
	Withdrawal bool `json:"withdrawal,omitempty"`
	// Rebased marks a delta whose base its publisher did not publish
	// itself (stream.Update.Rebased).
	Rebased bool `json:"rebased,omitempty"`
	// PublishedAt is when the peer's hub took the view (its clock).
	PublishedAt time.Time `json:"published_at,omitzero"`
}

// ErrMalformed is wrapped by every error Decode returns.
var ErrMalformed = errors.New("malformed peer record")

// Decode parses one line of a peer stream and checks it: a known kind;
// for a snapshot or an update a valid service name, a version, a view
// that is a JSON object and a publication time; a delta (updates only)
// that is a JSON object from an earlier version. Fields it does not know
// are ignored, so that a replica one release ahead (a rolling upgrade)
// may add one; a kind it does not know is refused, as its meaning cannot
// be guessed. The returned record's View and Delta are copies: line may
// be reused.
func Decode(line []byte) (Record, error) {
	var r Record
	// The faster decoder: its raw values (the view and the delta) are
	// the line's bytes, verbatim, as encoding/json's.
	if err := jsonv2.Unmarshal(line, &r); err != nil {
		return Record{}, fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	switch r.Kind {
	case KindHeartbeat:
		if r.Service != "" || r.View != nil || r.Delta != nil {
			return Record{}, fmt.Errorf("%w: a heartbeat carries nothing", ErrMalformed)
		}
		return r, nil
	case KindSnapshot, KindUpdate:
	default:
		return Record{}, fmt.Errorf("%w: unknown kind %q", ErrMalformed, r.Kind)
	}
	switch {
	case !registry.ValidName(r.Service):
		return Record{}, fmt.Errorf("%w: %q is not a service name", ErrMalformed, r.Service)
	case r.Version == 0:
		return Record{}, fmt.Errorf("%w: %s of %s without a version", ErrMalformed, r.Kind, r.Service)
	case !object(r.View):
		return Record{}, fmt.Errorf("%w: %s of %s@%d without a view object", ErrMalformed, r.Kind, r.Service, r.Version)
	case r.PublishedAt.IsZero():
		return Record{}, fmt.Errorf("%w: %s of %s@%d without published_at", ErrMalformed, r.Kind, r.Service, r.Version)
	}
	if r.Delta == nil {
		if r.FromVersion != 0 || r.Withdrawal || r.Rebased {
			return Record{}, fmt.Errorf("%w: %s of %s@%d has delta fields without a delta", ErrMalformed, r.Kind, r.Service, r.Version)
		}
		return r, nil
	}
	switch {
	case r.Kind == KindSnapshot:
		return Record{}, fmt.Errorf("%w: a snapshot of %s carries a delta", ErrMalformed, r.Service)
	case !object(r.Delta):
		return Record{}, fmt.Errorf("%w: update of %s@%d: the delta is not an object", ErrMalformed, r.Service, r.Version)
	case r.FromVersion == 0 || r.FromVersion >= r.Version:
		return Record{}, fmt.Errorf("%w: update of %s@%d: a delta from version %d", ErrMalformed, r.Service, r.Version, r.FromVersion)
	}
	return r, nil
}

// object reports whether raw (valid JSON, as Unmarshal checked) is an
// object.
func object(raw json.RawMessage) bool { return len(raw) > 0 && raw[0] == '{' }

// Update is the hub update r carries (a snapshot or an update record).
func (r Record) Update() stream.Update {
	u := stream.Update{
		View:    &stream.Frame{Kind: stream.KindView, Service: r.Service, Version: r.Version, JSON: r.View},
		Rebased: r.Rebased,
	}
	if r.Delta != nil {
		u.Delta = &stream.Frame{Kind: stream.KindDelta, Service: r.Service, Version: r.Version,
			FromVersion: r.FromVersion, JSON: r.Delta, Withdrawal: r.Withdrawal}
	}
	return u
}

// errNewline is returned by the appenders for a frame that is not one
// line: it cannot travel in NDJSON (nor in SSE) verbatim.
var errNewline = errors.New("relay: a frame's JSON spans lines")

// AppendSnapshot appends the snapshot record of view f, and a newline, to
// b. The frame's bytes are appended verbatim.
func AppendSnapshot(b []byte, f *stream.Frame) ([]byte, error) {
	return appendRecord(b, KindSnapshot, stream.Update{View: f})
}

// AppendUpdate appends the update record of u, and a newline, to b.
func AppendUpdate(b []byte, u stream.Update) ([]byte, error) {
	return appendRecord(b, KindUpdate, u)
}

// Heartbeat is a heartbeat record's line.
var Heartbeat = []byte(`{"kind":"heartbeat"}` + "\n")

// appendRecord writes the record by hand rather than with encoding/json,
// which would compact and HTML-escape the raw frames: their bytes must
// arrive as the publisher encoded them.
func appendRecord(b []byte, kind string, u stream.Update) ([]byte, error) {
	v := u.View
	if v == nil || bytes.IndexByte(v.JSON, '\n') >= 0 || (u.Delta != nil && bytes.IndexByte(u.Delta.JSON, '\n') >= 0) {
		if v == nil {
			return b, errors.New("relay: an update without a view")
		}
		return b, errNewline
	}
	b = append(b, `{"kind":"`...)
	b = append(b, kind...)
	b = append(b, `","service":`...)
	name, err := json.Marshal(v.Service)
	if err != nil {
		return b, err
	}
	b = append(b, name...)
	b = append(b, `,"version":`...)
	b = strconv.AppendUint(b, v.Version, 10)
	b = append(b, `,"view":`...)
	b = append(b, v.JSON...)
	if d := u.Delta; d != nil {
		b = append(b, `,"delta":`...)
		b = append(b, d.JSON...)
		b = append(b, `,"from_version":`...)
		b = strconv.AppendUint(b, d.FromVersion, 10)
		if d.Withdrawal {
			b = append(b, `,"withdrawal":true`...)
		}
		if u.Rebased {
			b = append(b, `,"rebased":true`...)
		}
	}
	if !v.PublishedAt.IsZero() {
		b = append(b, `,"published_at":"`...)
		b = v.PublishedAt.UTC().AppendFormat(b, time.RFC3339Nano)
		b = append(b, '"')
	}
	return append(b, "}\n"...), nil
}
