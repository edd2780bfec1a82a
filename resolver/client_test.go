package resolver_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/musterhq/muster/resolver"
)

// fakeClock is an injectable clock tests advance by hand.
type fakeClock struct{ ns atomic.Int64 }

func newFakeClock(t time.Time) *fakeClock    { c := &fakeClock{}; c.ns.Store(t.UnixNano()); return c }
func (c *fakeClock) Now() time.Time          { return time.Unix(0, c.ns.Load()).UTC() }
func (c *fakeClock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

// sleeps records the backoff durations the client asks for and returns at
// once.
type sleeps struct {
	mu sync.Mutex
	d  []time.Duration
}

func (s *sleeps) sleep(ctx context.Context, d time.Duration) error {
	s.mu.Lock()
	s.d = append(s.d, d)
	s.mu.Unlock()
	return ctx.Err()
}

func (s *sleeps) get() []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Duration(nil), s.d...)
}

// watchReq is one request the fake server saw.
type watchReq struct {
	since, auth string
	services    []string
	at          time.Time
}

// fakeMuster speaks /v1/watch's SSE format; handle scripts attempt n.
type fakeMuster struct {
	*httptest.Server
	mu     sync.Mutex
	reqs   []watchReq
	handle func(n int, w http.ResponseWriter, r *http.Request)
}

func newFakeMuster(t *testing.T, handle func(n int, w http.ResponseWriter, r *http.Request)) *fakeMuster {
	f := &fakeMuster{handle: handle}
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/watch" {
			http.NotFound(w, r)
			return
		}
		f.mu.Lock()
		n := len(f.reqs)
		f.reqs = append(f.reqs, watchReq{since: r.URL.Query().Get("since"), auth: r.Header.Get("Authorization"), services: r.URL.Query()["service"], at: time.Now()})
		f.mu.Unlock()
		f.handle(n, w, r)
	}))
	t.Cleanup(f.Close)
	return f
}

func (f *fakeMuster) requests() []watchReq {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]watchReq(nil), f.reqs...)
}

func startSSE(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	w.(http.Flusher).Flush()
}

func send(w http.ResponseWriter, kind string, version uint64, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	fmt.Fprintf(w, "event: %s\nid: %d\ndata: %s\n\n", kind, version, b)
	w.(http.Flusher).Flush()
}

// hang keeps a stream open and silent until the client goes away.
func hang(r *http.Request) { <-r.Context().Done() }

// deadURL is a loopback address nothing listens on.
func deadURL(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return "http://" + addr
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		<-tick.C
	}
}

func newClient(t *testing.T, cfg resolver.Config, sl *sleeps) *resolver.Client {
	t.Helper()
	if cfg.Services == nil {
		cfg.Services = []string{"api", "db"}
	}
	if sl != nil {
		resolver.SetSleep(&cfg, sl.sleep)
	}
	c, err := resolver.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func version(c *resolver.Client, service string) uint64 {
	r, err := c.Resolve(service)
	if err != nil {
		return 0
	}
	return r.Snapshot.Version()
}

func TestClientStreamLossChangesNothingButAge(t *testing.T) {
	t.Parallel()
	v := view("api", 10, 4)
	srv := newFakeMuster(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if n == 0 {
			startSSE(w)
			send(w, "view", 10, v)
			fmt.Fprint(w, "event: drain\ndata: {}\n\n") // then the stream ends
			return
		}
		http.Error(w, "down", http.StatusBadGateway)
	})
	clk := newFakeClock(t0.Add(time.Second))
	sl := &sleeps{}
	c := newClient(t, resolver.Config{URLs: []string{srv.URL}, Services: []string{"api"}, Clock: clk.Now, Rand: func() float64 { return 0.5 }}, sl)

	eventually(t, "view 10", func() bool { return version(c, "api") == 10 })
	before, _ := c.Resolve("api")
	eventually(t, "several failed resubscriptions", func() bool { return c.Stats().Reconnects >= 3 })
	st := c.Stats()
	if st.Connected || st.LastError == nil {
		t.Fatalf("stats after loss: %+v", st)
	}
	clk.Advance(61 * time.Minute)
	after, err := c.Resolve("api")
	if err != nil {
		t.Fatal(err)
	}
	if after.Snapshot != before.Snapshot || after.Snapshot.Version() != 10 || after.Snapshot.Routable() != 4 {
		t.Fatalf("routing changed after stream loss: v%d routable %d", after.Snapshot.Version(), after.Snapshot.Routable())
	}
	if got := after.Age() - before.Age(); got != 61*time.Minute {
		t.Fatalf("age grew by %v, want 61m", got)
	}
	if _, err := c.Pick("api"); err != nil {
		t.Fatal(err)
	}
}

