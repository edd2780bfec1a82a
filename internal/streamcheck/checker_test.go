package streamcheck_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/uuid"

	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/streamcheck"
	"github.com/musterhq/muster/internal/wait"
)

// fakeMuster serves /v1/watch from scripts, one per subscription (a
// script ending in "" closes the stream; otherwise it stays open), and
// /v1/resolve/{service} from views.
type fakeMuster struct {
	mu      sync.Mutex
	scripts [][]string
	resumes []string // each watch's held values, joined by commas ("" for none)
	views   map[string]assembler.View
}

func (f *fakeMuster) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Authorization") != "Bearer tok" {
		http.Error(w, "no token", http.StatusUnauthorized)
		return
	}
	if name, ok := strings.CutPrefix(r.URL.Path, "/v1/resolve/"); ok {
		f.mu.Lock()
		v, ok := f.views[name]
		f.mu.Unlock()
		if !ok {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		_ = json.NewEncoder(w).Encode(v)
		return
	}
	f.mu.Lock()
	f.resumes = append(f.resumes, strings.Join(r.URL.Query()["held"], ","))
	var script []string
	if len(f.scripts) > 0 {
		script, f.scripts = f.scripts[0], f.scripts[1:]
	}
	f.mu.Unlock()
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	for _, frame := range script {
		if frame == "" {
			return // the stream ends
		}
		_, _ = w.Write([]byte(frame))
		w.(http.Flusher).Flush()
	}
	<-r.Context().Done()
}

func (f *fakeMuster) subscriptions() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.resumes)
}

