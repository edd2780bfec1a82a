package server_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/stream"
)

type event struct{ kind, id, data string }

// readEvents reads n SSE events from an open watch response.
func readEvents(t *testing.T, sc *bufio.Scanner, n int) []event {
	t.Helper()
	var out []event
	var ev event
	for len(out) < n && sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			out = append(out, ev)
			ev = event{}
		case strings.HasPrefix(line, "event: "):
			ev.kind = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "id: "):
			ev.id = strings.TrimPrefix(line, "id: ")
		case strings.HasPrefix(line, "data: "):
			ev.data = strings.TrimPrefix(line, "data: ")
		}
	}
	if len(out) < n {
		t.Fatalf("stream ended after %d of %d events: %v", len(out), n, sc.Err())
	}
	return out
}

func openWatch(t *testing.T, s *apptest.Stack, token, query string) (*http.Response, *bufio.Scanner) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	req, _ := http.NewRequestWithContext(ctx, "GET", s.URL+"/v1/watch?"+query, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	res, err := s.Client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { res.Body.Close() })
	return res, bufio.NewScanner(res.Body)
}

func frame(kind stream.Kind, service string, from, v uint64) *stream.Frame {
	return &stream.Frame{Kind: kind, Service: service, FromVersion: from, Version: v,
		JSON: fmt.Appendf(nil, `{"service":%q,"from_version":%d,"version":%d}`, service, from, v)}
}

func TestWatchStreamsViewsThenDeltas(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.Seed(t)
	s.Hub.Publish([]stream.Update{{View: frame(stream.KindView, "web", 0, 10)}})
	s.Hub.Publish([]stream.Update{{View: frame(stream.KindView, "web", 0, 11), Delta: frame(stream.KindDelta, "web", 10, 11)}})
	web := s.Token(t, webReq)

	// A new client gets the full view, then live deltas.
	res, sc := openWatch(t, s, web, "service=web")
	if res.StatusCode != http.StatusOK || res.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("watch: %d %v", res.StatusCode, res.Header)
	}
	if evs := readEvents(t, sc, 2); evs[0].kind != "view" || evs[0].id != "11" || evs[1].kind != "synced" {
		t.Fatalf("first events %+v, want the full view at 11, then synced", evs)
	}
	s.Hub.Publish([]stream.Update{{View: frame(stream.KindView, "web", 0, 12), Delta: frame(stream.KindDelta, "web", 11, 12)}})
	if ev := readEvents(t, sc, 1)[0]; ev.kind != "delta" || ev.id != "12" || !strings.Contains(ev.data, `"from_version":11`) {
		t.Fatalf("live event %+v", ev)
	}

	// A client at 10 resumes with deltas; one at 12 gets nothing until
	// something changes.
	_, sc2 := openWatch(t, s, web, "service=web&since=10")
	if evs := readEvents(t, sc2, 3); evs[0].kind != "delta" || evs[0].id != "11" || evs[1].id != "12" || evs[2].kind != "synced" {
		t.Fatalf("resume from 10: %+v", evs)
	}
	_, sc3 := openWatch(t, s, web, "service=web&since=12")
	if ev := readEvents(t, sc3, 1)[0]; ev.kind != "synced" {
		t.Fatalf("a current client got %+v, want synced alone", ev)
	}
	s.Hub.Publish([]stream.Update{{View: frame(stream.KindView, "web", 0, 13), Delta: frame(stream.KindDelta, "web", 12, 13)}})
	if ev := readEvents(t, sc3, 1)[0]; ev.kind != "delta" || ev.id != "13" {
		t.Fatalf("current client: %+v", ev)
	}

	// held (issue 27): each service from exactly the version named, so a
	// client above since's reach is neither taken as current nor sent
	// what it holds.
	_, sc4 := openWatch(t, s, web, "service=web&since=99&held=web:11")
	if evs := readEvents(t, sc4, 3); evs[0].kind != "delta" || evs[0].id != "12" || evs[1].id != "13" || evs[2].kind != "synced" {
		t.Fatalf("held web:11: %+v", evs)
	}
	_, sc5 := openWatch(t, s, web, "service=web&held=web:14")
	if ev := readEvents(t, sc5, 1)[0]; ev.kind != "synced" {
		t.Fatalf("a client ahead of the server got %+v, want synced alone", ev)
	}
	s.Hub.Publish([]stream.Update{{View: frame(stream.KindView, "web", 0, 14), Delta: frame(stream.KindDelta, "web", 13, 14)}})
	s.Hub.Publish([]stream.Update{{View: frame(stream.KindView, "web", 0, 15), Delta: frame(stream.KindDelta, "web", 14, 15)}})
	if ev := readEvents(t, sc5, 1)[0]; ev.kind != "delta" || ev.id != "15" {
		t.Fatalf("a client ahead got %+v first, want the delta to 15 (nothing at or below 14)", ev)
	}

	// Resolve serves the same bytes as the stream's view.
	r := s.Do(t, "GET", "/v1/resolve/web", web, "", "")
	if r.Status != http.StatusOK || r.Header.Get("ETag") != `"15"` || !strings.Contains(string(r.Body), `"version":15`) {
		t.Fatalf("resolve: %d %v %s", r.Status, r.Header, r.Body)
	}
}

