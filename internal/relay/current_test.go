package relay_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/musterhq/muster/internal/relay"
	"github.com/musterhq/muster/internal/stream"
	"github.com/musterhq/muster/internal/testclock"
	"github.com/musterhq/muster/internal/wait"
)

// talker is a peer replica's stream that says a line when told to.
type talker struct {
	srv   *httptest.Server
	lines chan string
}

func newTalker(t *testing.T) *talker {
	tk := &talker{lines: make(chan string, 16)}
	tk.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		for {
			select {
			case <-r.Context().Done():
				return
			case l := <-tk.lines:
				_, _ = w.Write([]byte(l + "\n"))
				w.(http.Flusher).Flush()
			}
		}
	}))
	t.Cleanup(tk.srv.Close)
	return tk
}

// memReports are the reports, held in memory.
type memReports struct {
	mu     sync.Mutex
	others []relay.Report
	mine   relay.Report
	fail   error
}

func (m *memReports) Put(_ context.Context, r relay.Report) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.mine = r
	return nil
}

func (m *memReports) Fresh(context.Context, time.Duration) ([]relay.Report, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fail != nil {
		return nil, m.fail
	}
	return append([]relay.Report{m.mine}, m.others...), nil
}

func (m *memReports) Forget(context.Context, string) error { return nil }

func (m *memReports) set(rs ...relay.Report) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.others = rs
}