func TestClientResumesWithSinceAndAppliesDeltas(t *testing.T) {
	t.Parallel()
	api10, db12 := view("api", 10, 4), view("db", 12, 2)
	api11 := view("api", 11, 5)
	srv := newFakeMuster(t, func(n int, w http.ResponseWriter, r *http.Request) {
		startSSE(w)
		switch n {
		case 0:
			send(w, "view", 10, api10)
			send(w, "view", 12, db12)
			// Then silence: no heartbeat, so the client must call it dead.
		case 1:
			send(w, "delta", 11, deltaTo(api10, api11))
			fmt.Fprint(w, "event: heartbeat\ndata: {}\n\n")
		}
		hang(r)
	})
	sl := &sleeps{}
	// The first URL is dead: the client rotates to the live one.
	c := newClient(t, resolver.Config{
		URLs: []string{deadURL(t), srv.URL}, HeartbeatTimeout: 300 * time.Millisecond,
		Token: func(context.Context) (string, error) { return "tok", nil },
	}, sl)

	eventually(t, "delta to 11", func() bool { return version(c, "api") == 11 })
	reqs := srv.requests()
	if len(reqs) < 2 || reqs[0].since != "" || reqs[1].since != "10" {
		t.Fatalf("requests %+v: want a full subscription, then since=10 (lowest held)", reqs)
	}
	if reqs[0].auth != "Bearer tok" || strings.Join(reqs[0].services, ",") != "api,db" {
		t.Fatalf("request %+v", reqs[0])
	}
	if version(c, "db") != 12 {
		t.Fatal("db lost its view")
	}
	// The silent stream was declared dead after HeartbeatTimeout, not before.
	if gap := reqs[1].at.Sub(reqs[0].at); gap < 300*time.Millisecond {
		t.Fatalf("resubscribed after %v, before the heartbeat timeout", gap)
	}
	if st := c.Stats(); st.Reconnects < 3 {
		t.Fatalf("reconnects %d, want >= 3 (dead URL, dead stream, dead URL)", st.Reconnects)
	}
	eventually(t, "connected", func() bool { return c.Stats().Connected })
}

func TestClientGapTriggersFullView(t *testing.T) {
	t.Parallel()
	api10 := view("api", 10, 4)
	api12, api13 := view("api", 12, 4), view("api", 13, 3)
	srv := newFakeMuster(t, func(n int, w http.ResponseWriter, r *http.Request) {
		startSSE(w)
		switch n {
		case 0:
			send(w, "view", 10, api10)
			return
		case 1:
			send(w, "delta", 13, deltaTo(api12, api13)) // 12->13 does not follow 10
		case 2:
			send(w, "view", 13, api13)
		}
		hang(r)
	})
	c := newClient(t, resolver.Config{URLs: []string{srv.URL}, Services: []string{"api"}}, &sleeps{})
	eventually(t, "full view 13", func() bool { return version(c, "api") == 13 })
	reqs := srv.requests()
	if len(reqs) != 3 || reqs[1].since != "10" || reqs[2].since != "" {
		t.Fatalf("requests %+v: want since=10, then a full view after the gap", reqs)
	}
	if st := c.Stats(); st.Cache.Gaps != 1 || !errors.Is(st.LastError, resolver.ErrGap) {
		t.Fatalf("stats %+v", st)
	}
}

