package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/lagstats"
	"github.com/musterhq/muster/internal/registry"
	"github.com/musterhq/muster/internal/stream"
)

// MaxWatchServices bounds the services one watch stream may hold.
const MaxWatchServices = 100

// watch streams views and deltas as Server-Sent Events (ADR-10):
//
//	event: view|delta|synced|heartbeat|drain
//	id: <version>
//	data: <one line of JSON>
//
// A client resumes with held=<service>:<version> for each service it holds
// a view of: versions are unique in the region, so each service
// resumes from exactly the client's copy, on any replica. since=<version>,
// for the services not in held, is the lowest version the client holds
// across them: a single number cannot name several owners' epochs, and
// the highest would make a service published under an older epoch look
// current. After the catch-up frames (none when the client is current) comes one synced
// event, so a client knows it is current without waiting for a change.
// synced never comes before the client holds a view of every service it
// asked for: while the evaluator rebuilds (no view of a service yet) the
// stream carries heartbeats only, the client keeps what it has, and the
// first view of each service, then synced, follow when they exist.
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
	regions, p := parseRegions(q["regions"])
	if p != nil {
		writeProblem(w, r, p)
		return
	}
	// Taken before authorising, so a grant withdrawn from here on ends
	// the stream.
	revoked := s.cfg.Authz.Revoked()
	var remoteRevoked <-chan struct{}
	if s.cfg.Regions != nil {
		remoteRevoked = s.cfg.Regions.Revoked()
	}
	services, ok := s.authoriseSeries(w, r, services, regions)
	if !ok {
		return
	}
	if len(services) > MaxWatchServices {
		writeProblem(w, r, problem(http.StatusBadRequest, "bad-parameter", fmt.Sprintf("%d series with the regions asked for; at most %d", len(services), MaxWatchServices)))
		return
	}
	heldValues := q["held"]
	if len(regions) > 0 {
		// A client following regions may hold a series no longer served
		// here (a peer that stopped holding the service): it is not
		// resumed, and it is no error.
		heldValues = slices.DeleteFunc(slices.Clone(heldValues), func(v string) bool {
			name, _, _ := strings.Cut(v, ":")
			_, found := slices.BinarySearch(services, name)
			return !found
		})
	}
	held, p := parseHeld(heldValues, services)
	if p != nil {
		writeProblem(w, r, p)
		return
	}
	auth := authority{actor: principal(r), services: services, revoked: revoked, remoteRevoked: remoteRevoked}
	key := auth.actor.String()
	open, ok := s.limits.streams.acquire(key)
	if !ok {
		s.refuseStreams(w, r, key, open)
		return
	}
	release := sync.OnceFunc(func() { s.limits.streams.release(key) })
	defer func() {
		if !auth.started {
			release()
		}
	}()
	now, _ := s.cfg.Hub.Subscribers()
	if ok, retry := s.cfg.Admission.Admit(now); !ok {
		s.refuseAdmission(w, r, retry)
		return
	}
	sub, err := s.cfg.Hub.SubscribeHeld(services, since, held)
	if errors.Is(err, stream.ErrClosed) {
		p := problem(http.StatusServiceUnavailable, "draining", "this server is shutting down; reconnect with jitter")
		p.retryAfter = 1
		writeProblem(w, r, p)
		return
	}
	if errors.Is(err, stream.ErrNotCurrent) {
		s.refuseNotCurrent(w, r, err)
		return
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	// Over HTTP/1.1 the connection is taken over: net/http's
	// per-connection buffers, its background reader goroutine and the
	// request's state are released, and one small goroutine writes the
	// stream. An idle subscriber then costs a few KiB instead of ~45.
	if conn, ok := hijack(w); ok {
		if conn == nil {
			sub.Close()
			return
		}
		s.streams.add()
		auth.started = true
		go func() {
			defer s.streams.done()
			defer release()
			defer conn.Close()
			defer sub.Close()
			s.streamLoop(nil, sub, auth, s.rawSender(conn))
		}()
		return
	}
	defer sub.Close()

	// HTTP/2 (or a writer that cannot be hijacked): stream through the
	// ResponseWriter.
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	// The server's ReadTimeout would expire on the connection's idle read
	// and cancel this long-lived request; a stream has nothing more to read.
	_ = rc.SetReadDeadline(time.Time{})
	s.streamLoop(r.Context().Done(), sub, auth, func(frames ...*stream.Frame) bool {
		// A client that cannot take a frame within the deadline is cut
		// off; it reconnects and catches up from its version.
		_ = rc.SetWriteDeadline(time.Now().Add(s.cfg.WatchWriteTimeout))
		for _, f := range frames {
			if writeFrame(w, f) != nil {
				return false
			}
		}
		if rc.Flush() != nil {
			return false
		}
		s.framesSent(frames)
		return true
	})
}