// TestRelayStopsServingAnOwnerItCannotHear: replica b follows a (the
// owner of web) and c (the owner of api). A peer quiet for one missed
// heartbeat (4.5 s) changes nothing. Quiet for 6 s while c reports
// hearing it 1 s ago, a's services are stale at b: web's subscriber is
// told to drain (not_current), a new subscription to web is refused, api's
// subscriber is left alone, b stays ready (it hears c) and raises
// relay_cut_off. When b hears neither while c hears a, b is cut off (not
// ready). A peer nobody has heard lately (it died) moves nobody, and
// neither do reports unreadable for longer than 5 s (one failed reading
// changes nothing). Lines from a and c make web current again.
func TestRelayStopsServingAnOwnerItCannotHear(t *testing.T) {
	t.Parallel()
	a, c := newTalker(t), newTalker(t)
	ps := &peers{}
	ps.set(relay.Peer{ID: "a", Address: a.srv.URL}, relay.Peer{ID: "c", Address: c.srv.URL})
	clk := testclock.New(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	reports := &memReports{}
	var staleHook []string
	var hookMu sync.Mutex
	r, hub, reg := newRelay(t, ps, func(cfg *relay.Config) {
		cfg.Refresh = time.Hour // stepped with RunOnce
		cfg.Now = clk.Now
		cfg.Reports = reports
		cfg.Owned = func() []int { return []int{9} }
		cfg.ShardOf = func(s string) (int, bool) {
			return map[string]int{"web": 1, "api": 3, "own": 9}[s], true
		}
		cfg.OnStale = func(s []string) { hookMu.Lock(); staleHook = append(staleHook, s...); hookMu.Unlock() }
	})
	for _, s := range []string{"web", "api", "own"} {
		publish(hub, s, 1)
	}
	ctx := context.Background()
	say := func(tk *talker, id string) {
		t.Helper()
		tk.lines <- `{"kind":"heartbeat"}`
		wait.For(t, 10*time.Second, "a line of "+id+" read", func() bool {
			for _, st := range r.Status() {
				if st.Peer == id && st.LastRecordAt.Equal(clk.Now()) {
					return true
				}
			}
			return false
		})
	}
	// c heard a `ago` before a report made `age` ago, and owns api.
	cHears := func(ago time.Duration) relay.Report {
		return relay.Report{Replica: "c", Heard: map[string]time.Duration{"a": ago, "b": 0}, Shards: []int{3}, Age: 500 * time.Millisecond}
	}
	aReport := relay.Report{Replica: "a", Heard: map[string]time.Duration{"c": 0}, Shards: []int{1}, Age: 500 * time.Millisecond}
	wait.For(t, 10*time.Second, "both streams open", func() bool {
		st := r.Status()
		return len(st) == 2 && st[0].Connected && st[1].Connected
	})
	say(a, "a")
	say(c, "c")
	webSub, err := hub.Subscribe([]string{"web"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer webSub.Close()
	apiSub, err := hub.Subscribe([]string{"api", "own"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer apiSub.Close()
	drained := func(sub *stream.Subscription) bool {
		for {
			select {
			case f := <-sub.C():
				if f.Kind == stream.KindDrain {
					return strings.Contains(string(f.JSON), stream.DrainNotCurrent)
				}
			default:
				return false
			}
		}
	}
	staleAlarms := func() int {
		n := 0
		for _, al := range r.Alarms() {
			if al.Kind == relay.AlarmRelayCutOff {
				n++
			}
		}
		return n
	}

	// One missed heartbeat: 4.5 s without a line from a, c heard it
	// 0.5 s ago. Nothing moves.
	clk.Advance(4500 * time.Millisecond)
	say(c, "c")
	reports.set(cHears(0), aReport)
	r.RunOnce(ctx)
	if hub.Stale("web") || drained(webSub) || r.Ready() != nil || staleAlarms() != 0 {
		t.Fatalf("a peer quiet for 4.5 s (one missed heartbeat) moved subscribers: stale %v, ready %v, alarms %v", hub.Stale("web"), r.Ready(), r.Alarms())
	}

	// 6 s without a line from a, which c heard 1 s ago: web is stale.
	clk.Advance(1500 * time.Millisecond)
	say(c, "c")
	reports.set(cHears(500*time.Millisecond), aReport)
	r.RunOnce(ctx)
	if !hub.Stale("web") || hub.Stale("api") || hub.Stale("own") {
		t.Fatalf("stale web %v api %v own %v; want web only", hub.Stale("web"), hub.Stale("api"), hub.Stale("own"))
	}
	if !drained(webSub) {
		t.Fatal("web's subscriber was not told to drain (not_current)")
	}
	if drained(apiSub) {
		t.Fatal("a subscriber of api and own (owners heard) was told to drain")
	}
	if _, err := hub.Subscribe([]string{"api", "web"}, 0); !errors.Is(err, stream.ErrNotCurrent) {
		t.Fatalf("subscribing to web while stale: %v, want ErrNotCurrent", err)
	}
	if err := r.Ready(); err != nil {
		t.Fatalf("b hears c, yet not ready: %v", err)
	}
	if staleAlarms() != 1 {
		t.Fatalf("alarms %v, want one relay_cut_off", r.Alarms())
	}
	hookMu.Lock()
	if len(staleHook) != 1 || staleHook[0] != "web" {
		t.Fatalf("OnStale told %v, want [web]", staleHook)
	}
	hookMu.Unlock()
	if got := gauge(t, reg, "muster_relay_stale_services"); got != 1 {
		t.Fatalf("muster_relay_stale_services %v, want 1", got)
	}
	for _, st := range r.Status() {
		if st.Peer == "a" && (!st.Stale || st.Heard || st.StaleServices != 1 || len(st.HeardBy) != 1 || st.HeardBy[0] != "c") {
			t.Fatalf("a's status %+v", st)
		}
	}

	// b hears neither, c still hears a: b is cut off, not ready.
	clk.Advance(6 * time.Second)
	reports.set(cHears(500*time.Millisecond), aReport)
	r.RunOnce(ctx)
	if err := r.Ready(); err == nil {
		t.Fatal("b hears no peer while c hears a, yet ready")
	}
	if got := gauge(t, reg, "muster_relay_cut_off"); got != 1 {
		t.Fatalf("muster_relay_cut_off %v, want 1", got)
	}

	// Nobody heard a lately (it died, and reports no more): nothing is
	// stale, b is ready.
	reports.set(cHears(12 * time.Second))
	r.RunOnce(ctx)
	if hub.Stale("web") || r.Ready() != nil {
		t.Fatalf("a peer quiet for everyone left web stale %v, ready %v", hub.Stale("web"), r.Ready())
	}
	reports.set(cHears(500*time.Millisecond), aReport)
	r.RunOnce(ctx)
	if !hub.Stale("web") {
		t.Fatal("web not stale again")
	}

	// The reports cannot be read: a single failure changes nothing; after
	// 5 s without them every view is served as current.
	reports.mu.Lock()
	reports.fail = errors.New("database unreachable")
	reports.mu.Unlock()
	r.RunOnce(ctx)
	if !hub.Stale("web") {
		t.Fatal("one failed reading of the reports made web current: subscribers would flap")
	}
	clk.Advance(6 * time.Second)
	r.RunOnce(ctx)
	if hub.Stale("web") || r.Ready() != nil {
		t.Fatalf("without reports for 6 s web stale %v, ready %v", hub.Stale("web"), r.Ready())
	}
	reports.mu.Lock()
	reports.fail = nil
	reports.mu.Unlock()

	// a and c talk again: web is current.
	say(a, "a")
	say(c, "c")
	r.RunOnce(ctx)
	if hub.Stale("web") || r.Ready() != nil || staleAlarms() != 0 {
		t.Fatalf("a heard again, yet web stale %v, ready %v, alarms %v", hub.Stale("web"), r.Ready(), r.Alarms())
	}
	sub, err := hub.Subscribe([]string{"web"}, 0)
	if err != nil {
		t.Fatalf("subscribing to web once current: %v", err)
	}
	sub.Close()
}

// gauge reads an unlabelled gauge of reg (-1: none).
func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return -1
}