func TestClientHonoursRetryAfterAndBacksOff(t *testing.T) {
	t.Parallel()
	srv := newFakeMuster(t, func(n int, w http.ResponseWriter, r *http.Request) {
		switch {
		case n < 3:
			w.Header().Set("Retry-After", "7")
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprint(w, `{"title":"admission"}`)
		case n < 7:
			http.Error(w, "broken", http.StatusInternalServerError)
		default:
			startSSE(w)
			send(w, "view", 10, view("api", 10, 2))
			hang(r)
		}
	})
	sl := &sleeps{}
	c := newClient(t, resolver.Config{URLs: []string{srv.URL}, Services: []string{"api"}, Rand: func() float64 { return 0.5 },
		BaseBackoff: time.Second, MaxBackoff: 20 * time.Second}, sl)
	eventually(t, "view after refusals", func() bool { return version(c, "api") == 10 })
	want := []time.Duration{7 * time.Second, 7 * time.Second, 7 * time.Second, // Retry-After beats the jitter
		4 * time.Second, 8 * time.Second, 10 * time.Second, 10 * time.Second} // 0.5*min(20s, 1s*2^n)
	if got := sl.get(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("sleeps %v, want %v", got, want)
	}
	if n := len(srv.requests()); n != 8 {
		t.Fatalf("%d attempts, want 8", n)
	}
	if st := c.Stats(); st.Reconnects != 7 {
		t.Fatalf("reconnects %d", st.Reconnects)
	}
}

func TestClientSecondProcessRoutesFromFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	srv := newFakeMuster(t, func(n int, w http.ResponseWriter, r *http.Request) {
		startSSE(w)
		send(w, "view", 10, view("api", 10, 4))
		hang(r)
	})
	first := newClient(t, resolver.Config{URLs: []string{srv.URL}, Services: []string{"api"}, CacheDir: dir}, &sleeps{})
	eventually(t, "view 10", func() bool { return version(first, "api") == 10 })
	first.Close()

	second := newClient(t, resolver.Config{URLs: []string{deadURL(t)}, Services: []string{"api"}, CacheDir: dir}, &sleeps{})
	if v := version(second, "api"); v != 10 {
		t.Fatalf("second client holds v%d, want 10 from the file", v)
	}
	if _, err := second.Pick("api"); err != nil {
		t.Fatal(err)
	}
	e, err := second.ResolveOrDefault(context.Background(), "api")
	if err != nil || e.Port != 8080 {
		t.Fatalf("ResolveOrDefault = %+v, %v", e, err)
	}
	eventually(t, "a failed subscription", func() bool { return second.Stats().LastError != nil })
}