// parseHeld reads the held parameters of a watch: <service>:<version>,
// one per service the client holds a view of, each a service it asks for.
// A version names one view in the region, so the server
// resumes each service from exactly it, whichever replica published it.
func parseHeld(values []string, services []string) (map[string]uint64, *Problem) {
	if len(values) == 0 {
		return nil, nil
	}
	bad := func(detail string) (map[string]uint64, *Problem) {
		return nil, problem(http.StatusBadRequest, "bad-parameter", detail)
	}
	if len(values) > len(services) {
		return bad(fmt.Sprintf("%d held parameters for %d services: at most one per service", len(values), len(services)))
	}
	held := make(map[string]uint64, len(values))
	for _, v := range values {
		name, ver, ok := strings.Cut(v, ":")
		if !ok {
			return bad(fmt.Sprintf("held %q: want <service>:<version>", v))
		}
		if _, found := slices.BinarySearch(services, name); !found {
			return bad(fmt.Sprintf("held %q: %q is not a service this watch names", v, name))
		}
		if _, dup := held[name]; dup {
			return bad(fmt.Sprintf("held names %q twice", name))
		}
		n, err := strconv.ParseUint(ver, 10, 64)
		if err != nil || n == 0 {
			return bad(fmt.Sprintf("held %q: the version must be a view version (a whole number above 0)", v))
		}
		held[name] = n
	}
	return held, nil
}