func TestWatchAndResolveNeedAGrant(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.Seed(t)
	s.Hub.Publish([]stream.Update{{View: frame(stream.KindView, "web", 0, 1)}})
	api := s.Token(t, apiReq)
	for _, path := range []string{"/v1/watch?service=web", "/v1/resolve/web", "/v1/watch?service=api&service=web"} {
		r := s.Do(t, "GET", path, api, "", "")
		if r.Status != http.StatusForbidden || r.Problem(t).Type != "https://muster.dev/problems/forbidden" {
			t.Errorf("%s by an ungranted caller: %d %s", path, r.Status, r.Body)
		}
	}
	// Nor can it tell a missing service from a refused one.
	if r := s.Do(t, "GET", "/v1/resolve/no-such-service", api, "", ""); r.Status != http.StatusForbidden {
		t.Errorf("missing service: %d", r.Status)
	}
	if r := s.JSON(t, "PUT", "/v1/services/web/grants", s.Token(t, oscarReq), `{"callers":["api"]}`); r.Status != http.StatusOK {
		t.Fatalf("grant: %d %s", r.Status, r.Body)
	}
	if r := s.Do(t, "GET", "/v1/resolve/web", api, "", ""); r.Status != http.StatusOK {
		t.Fatalf("granted resolve: %d %s", r.Status, r.Body)
	}
	// An operator typo is a 404, not a stream that waits forever.
	if r := s.Do(t, "GET", "/v1/watch?service=wbe", s.Token(t, veraReq), "", ""); r.Status != http.StatusNotFound {
		t.Errorf("unknown service: %d", r.Status)
	}
	for _, q := range []string{"", "service=web&since=-1", "service=Not_A_Name",
		"service=web&held=web", "service=web&held=web:", "service=web&held=web:0", "service=web&held=web:x",
		"service=web&held=api:3", "service=web&held=web:3&held=web:4", "service=web&held=:3"} {
		r := s.Do(t, "GET", "/v1/watch?"+q, api, "", "")
		if r.Status != http.StatusBadRequest || r.Problem(t).Type != "https://muster.dev/problems/bad-parameter" {
			t.Errorf("watch?%s: %d %s", q, r.Status, r.Body)
		}
	}
}

func TestWatchDrainsOnShutdown(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.Seed(t)
	s.Hub.Publish([]stream.Update{{View: frame(stream.KindView, "web", 0, 1)}})
	_, sc := openWatch(t, s, s.Token(t, webReq), "service=web")
	readEvents(t, sc, 2) // view, synced
	s.Hub.Close()
	if ev := readEvents(t, sc, 1)[0]; ev.kind != "drain" {
		t.Fatalf("got %+v, want drain", ev)
	}
	if sc.Scan() {
		t.Fatalf("stream stayed open after drain: %q", sc.Text())
	}
	r := s.Do(t, "GET", "/v1/watch?service=web", s.Token(t, webReq), "", "")
	if r.Status != http.StatusServiceUnavailable || r.Header.Get("Retry-After") == "" {
		t.Fatalf("subscribe while draining: %d", r.Status)
	}
	// Shutdown can wait for every stream to have ended.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Server.WaitStreams(ctx); err != nil {
		t.Fatalf("streams still running after drain: %v", err)
	}
}

// pipeWriter is a ResponseWriter that cannot be hijacked (as under HTTP/2),
// streaming its body into a pipe.
type pipeWriter struct {
	h      http.Header
	status chan int
	w      *io.PipeWriter
}

func (p *pipeWriter) Header() http.Header         { return p.h }
func (p *pipeWriter) WriteHeader(code int)        { p.status <- code }
func (p *pipeWriter) Write(b []byte) (int, error) { return p.w.Write(b) }
func (p *pipeWriter) Flush()                      {}