func TestResolveOrDefault(t *testing.T) {
	t.Parallel()
	def := resolver.Endpoint{InstanceID: "default", Address: "10.9.9.9", Port: 443}
	defaultFn := func(service string) (resolver.Endpoint, error) { return def, nil }

	t.Run("server down, nothing cached: default within the deadline", func(t *testing.T) {
		t.Parallel()
		c := newClient(t, resolver.Config{URLs: []string{deadURL(t)}, Services: []string{"api"}, Default: defaultFn}, &sleeps{})
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		start := time.Now()
		e, err := c.ResolveOrDefault(ctx, "api")
		if err != nil || e.InstanceID != def.InstanceID {
			t.Fatalf("got %+v, %v", e, err)
		}
		if el := time.Since(start); el > 2*time.Second {
			t.Fatalf("took %v", el)
		}
	})
	t.Run("no default", func(t *testing.T) {
		t.Parallel()
		c := newClient(t, resolver.Config{URLs: []string{deadURL(t)}, Services: []string{"api"}}, &sleeps{})
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		if _, err := c.ResolveOrDefault(ctx, "api"); !errors.Is(err, resolver.ErrNoView) {
			t.Fatalf("err %v, want ErrNoView", err)
		}
	})
	// A service whose views have had nothing routable since the client
	// started (its instances await readiness) is cold: the default.
	t.Run("only empty views so far: default within the deadline", func(t *testing.T) {
		t.Parallel()
		srv := newFakeMuster(t, func(n int, w http.ResponseWriter, r *http.Request) {
			startSSE(w)
			send(w, "view", 10, withRegistered(viewOf("api", 10, nil), map[string]int{"a": 3}))
			hang(r)
		})
		c := newClient(t, resolver.Config{URLs: []string{srv.URL}, Services: []string{"api"}, Default: defaultFn}, &sleeps{})
		eventually(t, "the empty view", func() bool { return version(c, "api") == 10 })
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		if e, err := c.ResolveOrDefault(ctx, "api"); err != nil || e.InstanceID != def.InstanceID {
			t.Fatalf("got %+v, %v; want the default", e, err)
		}
	})
	t.Run("only empty views so far, no default", func(t *testing.T) {
		t.Parallel()
		srv := newFakeMuster(t, func(n int, w http.ResponseWriter, r *http.Request) {
			startSSE(w)
			send(w, "view", 10, viewOf("api", 10, nil))
			hang(r)
		})
		c := newClient(t, resolver.Config{URLs: []string{srv.URL}, Services: []string{"api"}}, &sleeps{})
		eventually(t, "the empty view", func() bool { return version(c, "api") == 10 })
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		if _, err := c.ResolveOrDefault(ctx, "api"); !errors.Is(err, resolver.ErrNoEndpoints) {
			t.Fatalf("err %v, want ErrNoEndpoints", err)
		}
	})
	t.Run("empty, then routable while waiting", func(t *testing.T) {
		t.Parallel()
		release := make(chan struct{})
		srv := newFakeMuster(t, func(n int, w http.ResponseWriter, r *http.Request) {
			startSSE(w)
			send(w, "view", 10, viewOf("api", 10, nil))
			select {
			case <-release:
			case <-r.Context().Done():
				return
			}
			send(w, "view", 11, view("api", 11, 1))
			hang(r)
		})
		c := newClient(t, resolver.Config{URLs: []string{srv.URL}, Services: []string{"api"}, Default: defaultFn}, &sleeps{})
		eventually(t, "the empty view", func() bool { return version(c, "api") == 10 })
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		got := make(chan resolver.Endpoint, 1)
		go func() {
			e, _ := c.ResolveOrDefault(ctx, "api")
			got <- e
		}()
		close(release)
		if e := <-got; e.InstanceID != id(0) {
			t.Fatalf("got %+v, want the streamed endpoint", e)
		}
	})
	// A service that had endpoints and was decommissioned is an answer:
	// nothing to route to, not a reason for the default.
	t.Run("decommissioned after routing: ErrNoEndpoints at once", func(t *testing.T) {
		t.Parallel()
		srv := newFakeMuster(t, func(n int, w http.ResponseWriter, r *http.Request) {
			startSSE(w)
			send(w, "view", 10, view("api", 10, 2))
			send(w, "view", 11, viewOf("api", 11, nil)) // every zone gone
			hang(r)
		})
		c := newClient(t, resolver.Config{URLs: []string{srv.URL}, Services: []string{"api"}, Default: defaultFn}, &sleeps{})
		eventually(t, "the decommission", func() bool { return version(c, "api") == 11 })
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if e, err := c.ResolveOrDefault(ctx, "api"); !errors.Is(err, resolver.ErrNoEndpoints) || ctx.Err() != nil {
			t.Fatalf("got %+v, %v (ctx %v); want ErrNoEndpoints before the deadline", e, err, ctx.Err())
		}
	})
	t.Run("waits for the first view", func(t *testing.T) {
		t.Parallel()
		release := make(chan struct{})
		srv := newFakeMuster(t, func(n int, w http.ResponseWriter, r *http.Request) {
			startSSE(w)
			<-release
			send(w, "view", 10, view("api", 10, 1))
			hang(r)
		})
		c := newClient(t, resolver.Config{URLs: []string{srv.URL}, Services: []string{"api"}, Default: defaultFn}, &sleeps{})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		got := make(chan resolver.Endpoint, 1)
		go func() {
			e, _ := c.ResolveOrDefault(ctx, "api")
			got <- e
		}()
		close(release)
		if e := <-got; e.InstanceID != id(0) {
			t.Fatalf("got %+v, want the streamed endpoint", e)
		}
	})
}

// TestClientSyncedIsNotAView: a server that says synced before sending a
// view (as muster did while rebuilding) does not make the client Synced;
// the view that follows does.
func TestClientSyncedIsNotAView(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	srv := newFakeMuster(t, func(n int, w http.ResponseWriter, r *http.Request) {
		startSSE(w)
		fmt.Fprint(w, "event: synced\ndata: {}\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-release:
			send(w, "view", 10, view("api", 10, 2))
		case <-r.Context().Done():
			return
		}
		hang(r)
	})
	c := newClient(t, resolver.Config{URLs: []string{srv.URL}, Services: []string{"api"}}, &sleeps{})
	eventually(t, "the synced event", func() bool { return c.Stats().Syncs == 1 })
	if st := c.Stats(); st.Synced {
		t.Fatalf("Synced with no view held: %+v", st)
	}
	if _, err := c.Resolve("api"); !errors.Is(err, resolver.ErrNoView) {
		t.Fatalf("resolve after a bare synced: %v, want ErrNoView", err)
	}
	close(release)
	eventually(t, "synced once the view arrived", func() bool { return c.Stats().Synced && version(c, "api") == 10 })
}