// watchAdmission refuses a watch at once, before its token is looked at,
// while reconnect admission has no slot: Admission.Check, which takes
// none (watch takes it with Admit once the caller is authorised).
func (s *Server) watchAdmission(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		now, _ := s.cfg.Hub.Subscribers()
		if ok, retry := s.cfg.Admission.Check(now); !ok {
			s.refuseAdmission(w, r, retry)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func (s *Server) refuseAdmission(w http.ResponseWriter, r *http.Request, retry time.Duration) {
	s.metrics.admissionRefused.Inc()
	p := problem(http.StatusServiceUnavailable, "admission", "too many clients are (re)subscribing right now; keep routing on your cached view and come back after Retry-After")
	p.retryAfter = int(retry / time.Second)
	writeProblem(w, r, p)
}

// authority is what a watch stream stands on: who opened it, with which
// token (its expiry), for which services.
type authority struct {
	actor    identity.Principal
	services []string
	// revoked is Authz.Revoked as of before the stream was authorised;
	// remoteRevoked the peer regions' (Regions.Revoked; nil without).
	revoked, remoteRevoked <-chan struct{}
	// started: a goroutine of its own runs the stream (and releases its
	// count when it ends).
	started bool
}

// refuseNotCurrent answers a subscription or resolution of a service this
// replica holds but cannot vouch is current (it cannot follow the
// service's owner while another replica can): 503 with a retry hint, so
// the client keeps what it holds and asks another replica (the load
// balancer no longer sends it here when this replica is cut off from
// every peer, as /readyz then says).
func (s *Server) refuseNotCurrent(w http.ResponseWriter, r *http.Request, err error) {
	p := problem(http.StatusServiceUnavailable, "not-current", err.Error()+"; keep routing on what you hold and resubscribe at another replica")
	p.retryAfter = 1
	// A new connection lets a load balancer that routes by connection
	// pick another replica for the retry.
	w.Header().Set("Connection", "close")
	writeProblem(w, r, p)
}

// Drain reasons of a stream whose authority lapsed.
const (
	DrainTokenExpired = "token_expired"
	DrainGrantRevoked = "grant_revoked"
)

// lapsed returns the frame ending a stream whose authority lapsed.
func lapsed(reason, detail string) *stream.Frame {
	b, _ := json.Marshal(map[string]string{"reason": reason, "detail": detail})
	return &stream.Frame{Kind: stream.KindDrain, JSON: b}
}

// streamLoop writes the initial frames (the hub ends them with synced
// when it can), then every frame the subscription delivers, a full resync
// when it overflowed, and a heartbeat when idle, until send fails, a drain
// frame went out, or done is closed.
//
// A stream follows its authority: it ends with a drain event when the
// token it was opened with expires (reason token_expired: the client
// resubscribes with a fresh one) or when the caller may no longer resolve
// one of its services (reason grant_revoked), which the in-memory copy of
// grants signals through Authz.Revoked within its reload interval.
func (s *Server) streamLoop(done <-chan struct{}, sub *stream.Subscription, auth authority, send func(...*stream.Frame) bool) {
	if !send(sub.Initial...) {
		return
	}
	beat := time.NewTicker(s.cfg.WatchHeartbeat)
	defer beat.Stop()
	var expired <-chan time.Time
	if exp := auth.actor.Expiry; !exp.IsZero() {
		t := time.NewTimer(time.Until(exp))
		defer t.Stop()
		expired = t.C
	}
	revoked := auth.revoked
	// A stream following remote series checks its authority again when a
	// peer region withdraws a grant (the peer decides who resolves its
	// services).
	var remoteRevoked <-chan struct{}
	if auth.remoteRevoked != nil && slices.ContainsFunc(auth.services, func(n string) bool { _, _, ok := stream.SplitRemote(n); return ok }) {
		remoteRevoked = auth.remoteRevoked
	}
	const maxBatch = 64
	batch := make([]*stream.Frame, 0, maxBatch)
	for {
		select {
		case <-done:
			return
		case <-expired:
			s.metrics.streamsEnded.WithLabelValues(DrainTokenExpired).Inc()
			send(lapsed(DrainTokenExpired, "the token this stream was opened with has expired; resubscribe with a fresh one"))
			return
		case <-remoteRevoked:
			remoteRevoked = s.cfg.Regions.Revoked()
			if !s.stillAuthorised(auth, send) {
				return
			}
		case <-revoked:
			revoked = s.cfg.Authz.Revoked()
			if !s.stillAuthorised(auth, send) {
				return
			}
		case f := <-sub.C():
			// Whatever else is queued goes out in the same write (one
			// syscall for a burst, as in an evacuation), up to a drain,
			// which ends the stream.
			batch = append(batch[:0], f)
		more:
			for len(batch) < maxBatch && f.Kind != stream.KindDrain {
				select {
				case f = <-sub.C():
					batch = append(batch, f)
				default:
					break more
				}
			}
			if !send(batch...) || f.Kind == stream.KindDrain {
				return
			}
		case <-sub.Resync():
			if !send(sub.TakeResync()...) {
				return
			}
		case <-beat.C:
			if !send(heartbeat) {
				return
			}
		}
	}
}

var heartbeat = &stream.Frame{Kind: stream.KindHeartbeat, JSON: []byte(`{}`)}

// stillAuthorised checks a stream's authority over each of its series
// again; when it lapsed for one, it sends the grant_revoked drain and
// reports false.
func (s *Server) stillAuthorised(auth authority, send func(...*stream.Frame) bool) bool {
	for _, name := range auth.services {
		if err := s.mayResolveSeries(auth.actor, name); err != nil {
			s.metrics.streamsEnded.WithLabelValues(DrainGrantRevoked).Inc()
			send(lapsed(DrainGrantRevoked, fmt.Sprintf("%s may no longer resolve %s", auth.actor, name)))
			return false
		}
	}
	return true
}

// streamHead is the response head of a hijacked stream. Without a length
// or chunking, the body runs until the connection closes (HTTP/1.1 with
// Connection: close), which is what a stream is.
const streamHead = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-store\r\n" +
	"X-Accel-Buffering: no\r\nConnection: close\r\n\r\n"

// hijack takes the connection over and writes the response head. ok is
// false when the connection cannot be hijacked (HTTP/2); conn is nil when
// it was hijacked but the head could not be written (the client is gone).
func hijack(w http.ResponseWriter) (conn net.Conn, ok bool) {
	c, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return nil, false
	}
	// A watch has no body: whatever the client sent beyond the request
	// (buffered in the discarded reader) is of no interest.
	_ = c.SetReadDeadline(time.Time{})
	_ = c.SetWriteDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, streamHead); err != nil {
		c.Close()
		return nil, true
	}
	return c, true
}

