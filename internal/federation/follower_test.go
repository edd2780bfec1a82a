package federation

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/wait"
	"github.com/musterhq/muster/resolver"
)

// fakePeer is a peer region's muster as far as a follower sees it: GET
// /v1/services in pages of one, GET /v1/watch streaming full views, then
// synced and heartbeats. As muster's hub, it sends nothing of a service
// whose held= version is at or above its own (a client ahead of it). It
// records every request, and can be taken down (every request 503, open
// streams cut) and changed.
type fakePeer struct {
	mu       sync.Mutex
	views    map[string]resolver.View
	down     bool
	requests []string // method, path and token
	cut      chan struct{}
}

func newFakePeer() *fakePeer {
	return &fakePeer{views: map[string]resolver.View{}, cut: make(chan struct{})}
}

func (p *fakePeer) set(v resolver.View) {
	p.mu.Lock()
	defer p.mu.Unlock()
	v.Checksum = resolver.Checksum(v.Endpoints)
	p.views[v.Service] = v
}

func (p *fakePeer) drop(service string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.views, service)
}

func (p *fakePeer) setDown(down bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if down && !p.down {
		close(p.cut)
	}
	if !down && p.down {
		p.cut = make(chan struct{})
	}
	p.down = down
}

func (p *fakePeer) seen() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.requests)
}

func (p *fakePeer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.mu.Lock()
	p.requests = append(p.requests, r.Method+" "+r.URL.Path+" "+r.Header.Get("Authorization"))
	down, cut := p.down, p.cut
	names := make([]string, 0, len(p.views))
	for s := range p.views {
		names = append(names, s)
	}
	views := map[string]resolver.View{}
	for s, v := range p.views {
		views[s] = v
	}
	p.mu.Unlock()
	slices.Sort(names)
	if down {
		http.Error(w, "down", http.StatusServiceUnavailable)
		return
	}
	switch r.URL.Path {
	case "/v1/services":
		// Pages of one, after the cursor (the previous page's last name).
		after := r.URL.Query().Get("cursor")
		var page []map[string]string
		next := ""
		for _, s := range names {
			if s > after {
				page = append(page, map[string]string{"name": s})
				next = s
				break
			}
		}
		if next == names[len(names)-1] {
			next = ""
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"items": page, "next_cursor": next})
	case "/v1/watch":
		for _, s := range r.URL.Query()["service"] {
			if _, ok := views[s]; !ok {
				http.Error(w, "no service "+s, http.StatusNotFound)
				return
			}
		}
		held := map[string]uint64{}
		for _, h := range r.URL.Query()["held"] {
			if s, v, ok := strings.Cut(h, ":"); ok {
				n, _ := strconv.ParseUint(v, 10, 64)
				held[s] = n
			}
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for _, s := range r.URL.Query()["service"] {
			if h, ok := held[s]; ok && h >= views[s].Version {
				continue
			}
			b, _ := json.Marshal(views[s])
			fmt.Fprintf(w, "event: view\ndata: %s\n\n", b)
		}
		fmt.Fprint(w, "event: synced\ndata: {}\n\n")
		w.(http.Flusher).Flush()
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-r.Context().Done():
				return
			case <-cut:
				return
			case <-t.C:
				fmt.Fprint(w, "event: heartbeat\ndata: {}\n\n")
				w.(http.Flusher).Flush()
			}
		}
	default:
		http.NotFound(w, r)
	}
}

type fakeAudit struct {
	mu   sync.Mutex
	rows []audit.Entry
}

func (a *fakeAudit) Append(_ context.Context, _ time.Time, e audit.Entry) (audit.Event, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.rows = append(a.rows, e)
	return audit.Event{}, nil
}

func (a *fakeAudit) entries() []audit.Entry {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.rows)
}