// TestClientFollowsHoldWhenServerIsQuiet: muster sends a 10-endpoint view,
// then a 4-endpoint one it does not explain, then only heartbeats. The
// client holds the 10 and, once its clock passes ConfirmAfter, its own
// sweep switches routing to the 4 and wakes Updated, with nothing new on
// the stream.
func TestClientFollowsHoldWhenServerIsQuiet(t *testing.T) {
	t.Parallel()
	ten := view("api", 10, 10)
	srv := newFakeMuster(t, func(n int, w http.ResponseWriter, r *http.Request) {
		startSSE(w)
		send(w, "view", 10, ten)
		send(w, "view", 11, viewOf("api", 11, ten.Endpoints[:4]))
		fmt.Fprint(w, "event: heartbeat\ndata: {}\n\n")
		w.(http.Flusher).Flush()
		hang(r)
	})
	clk := newFakeClock(t0)
	dir := t.TempDir()
	c := newClient(t, resolver.Config{URLs: []string{srv.URL}, Services: []string{"api"}, Clock: clk.Now, CacheDir: dir, ConfirmAfter: 5 * time.Second}, &sleeps{})
	// The heartbeat is read after v11 was applied and Updated woken for
	// it, so the channel taken below can only be closed by the sweep.
	eventually(t, "the heartbeat after v11", func() bool { return c.Stats().Frames == 3 })
	r, _ := c.Resolve("api")
	if r.Version() != 10 || r.Hold == nil || r.Hold.NewestVersion != 11 || !r.Hold.FollowAt.Equal(t0.Add(5*time.Second)) || c.Stats().Cache.Holding != 1 {
		t.Fatalf("routing v%d, hold %+v", r.Version(), r.Hold)
	}
	updated := c.Updated()
	clk.Advance(5 * time.Second)
	select {
	case <-updated:
	case <-time.After(10 * time.Second): // a deadline, not a wait: the sweep runs every second
		t.Fatal("Updated not woken by the followed hold within 10 s")
	}
	if r, _ := c.Resolve("api"); r.Version() != 11 || r.Hold != nil || r.Routable() != 4 {
		t.Fatalf("after the confirm time: routing v%d with %d, hold %+v", r.Version(), r.Routable(), r.Hold)
	}
	if v, err := resolver.LoadView(dir, "api"); err != nil || v.Version != 11 {
		t.Fatalf("file: v%d, %v; want v11", v.Version, err)
	}
	if st := c.Stats(); st.Cache.HoldsFollowed != 1 || st.Cache.Holding != 0 {
		t.Fatalf("stats %+v", st.Cache)
	}
}

// A server shutting down names the window its subscribers should spread
// their reconnections over (a drain's reconnect_within_ms): the client
// waits a random point in it (full jitter), capped at MaxBackoff, and
// moves to the next URL; a drain without a window costs only the backoff.
func TestClientSpreadsItsReconnectionOverADrainsWindow(t *testing.T) {
	t.Parallel()
	v := view("api", 10, 4)
	drains := []string{`{"reason":"server shutting down; reconnect with jitter","reconnect_within_ms":4000}`, `{}`, `{"reconnect_within_ms":3600000000}`}
	srv := newFakeMuster(t, func(n int, w http.ResponseWriter, r *http.Request) {
		startSSE(w)
		send(w, "view", 10, v)
		if n < len(drains) {
			fmt.Fprintf(w, "event: drain\ndata: %s\n\n", drains[n])
			return
		}
		hang(r)
	})
	sl := &sleeps{}
	c := newClient(t, resolver.Config{URLs: []string{srv.URL}, Services: []string{"api"}, Rand: func() float64 { return 0.5 },
		BaseBackoff: 100 * time.Millisecond, MaxBackoff: 10 * time.Second}, sl)
	eventually(t, "three drains followed", func() bool { return len(sl.get()) >= 3 })
	got := sl.get()[:3]
	want := []time.Duration{2 * time.Second, 50 * time.Millisecond, 5 * time.Second}
	if !slices.Equal(got, want) {
		t.Fatalf("waits after drains %v, want %v (half of 4 s; half the base backoff; half of MaxBackoff)", got, want)
	}
	if version(c, "api") != 10 {
		t.Fatal("the view was lost across drains")
	}
}