// rawSender writes frames to a hijacked connection with one writev for
// all the frames of a call (each: header, the shared JSON bytes,
// terminator; nothing is copied). The fan-out of one change to 10,000
// subscribers is 10,000 of these calls, so each costs one syscall: the
// write deadline is moved only once a quarter of it has been used (a
// write still gets between 3/4 of WatchWriteTimeout and all of it), and
// the counters are looked up once.
func (s *Server) rawSender(conn net.Conn) func(...*stream.Frame) bool {
	heads := make([]byte, 0, 64)
	var ends []int
	var bufs net.Buffers
	var deadline time.Time
	timeout := s.cfg.WatchWriteTimeout
	return func(frames ...*stream.Frame) bool {
		if now := time.Now(); deadline.Sub(now) < timeout*3/4 {
			deadline = now.Add(timeout)
			_ = conn.SetWriteDeadline(deadline)
		}
		// The heads are appended to one buffer, sliced once it is full
		// grown (appending may move it).
		heads, ends = heads[:0], ends[:0]
		for _, f := range frames {
			heads = frameHead(heads, f)
			ends = append(ends, len(heads))
		}
		bufs = bufs[:0]
		start := 0
		for i, f := range frames {
			bufs = append(bufs, heads[start:ends[i]], f.JSON, frameEnd)
			start = ends[i]
		}
		// WriteTo consumes the slice it is given; bufs keeps the
		// backing array for the next call.
		wb := bufs
		var err error
		if bw, ok := conn.(buffersWriter); ok {
			_, err = bw.WriteBuffers(&wb)
		} else {
			_, err = wb.WriteTo(conn)
		}
		if err != nil {
			return false
		}
		s.framesSent(frames)
		return true
	}
}

// framesSent counts frames written to a watch stream, and keeps how long
// each view change took from the hub to it, per service.
func (s *Server) framesSent(frames []*stream.Frame) {
	var now time.Time
	for _, f := range frames {
		s.frameSent(f.Kind)
		if s.cfg.Lags == nil || (f.Kind != stream.KindView && f.Kind != stream.KindDelta) || f.PublishedAt.IsZero() || strings.Contains(f.Service, "@") {
			continue
		}
		if now.IsZero() {
			now = s.cfg.Now() // the hub's clock in muster (app gives both its own)
		}
		s.cfg.Lags.Observe(f.Service, lagstats.Delivered, now.Sub(f.PublishedAt))
	}
}

// frameSent counts a frame written to a watch stream.
func (s *Server) frameSent(k stream.Kind) {
	if c, ok := s.metrics.framesSentBy[k]; ok {
		c.Inc()
		return
	}
	s.metrics.framesSent.WithLabelValues(string(k)).Inc()
}