// TestWatchWithoutHijack covers the path for connections that cannot be
// taken over: the same events through the ResponseWriter.
func TestWatchWithoutHijack(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.Seed(t)
	s.Hub.Publish([]stream.Update{{View: frame(stream.KindView, "web", 0, 5)}})
	pr, pw := io.Pipe()
	rw := &pipeWriter{h: http.Header{}, status: make(chan int, 1), w: pw}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req := httptest.NewRequestWithContext(ctx, "GET", "/v1/watch?service=web", nil)
	req.RemoteAddr = "127.0.0.1:40000"
	req.Header.Set("Authorization", "Bearer "+s.Token(t, webReq))
	done := make(chan struct{})
	go func() { s.Server.ServeHTTP(rw, req); pw.Close(); close(done) }()
	if code := <-rw.status; code != http.StatusOK || rw.h.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("status %d, header %v", code, rw.h)
	}
	sc := bufio.NewScanner(pr)
	if evs := readEvents(t, sc, 2); evs[0].kind != "view" || evs[0].id != "5" || evs[1].kind != "synced" {
		t.Fatalf("first events %+v", evs)
	}
	s.Hub.Publish([]stream.Update{{View: frame(stream.KindView, "web", 0, 6), Delta: frame(stream.KindDelta, "web", 5, 6)}})
	if ev := readEvents(t, sc, 1)[0]; ev.kind != "delta" || ev.id != "6" {
		t.Fatalf("second event %+v", ev)
	}
	cancel() // the client goes away: the handler returns
	go io.Copy(io.Discard, pr)
	<-done
}

// TestWatchNoSyncedBeforeAView: a subscriber admitted while muster has no
// view of its service (the evaluator rebuilding after a restart) gets
// heartbeats, not synced; the first publication reaches it as the full
// view even though it carries a delta from a version an earlier process
// published, and synced follows.
func TestWatchNoSyncedBeforeAView(t *testing.T) {
	t.Parallel()
	s := apptest.New(t, apptest.Options{WatchHeartbeat: 20 * time.Millisecond})
	s.Seed(t)
	_, sc := openWatch(t, s, s.Token(t, webReq), "service=web&since=900")
	for i, ev := range readEvents(t, sc, 3) {
		if ev.kind != "heartbeat" {
			t.Fatalf("event %d before any view: %+v, want heartbeats only", i, ev)
		}
	}
	s.Hub.Publish([]stream.Update{{View: frame(stream.KindView, "web", 0, 1001), Delta: frame(stream.KindDelta, "web", 900, 1001)}})
	var got []event
	for len(got) < 2 {
		if ev := readEvents(t, sc, 1)[0]; ev.kind != "heartbeat" {
			got = append(got, ev)
		}
	}
	if got[0].kind != "view" || got[0].id != "1001" || got[1].kind != "synced" {
		t.Fatalf("after the first publication: %+v, want the full view at 1001, then synced", got)
	}
}

// TestAStaleServiceIsNotServedAsCurrent: a service the relay judged
// stale here (this replica cannot follow its owner while another replica
// can) is drained from open watch streams (drain, reason not_current)
// and refused to a new watch and to resolve with 503 not-current and a
// retry hint, on a connection that closes (a load balancer that routes
// by connection picks another replica for the retry); once current it is
// served again.
func TestAStaleServiceIsNotServedAsCurrent(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.Seed(t)
	s.Hub.Publish([]stream.Update{{View: frame(stream.KindView, "web", 0, 10)}})
	web := s.Token(t, webReq)
	_, sc := openWatch(t, s, web, "service=web")
	if evs := readEvents(t, sc, 2); evs[0].kind != "view" || evs[1].kind != "synced" {
		t.Fatalf("first events %+v", evs)
	}
	if n := s.Hub.SetStale([]string{"web"}); n != 1 {
		t.Fatalf("SetStale drained %d subscriptions, want 1", n)
	}
	if ev := readEvents(t, sc, 1)[0]; ev.kind != "drain" || !strings.Contains(ev.data, stream.DrainNotCurrent) {
		t.Fatalf("after web went stale: %+v, want a not_current drain", ev)
	}
	for _, path := range []string{"/v1/watch?service=web", "/v1/resolve/web"} {
		r := s.Do(t, "GET", path, web, "", "")
		wantProblem(t, r, http.StatusServiceUnavailable, "not-current")
		if r.Header.Get("Retry-After") != "1" {
			t.Fatalf("GET %s: Retry-After %q, want 1", path, r.Header.Get("Retry-After"))
		}
	}
	s.Hub.SetStale(nil)
	if r := s.Do(t, "GET", "/v1/resolve/web", web, "", ""); r.Status != http.StatusOK {
		t.Fatalf("resolve once current: %d %s", r.Status, r.Body)
	}
}