// start runs a checker of services against f until the test ends.
func start(t *testing.T, f *fakeMuster, services ...string) *streamcheck.Checker {
	t.Helper()
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	c, err := streamcheck.New(streamcheck.Config{URL: srv.URL, Services: services, Token: "tok",
		BaseBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.Run(ctx)
	}()
	// Runs before srv.Close: the stream's handler returns once the
	// checker hung up.
	t.Cleanup(func() { cancel(); <-done })
	return c
}

func ep(n byte, addr string) assembler.Endpoint {
	return assembler.Endpoint{InstanceID: uuid.UUID{n}, Address: addr, Port: 8080, Zone: "az1", State: "eligible",
		Weight: 1, Health: "known", Capabilities: []string{}}
}

var zones = map[string]assembler.ZoneStatus{"az1": {Guard: "ok", Eligible: 2, Total: 2, Registered: 2, MinHealthyFraction: 0.5, TrafficWeight: 1}}

func view(service string, version uint64, eps ...assembler.Endpoint) assembler.View {
	return assembler.View{Service: service, Version: version, Endpoints: eps, Zones: zones, Checksum: assembler.Checksum(eps)}
}

func sse(kind string, version uint64, v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return fmt.Sprintf("event: %s\nid: %d\ndata: %s\n\n", kind, version, b)
}

func viewFrame(v assembler.View) string { return sse("view", v.Version, v) }

// deltaFrame takes service from version from to the view to.
func deltaFrame(from uint64, to assembler.View, upserts []assembler.Endpoint, removals ...uuid.UUID) string {
	return sse("delta", to.Version, assembler.Delta{Service: to.Service, FromVersion: from, Version: to.Version,
		Upserts: upserts, Removals: removals, Checksum: to.Checksum})
}

const synced = "event: synced\ndata: {}\n\n"

func waitCounts(t *testing.T, c *streamcheck.Checker, what string, cond func(streamcheck.Counts) bool) streamcheck.Counts {
	t.Helper()
	wait.For(t, 10*time.Second, what, func() bool { return cond(c.Counts()) })
	return c.Counts()
}

// TestCleanStreamResumesFromWhatItHolds: a stream that checks out counts
// no problem, a new subscription names the version held of each service
// (held=web:11), and the copy equals what /v1/resolve serves.
func TestCleanStreamResumesFromWhatItHolds(t *testing.T) {
	t.Parallel()
	a, b, c := ep(1, "10.0.0.1"), ep(2, "10.0.0.2"), ep(3, "10.0.0.3")
	v10, v11, v12 := view("web", 10, a, b), view("web", 11, a, b, c), view("web", 12, b, c)
	f := &fakeMuster{
		scripts: [][]string{
			{viewFrame(v10), synced, deltaFrame(10, v11, []assembler.Endpoint{c}), "event: heartbeat\ndata: {}\n\n", ""},
			{deltaFrame(11, v12, nil, a.InstanceID), synced},
		},
		views: map[string]assembler.View{"web": v12},
	}
	chk := start(t, f, "web")
	got := waitCounts(t, chk, "two syncs", func(n streamcheck.Counts) bool { return n.Synced == 2 })
	if got.Problems() != 0 || got.FullViews != 1 || got.Deltas != 2 || got.Reconnects != 1 || got.Heartbeats != 1 {
		t.Fatalf("counts: %v; events %v", got, chk.Events())
	}
	if d := cmp.Diff([]string{"", "web:11"}, f.subscriptions()); d != "" {
		t.Fatalf("subscriptions' held (-want +got):\n%s", d)
	}
	if err := chk.Compare(context.Background()); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	f.views["web"] = view("web", 13, c)
	f.mu.Unlock()
	if err := chk.Compare(context.Background()); err == nil || !strings.Contains(err.Error(), "web: v12 held, muster serves v13") {
		t.Fatalf("Compare with muster one version ahead: %v", err)
	}
}

// TestWrongBaseDeltaIsAGap: a delta from a version other than the one held
// (what a restarted muster sent from the view it restored) is a gap; the
// checker resubscribes naming only the copy it can still trust (api:5),
// so the server sends web's full view and nothing of api.
func TestWrongBaseDeltaIsAGap(t *testing.T) {
	t.Parallel()
	a, b, c := ep(1, "10.0.0.1"), ep(2, "10.0.0.2"), ep(3, "10.0.0.3")
	api5, web10, web12 := view("api", 5, a), view("web", 10, a, b), view("web", 12, b, c)
	f := &fakeMuster{
		scripts: [][]string{
			{viewFrame(api5), viewFrame(web10), synced, deltaFrame(9, web12, []assembler.Endpoint{c}, a.InstanceID)},
			{viewFrame(web12), synced},
		},
		views: map[string]assembler.View{"web": web12, "api": api5},
	}
	chk := start(t, f, "web", "api")
	got := waitCounts(t, chk, "synced after the gap", func(n streamcheck.Counts) bool { return n.Synced == 2 })
	if got.Gaps != 1 || got.Problems() != 1 {
		t.Fatalf("counts: %v; events %v", got, chk.Events())
	}
	ev := chk.Events()
	if len(ev) != 1 || ev[0].Problem != streamcheck.Gap || ev[0].Held != 10 || ev[0].From != 9 || ev[0].Version != 12 {
		t.Fatalf("events: %v", ev)
	}
	if d := cmp.Diff([]string{"", "api:5"}, f.subscriptions()); d != "" {
		t.Fatalf("subscriptions' held (-want +got):\n%s", d)
	}
	if err := chk.Compare(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestDuplicatesAndRegressions: on a subscription that resumed at the
// version held, a full view of that version and a delta up to it are
// duplicates, a full view below it a regression; none is applied, and
// the stream goes on.
func TestDuplicatesAndRegressions(t *testing.T) {
	t.Parallel()
	a, b, c := ep(1, "10.0.0.1"), ep(2, "10.0.0.2"), ep(3, "10.0.0.3")
	v9, v10, v11 := view("web", 9, a), view("web", 10, a, b), view("web", 11, a, b, c)
	f := &fakeMuster{
		scripts: [][]string{
			{viewFrame(v10), synced, ""},
			{viewFrame(v10), deltaFrame(9, v10, []assembler.Endpoint{b}), viewFrame(v9), deltaFrame(10, v11, []assembler.Endpoint{c}), synced},
		},
		views: map[string]assembler.View{"web": v11},
	}
	chk := start(t, f, "web")
	got := waitCounts(t, chk, "two syncs", func(n streamcheck.Counts) bool { return n.Synced == 2 })
	if got.Duplicates != 2 || got.Regressions != 1 || got.Gaps != 0 || got.ChecksumMismatches != 0 || got.Reconnects != 1 {
		t.Fatalf("counts: %v; events %v", got, chk.Events())
	}
	if d := cmp.Diff([]string{"", "web:10"}, f.subscriptions()); d != "" {
		t.Fatalf("subscriptions' held (-want +got):\n%s", d)
	}
	if err := chk.Compare(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestBadChecksum: a delta that does not give the checksum it announces,
// and a view whose endpoints do not sum to its own, are counted; after
// each the checker resubscribes for full views, and a full view of the
// version whose delta was bad replaces the suspect copy.
func TestBadChecksum(t *testing.T) {
	t.Parallel()
	a, b, c := ep(1, "10.0.0.1"), ep(2, "10.0.0.2"), ep(3, "10.0.0.3")
	v10, v11 := view("web", 10, a, b), view("web", 11, a, b, c)
	badDelta := deltaFrame(10, view("web", 11, a, b, c, ep(4, "10.0.0.4")), []assembler.Endpoint{c})
	badView := view("web", 12, a)
	badView.Checksum = v11.Checksum
	f := &fakeMuster{
		scripts: [][]string{
			{viewFrame(v10), synced, badDelta},
			{viewFrame(v11), synced, viewFrame(badView)},
			{viewFrame(v11), synced},
		},
		views: map[string]assembler.View{"web": v11},
	}
	chk := start(t, f, "web")
	got := waitCounts(t, chk, "three syncs", func(n streamcheck.Counts) bool { return n.Synced == 3 })
	if got.ChecksumMismatches != 2 || got.Problems() != 2 {
		t.Fatalf("counts: %v; events %v", got, chk.Events())
	}
	if d := cmp.Diff([]string{"", "", ""}, f.subscriptions()); d != "" {
		t.Fatalf("subscriptions' held (-want +got):\n%s", d)
	}
	if err := chk.Compare(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestMalformedFrames: a frame whose SSE id is not its version, or that
// names a service the stream did not ask for, is malformed.
func TestMalformedFrames(t *testing.T) {
	t.Parallel()
	a := ep(1, "10.0.0.1")
	v10 := view("web", 10, a)
	f := &fakeMuster{
		scripts: [][]string{
			{sse("view", 11, v10)},
			{viewFrame(view("api", 3, a))},
			{viewFrame(v10), synced},
		},
		views: map[string]assembler.View{"web": v10},
	}
	chk := start(t, f, "web")
	got := waitCounts(t, chk, "synced", func(n streamcheck.Counts) bool { return n.Synced == 1 })
	if got.Malformed != 2 || got.Problems() != 2 {
		t.Fatalf("counts: %v; events %v", got, chk.Events())
	}
	if err := chk.Compare(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestRefusedSubscriptionIsRetried: a refused subscription (503, as admission
// answers) is counted and retried.
func TestRefusedSubscriptionIsRetried(t *testing.T) {
	t.Parallel()
	v10 := view("web", 10, ep(1, "10.0.0.1"))
	f := &fakeMuster{scripts: [][]string{{viewFrame(v10), synced}}, views: map[string]assembler.View{"web": v10}}
	var refused sync.Once
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		first := false
		refused.Do(func() { first = true })
		if first {
			http.Error(w, "admission", http.StatusServiceUnavailable)
			return
		}
		f.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	chk, err := streamcheck.New(streamcheck.Config{URL: srv.URL, Services: []string{"web"}, Token: "tok",
		BaseBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); chk.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	got := waitCounts(t, chk, "synced", func(n streamcheck.Counts) bool { return n.Synced == 1 })
	if got.Refused != 1 || got.Subscriptions != 1 || got.Reconnects != 0 || got.Problems() != 0 || !chk.Synced() {
		t.Fatalf("counts: %v", got)
	}
}

// TestEmptiedCopiesAreCounted: a frame that leaves the copy of a service
// with no endpoint is counted (not a problem of the stream: a service may
// have none), so a test whose services always have instances can say
// that no subscriber was ever left with nothing.
func TestEmptiedCopiesAreCounted(t *testing.T) {
	t.Parallel()
	a := ep(1, "10.0.0.1")
	v10, v11 := view("web", 10, a), view("web", 11)
	f := &fakeMuster{
		scripts: [][]string{{viewFrame(v10), synced, deltaFrame(10, v11, nil, a.InstanceID), synced}},
		views:   map[string]assembler.View{"web": v11},
	}
	chk := start(t, f, "web")
	got := waitCounts(t, chk, "two syncs", func(n streamcheck.Counts) bool { return n.Synced == 2 })
	if got.Emptied != 1 || got.Problems() != 0 {
		t.Fatalf("counts: %v; events %v", got, chk.Events())
	}
}