var frameEnd = []byte("\n\n")

// buffersWriter is a connection a listener wrapped (internal/proxied)
// that can still write net.Buffers with one writev: net.Buffers.WriteTo
// finds writev only on the net package's own connections.
type buffersWriter interface {
	WriteBuffers(*net.Buffers) (int64, error)
}

// frameHead appends an SSE event's header lines (up to "data: ") to b.
func frameHead(b []byte, f *stream.Frame) []byte {
	b = append(b, "event: "...)
	b = append(b, f.Kind...)
	if f.Version != 0 {
		b = append(b, "\nid: "...)
		b = strconv.AppendUint(b, f.Version, 10)
	}
	return append(b, "\ndata: "...)
}

// writeFrame writes one SSE event through an io.Writer.
func writeFrame(w io.Writer, f *stream.Frame) error {
	var head [64]byte
	if _, err := w.Write(frameHead(head[:0], f)); err != nil {
		return err
	}
	if _, err := w.Write(f.JSON); err != nil {
		return err
	}
	_, err := w.Write(frameEnd)
	return err
}

// WaitStreams waits for hijacked watch streams to end, after the hub was
// closed (each gets a drain frame), or until ctx ends.
func (s *Server) WaitStreams(ctx context.Context) error { return s.streams.wait(ctx) }

// streamSet counts running streams. Unlike a WaitGroup it may be waited
// on while streams still start (a subscription that raced the hub's
// Close).
type streamSet struct {
	mu   sync.Mutex
	n    int
	idle chan struct{} // closed when n drops to 0 while someone waits
}

func (ss *streamSet) add() {
	ss.mu.Lock()
	ss.n++
	ss.mu.Unlock()
}

func (ss *streamSet) done() {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.n--; ss.n == 0 && ss.idle != nil {
		close(ss.idle)
		ss.idle = nil
	}
}

func (ss *streamSet) wait(ctx context.Context) error {
	ss.mu.Lock()
	if ss.n == 0 {
		ss.mu.Unlock()
		return nil
	}
	if ss.idle == nil {
		ss.idle = make(chan struct{})
	}
	idle := ss.idle
	ss.mu.Unlock()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// authoriseViews checks that the caller may resolve every service and that
// each exists, writing the problem when not. It asks the in-memory copy
// (Authz), never PostgreSQL: re-subscription must keep working while the
// database is away.
func (s *Server) authoriseViews(w http.ResponseWriter, r *http.Request, services []string) bool {
	for _, name := range services {
		if !registry.ValidName(name) {
			writeProblem(w, r, problem(http.StatusBadRequest, "bad-parameter", fmt.Sprintf("%q is not a service name", name)))
			return false
		}
		if err := s.cfg.Authz.MayResolve(principal(r), name); err != nil {
			s.writeError(w, r, err)
			return false
		}
		ok, err := s.cfg.Authz.ServiceExists(name)
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
	regions, p := parseRegions(r.URL.Query()["regions"])
	if p != nil {
		writeProblem(w, r, p)
		return
	}
	if svc, region, ok := stream.SplitRemote(name); ok {
		if _, ok := s.authoriseSeries(w, r, []string{name}, nil); ok {
			s.resolveRemote(w, r, region, svc)
		}
		return
	}
	// A service that is not local is answered from a peer region holding
	// it, when the caller may resolve it there.
	if exists, err := s.cfg.Authz.ServiceExists(name); err == nil && !exists && registry.ValidName(name) {
		region, err := s.pickRegion(principal(r), name, regions)
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		if region != "" {
			s.resolveRemote(w, r, region, name)
			return
		}
	}
	if !s.authoriseViews(w, r, []string{name}) {
		return
	}
	if s.cfg.Hub.Stale(name) {
		s.refuseNotCurrent(w, r, fmt.Errorf("%w: %s", stream.ErrNotCurrent, name))
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
