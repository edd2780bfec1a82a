package server

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/musterhq/muster/registry"
	"github.com/musterhq/muster/stream"
)

// MaxWatchServices bounds the services one watch stream may hold.
const MaxWatchServices = 100

// watch streams views and deltas as Server-Sent Events (ADR-10):
//
//	event: view|delta|heartbeat|drain
//	id: <version>
//	data: <one line of JSON>
//
// A client resumes with since=<the highest version it applied>.
func (s *Server) watch(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	services := slices.Compact(slices.Sorted(slices.Values(q["service"])))
	if len(services) == 0 || len(services) > MaxWatchServices {
		writeProblem(w, r, problem(http.StatusBadRequest, "bad-parameter", fmt.Sprintf("name 1 to %d services with ?service=", MaxWatchServices)))
		return
	}
	var since uint64
	if v := q.Get("since"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			writeProblem(w, r, problem(http.StatusBadRequest, "bad-parameter", "since must be a view version (a whole number)"))
			return
		}
		since = n
	}
	if !s.authoriseViews(w, r, services) {
		return
	}
	now, _ := s.cfg.Hub.Subscribers()
	if ok, retry := s.cfg.Admission.Admit(now); !ok {
		s.metrics.admissionRefused.Inc()
		p := problem(http.StatusServiceUnavailable, "admission", "too many clients are (re)subscribing right now; keep routing on your cached view and come back after Retry-After")
		p.retryAfter = int(retry / time.Second)
		writeProblem(w, r, p)
		return
	}
	sub, err := s.cfg.Hub.Subscribe(services, since)
	if errors.Is(err, stream.ErrClosed) {
		p := problem(http.StatusServiceUnavailable, "draining", "this server is shutting down; reconnect with jitter")
		p.retryAfter = 1
		writeProblem(w, r, p)
		return
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer sub.Close()

	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	// The server's ReadTimeout would expire on the connection's idle read
	// and cancel this long-lived request; a stream has nothing more to read.
	_ = rc.SetReadDeadline(time.Time{})
	// Frames go straight into the ResponseWriter, which already buffers
	// (a second buffer per stream costs 4 KiB per idle subscriber).
	send := func(frames ...*stream.Frame) bool {
		// A client that cannot take a frame within the deadline is cut
		// off; it reconnects and catches up from its version.
		_ = rc.SetWriteDeadline(time.Now().Add(s.cfg.WatchWriteTimeout))
		for _, f := range frames {
			if writeFrame(w, f) != nil {
				return false
			}
			s.metrics.framesSent.WithLabelValues(string(f.Kind)).Inc()
		}
		return rc.Flush() == nil
	}
	if !send(sub.Initial...) {
		return
	}
	beat := time.NewTicker(s.cfg.WatchHeartbeat)
	defer beat.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case f := <-sub.C():
			if !send(f) || f.Kind == stream.KindDrain {
				return
			}
		case <-sub.Resync():
			if !send(sub.TakeResync()...) {
				return
			}
		case <-beat.C:
			if !send(&stream.Frame{Kind: stream.KindHeartbeat, JSON: []byte(`{}`)}) {
				return
			}
		}
	}
}

// writeFrame writes one SSE event: a small header built on the stack, the
// shared JSON bytes, and the terminator.
func writeFrame(w io.Writer, f *stream.Frame) error {
	var head [64]byte
	b := append(head[:0], "event: "...)
	b = append(b, f.Kind...)
	if f.Version != 0 {
		b = append(b, "\nid: "...)
		b = strconv.AppendUint(b, f.Version, 10)
	}
	b = append(b, "\ndata: "...)
	if _, err := w.Write(b); err != nil {
		return err
	}
	if _, err := w.Write(f.JSON); err != nil {
		return err
	}
	_, err := io.WriteString(w, "\n\n")
	return err
}

// authoriseViews checks that the caller may resolve every service and that
// each exists, writing the problem when not.
func (s *Server) authoriseViews(w http.ResponseWriter, r *http.Request, services []string) bool {
	for _, name := range services {
		if !registry.ValidName(name) {
			writeProblem(w, r, problem(http.StatusBadRequest, "bad-parameter", fmt.Sprintf("%q is not a service name", name)))
			return false
		}
		if err := s.cfg.Registry.MayResolve(r.Context(), principal(r), name); err != nil {
			s.writeError(w, r, err)
			return false
		}
		ok, err := s.cfg.Registry.ServiceExists(r.Context(), name)
		if err != nil {
			s.writeError(w, r, err)
			return false
		}
		if !ok {
			writeProblem(w, r, problem(http.StatusNotFound, "not-found", "no service named "+name))
			return false
		}
	}
	return true
}

// resolve answers with the current view of one service: the same bytes
// the watch stream sends, for tooling and target-group sync.
func (s *Server) resolve(w http.ResponseWriter, r *http.Request) {
	name := chi.URLParam(r, "service")
	if !s.authoriseViews(w, r, []string{name}) {
		return
	}
	f, ok := s.cfg.Hub.View(name)
	if !ok {
		p := problem(http.StatusServiceUnavailable, "not-ready", "no view of "+name+" has been published yet; retry shortly")
		p.retryAfter = 1
		writeProblem(w, r, p)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("ETag", `"`+strconv.FormatUint(f.Version, 10)+`"`)
	_, _ = w.Write(f.JSON)
}