// TestFollowerFollowsAndHeals: a follower lists the peer's services
// (every page), follows their views into the aggregate, sends only GET
// requests with the token file's current content, goes stale with the
// alarm when the peer is down, and on the peer's return replaces its
// copy from the peer's current views (a changed service, one vanished,
// one appeared) with exactly one audit row.
func TestFollowerFollowsAndHeals(t *testing.T) {
	peer := newFakePeer()
	peer.set(resolver.View{Service: "billing", Version: 1, Endpoints: []resolver.Endpoint{ep("00000000-0000-0000-0000-000000000001", "10.0.0.1", 80)}})
	peer.set(resolver.View{Service: "search", Version: 3, Endpoints: []resolver.Endpoint{ep("00000000-0000-0000-0000-000000000009", "10.0.0.9", 80)}})
	srv := httptest.NewServer(peer)
	defer srv.Close()
	tok := filepath.Join(t.TempDir(), "b.token")
	if err := os.WriteFile(tok, []byte("first-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	au := &fakeAudit{}
	fed, err := New(Config{
		Region: "a", Peers: []PeerConfig{{Name: "b", URLs: []string{srv.URL}, TokenFile: tok}},
		CacheDir: t.TempDir(), StaleAfter: 2 * time.Second, Discover: 50 * time.Millisecond, Tick: 20 * time.Millisecond,
		BaseBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond, Audit: au,
		Owns: func(key string) bool { return key == "federation:b" },
	})
	if err != nil {
		t.Fatal(err)
	}
	fl := fed.Followers()
	if len(fl) != 1 || fl[0].Name() != "federation b" {
		t.Fatalf("followers: %v", fl)
	}
	if err := fl[0].Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	defer fl[0].Stop()
	agg := fed.Aggregate
	status := func() PeerStatus { return agg.Regions()[0] }
	wait.For(t, 30*time.Second, "b followed: both services, connected", func() bool {
		st := status()
		_, _, ok1 := agg.View("b", "billing")
		_, _, ok2 := agg.View("b", "search")
		return st.Connected && slices.Equal(st.Services, []string{"billing", "search"}) && ok1 && ok2
	})
	// A view the peer publishes reaches the aggregate.
	peer.set(resolver.View{Service: "billing", Version: 2, Endpoints: []resolver.Endpoint{ep("00000000-0000-0000-0000-000000000001", "10.0.0.1", 80)}})
	peer.setDown(true) // cut the stream so the next subscription sees v2
	peer.setDown(false)
	wait.For(t, 30*time.Second, "billing v2 at a", func() bool { v, _, _ := agg.View("b", "billing"); return v.View.Version == 2 })
	if len(au.entries()) != 0 {
		t.Fatalf("audit rows before any partition: %+v", au.entries())
	}
	// The token file is read again.
	if err := os.WriteFile(tok, []byte("second-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 30*time.Second, "the rotated token in use", func() bool {
		return slices.ContainsFunc(peer.seen(), func(s string) bool { return strings.HasSuffix(s, "Bearer second-token") })
	})

	// Down: stale, alarm, the copy served as it was.
	peer.setDown(true)
	wait.For(t, 30*time.Second, "b stale with peer_stale", func() bool {
		return status().Stale && len(agg.Alarms()) == 1
	})
	if v, age, ok := agg.View("b", "billing"); !ok || v.View.Version != 2 || age < 300*time.Millisecond {
		t.Fatalf("billing while b is down: %+v %s %v", v, age, ok)
	}
	// Changed while down: billing v7 with a second endpoint, search gone,
	// fraud new.
	peer.set(resolver.View{Service: "billing", Version: 7, Endpoints: []resolver.Endpoint{
		ep("00000000-0000-0000-0000-000000000001", "10.0.0.1", 80), ep("00000000-0000-0000-0000-000000000002", "10.0.0.2", 80)}})
	peer.drop("search")
	peer.set(resolver.View{Service: "fraud", Version: 4})
	peer.setDown(false)
	wait.For(t, 30*time.Second, "the heal's audit row", func() bool { return len(au.entries()) >= 1 })
	wait.For(t, 30*time.Second, "b reached again", func() bool { st := status(); return !st.Stale && st.Connected && len(agg.Alarms()) == 0 })
	rows := au.entries()
	if len(rows) != 1 || rows[0].Action != ActionReconcile || rows[0].Actor != "system:federation" || rows[0].Target != "b" {
		t.Fatalf("audit rows: %+v", rows)
	}
	rec := rows[0].After.(Reconciliation)
	want := []ServiceChange{
		{Service: "billing", Change: ChangeChanged, OldVersion: 2, NewVersion: 7, EndpointsAdded: 1},
		{Service: "fraud", Change: ChangeAppeared, NewVersion: 4},
		{Service: "search", Change: ChangeVanished, OldVersion: 3, EndpointsRemoved: 1},
	}
	if !slices.Equal(rec.Services, want) {
		t.Fatalf("reconciliation %+v; want %+v", rec.Services, want)
	}
	if got := agg.Services("b"); !slices.Equal(got, []string{"billing", "fraud"}) {
		t.Fatalf("services held after the heal: %v", got)
	}
	// A shrink to nothing, which a routing client's guard would hold back
	// for the confirm time: the aggregate holds what the peer published.
	peer.set(resolver.View{Service: "billing", Version: 9, Endpoints: []resolver.Endpoint{}})
	peer.setDown(true)
	peer.setDown(false)
	wait.For(t, 30*time.Second, "billing v9, empty, at a", func() bool {
		v, _, _ := agg.View("b", "billing")
		return v.View.Version == 9 && len(v.View.Endpoints) == 0
	})
	// Read-only: every request a GET.
	for _, r := range peer.seen() {
		if !strings.HasPrefix(r, "GET ") {
			t.Fatalf("a request that is not a GET: %s", r)
		}
	}
	if st := status(); st.Reconciliations != 1 || strings.Contains(st.LastError, "token") && strings.Contains(st.LastError, "second-token") {
		t.Fatalf("status after the heal: %+v", st)
	}
}

// TestHealRowWaitsForTheOwner: a replica that heals before it owns the
// peer's key (at start, before its shard leases are read) keeps the row
// and writes it once it owns the key; the heal itself does not wait.
func TestHealRowWaitsForTheOwner(t *testing.T) {
	peer := newFakePeer()
	peer.set(resolver.View{Service: "billing", Version: 1, Endpoints: []resolver.Endpoint{ep("00000000-0000-0000-0000-000000000001", "10.0.0.1", 80)}})
	srv := httptest.NewServer(peer)
	defer srv.Close()
	tok := filepath.Join(t.TempDir(), "b.token")
	if err := os.WriteFile(tok, []byte("tok"), 0o600); err != nil {
		t.Fatal(err)
	}
	var owns atomic.Bool
	au := &fakeAudit{}
	fed, err := New(Config{
		Region: "a", Peers: []PeerConfig{{Name: "b", URLs: []string{srv.URL}, TokenFile: tok}},
		StaleAfter: 2 * time.Second, Discover: 50 * time.Millisecond, Tick: 20 * time.Millisecond,
		BaseBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond, Audit: au,
		Owns: func(string) bool { return owns.Load() },
	})
	if err != nil {
		t.Fatal(err)
	}
	f := fed.Followers()[0]
	if err := f.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	defer f.Stop()
	agg := fed.Aggregate
	wait.For(t, 30*time.Second, "billing v1 at a", func() bool { v, _, _ := agg.View("b", "billing"); return v.View.Version == 1 })
	peer.setDown(true)
	wait.For(t, 30*time.Second, "b stale", func() bool { return agg.Regions()[0].Stale })
	peer.set(resolver.View{Service: "billing", Version: 2})
	peer.setDown(false)
	// At least one heal: on a machine loaded enough that a fetch takes
	// longer than StaleAfter, the peer goes stale and heals again, and
	// each heal is a row of its own.
	wait.For(t, 30*time.Second, "the heal", func() bool { return agg.Regions()[0].Reconciliations >= 1 })
	if v, _, _ := agg.View("b", "billing"); v.View.Version != 2 {
		t.Fatalf("billing after the heal: %+v", v)
	}
	time.Sleep(100 * time.Millisecond) // a few ticks: nothing may be written meanwhile
	if rows := au.entries(); len(rows) != 0 {
		t.Fatalf("a row written without owning the peer's key: %+v", rows)
	}
	owns.Store(true)
	wait.For(t, 30*time.Second, "a row per heal, once owned", func() bool {
		n := len(au.entries())
		return n >= 1 && uint64(n) == agg.Regions()[0].Reconciliations
	})
}

// TestRestartWithACurrentCopyWritesNoRow: a follower started on a cache
// folder serves the copy on disk until the peer answers; when the peer's
// views are the copy's, that is a restart, not a partition, and no
// region.reconcile row is written. When the peer changed meanwhile, the
// heal is audited as ever.
func TestRestartWithACurrentCopyWritesNoRow(t *testing.T) {
	peer := newFakePeer()
	peer.set(resolver.View{Service: "billing", Version: 3, Endpoints: []resolver.Endpoint{ep("00000000-0000-0000-0000-000000000001", "10.0.0.1", 80)}})
	srv := httptest.NewServer(peer)
	defer srv.Close()
	tok := filepath.Join(t.TempDir(), "b.token")
	if err := os.WriteFile(tok, []byte("tok"), 0o600); err != nil {
		t.Fatal(err)
	}
	cache := t.TempDir()
	run := func(au *fakeAudit, want uint64) *Aggregate {
		t.Helper()
		fed, err := New(Config{
			Region: "a", Peers: []PeerConfig{{Name: "b", URLs: []string{srv.URL}, TokenFile: tok}}, CacheDir: cache,
			StaleAfter: 2 * time.Second, Discover: 50 * time.Millisecond, Tick: 20 * time.Millisecond,
			BaseBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond, Audit: au,
		})
		if err != nil {
			t.Fatal(err)
		}
		f := fed.Followers()[0]
		if err := f.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		defer f.Stop()
		wait.For(t, 30*time.Second, fmt.Sprintf("billing v%d at a, synced", want), func() bool {
			v, _, _ := fed.Aggregate.View("b", "billing")
			st := fed.Aggregate.Regions()[0]
			return v.View.Version == want && st.Synced && !st.Partitioned
		})
		return fed.Aggregate
	}
	first := &fakeAudit{}
	run(first, 3)
	// Wait for the copy on disk, then start again: nothing changed.
	wait.For(t, 10*time.Second, "billing's copy on disk", func() bool {
		v, err := resolver.LoadView(filepath.Join(cache, "b"), "billing")
		return err == nil && v.Version == 3
	})
	again := &fakeAudit{}
	if agg := run(again, 3); agg.Regions()[0].Reconciliations != 0 {
		t.Fatalf("a restart with a current copy counted a reconciliation: %+v", agg.Regions()[0])
	}
	if rows := again.entries(); len(rows) != 0 {
		t.Fatalf("a restart with a current copy wrote %+v", rows)
	}
	// The peer changed while this region was down: the heal is audited.
	peer.set(resolver.View{Service: "billing", Version: 4, Endpoints: []resolver.Endpoint{ep("00000000-0000-0000-0000-000000000002", "10.0.0.2", 80)}})
	changed := &fakeAudit{}
	run(changed, 4)
	wait.For(t, 10*time.Second, "the heal's row", func() bool { return len(changed.entries()) == 1 })
}
