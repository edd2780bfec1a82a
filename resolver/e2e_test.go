package resolver_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/musterhq/muster/db/dbtest"
	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/registry"
	"github.com/musterhq/muster/internal/stream"
	"github.com/musterhq/muster/resolver"
)

// TestMain stops the PostgreSQL cluster the end-to-end test starts.
func TestMain(m *testing.M) { dbtest.Main(m) }

func viewFrame(t *testing.T, v resolver.View) *stream.Frame {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return &stream.Frame{Kind: stream.KindView, Service: v.Service, Version: v.Version, JSON: b}
}

func deltaFrame(t *testing.T, d resolver.Delta) *stream.Frame {
	b, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	return &stream.Frame{Kind: stream.KindDelta, Service: d.Service, Version: d.Version, FromVersion: d.FromVersion, JSON: b}
}

// TestClientAgainstMuster runs the client against the real HTTP surface:
// full view, live delta, then the server drains and refuses (503 +
// Retry-After) while routing carries on from the held view.
func TestClientAgainstMuster(t *testing.T) {
	t.Parallel()
	s := apptest.New(t, apptest.Options{})
	s.Seed(t)
	web10, web11 := view("web", 10, 4), view("web", 11, 5)
	s.Hub.Publish([]stream.Update{{View: viewFrame(t, web10)}})
	token := s.Token(t, apptest.Viewer)
	sl, dir := &sleeps{}, t.TempDir()
	c := newClient(t, resolver.Config{
		URLs: []string{s.URL}, Services: []string{"web"}, HTTPClient: s.Client, CacheDir: dir,
		Token: func(context.Context) (string, error) { return token, nil },
	}, sl)

	eventually(t, "view 10 from muster", func() bool { return version(c, "web") == 10 })
	eventually(t, "connected and synced", func() bool { st := c.Stats(); return st.Connected && st.Synced && st.Syncs == 1 })
	s.Hub.Publish([]stream.Update{{View: viewFrame(t, web11), Delta: deltaFrame(t, deltaTo(web10, web11))}})
	eventually(t, "delta to 11", func() bool { return version(c, "web") == 11 })
	if st := c.Stats(); st.Cache.Applied != 2 || st.Reconnects != 0 {
		t.Fatalf("stats %+v", st)
	}

	s.Hub.Close() // drain: the client resubscribes and is refused with Retry-After: 1
	eventually(t, "a refused resubscription", func() bool {
		for _, d := range sl.get() {
			if d >= time.Second {
				return true
			}
		}
		return false
	})
	if version(c, "web") != 11 {
		t.Fatal("routing changed after the server drained")
	}
	if v, err := resolver.LoadView(dir, "web"); err != nil || v.Version != 11 {
		t.Fatalf("last-known-good file: v%d, %v", v.Version, err)
	}
}

// TestOutcomesReportedToMuster: outcomes given to Record reach muster's
// evaluator as passive evidence through POST /v1/reports; with muster
// away they are dropped and counted, and Record never waits.
func TestOutcomesReportedToMuster(t *testing.T) {
	t.Parallel()
	s := apptest.New(t, apptest.Options{})
	s.Seed(t)
	r := s.JSON(t, "POST", "/v1/services/web/instances", s.Token(t, apptest.Web), `{"address":"127.0.0.1","port":9000,"zone":"az1"}`)
	if r.Status != http.StatusCreated {
		t.Fatalf("register: %d %s", r.Status, r.Body)
	}
	inst := apptest.Decode[registry.Instance](t, r).ID.String()
	if r := s.JSON(t, "PUT", "/v1/services/web/grants", s.Token(t, apptest.Admin), `{"callers":["api"]}`); r.Status != http.StatusOK {
		t.Fatalf("grant api -> web: %d %s", r.Status, r.Body)
	}
	if err := s.Evaluator.SyncNow(context.Background()); err != nil {
		t.Fatal(err)
	}
	e := ep(0, "az1", 1)
	e.InstanceID = inst
	ghost := ep(1, "az1", 1) // muster does not know it
	s.Hub.Publish([]stream.Update{{View: viewFrame(t, viewOf("web", 1, []resolver.Endpoint{e, ghost}))}})
	token := s.Token(t, apptest.API)
	c := newClient(t, resolver.Config{
		URLs: []string{s.URL}, Services: []string{"web"}, HTTPClient: s.Client, ReportInterval: -1,
		Token: func(context.Context) (string, error) { return token, nil },
	}, &sleeps{})
	eventually(t, "view 1", func() bool { return version(c, "web") == 1 })

	for i := range 10 {
		c.Record("web", inst, i%5 != 0) // 8 successes, 2 failures
	}
	c.Record("web", ghost.InstanceID, true)
	if err := c.FlushReports(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st := c.Stats(); st.OutcomesReported != 11 || st.ReportBatchesSent != 1 || st.ReportItemsRefused != 1 || st.OutcomesDropped != 0 {
		t.Fatalf("stats after flush: %+v", st)
	}
	el, err := s.Evaluator.ServiceEligibility("web")
	if err != nil {
		t.Fatal(err)
	}
	if len(el.Instances) != 1 || !el.Instances[0].Evidence["passive"].Present {
		t.Fatalf("muster has no passive evidence for %s: %+v", inst, el.Instances)
	}
	if err := c.FlushReports(context.Background()); err != nil || c.Stats().ReportBatchesSent != 1 {
		t.Fatalf("an empty flush sent something: %v %+v", err, c.Stats())
	}

	// Muster away: a client whose server refuses connections.
	dead := newClient(t, resolver.Config{URLs: []string{"http://127.0.0.1:1"}, Services: []string{"web"}, ReportInterval: -1}, &sleeps{})
	if err := dead.Cache().ApplyView(viewOf("web", 1, []resolver.Endpoint{e})); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		dead.Record("web", inst, false)
	}
	if err := dead.FlushReports(context.Background()); err == nil {
		t.Fatal("flush to a dead server succeeded")
	}
	if st := dead.Stats(); st.OutcomesDropped != 3 || st.ReportBatchesFailed != 1 || st.OutcomesReported != 0 {
		t.Fatalf("dead-server stats %+v", st)
	}
}

// TestClientNotSyncedUntilMusterHasAView: a client with a last-known-good
// file resubscribes to a muster that holds no view of its service yet (it
// is rebuilding after a restart). It keeps routing on its file, hears
// heartbeats, and is not Synced; muster's first view (published with a
// delta from a version the client never held) reaches it as a full view,
// and only then is it Synced.
func TestClientNotSyncedUntilMusterHasAView(t *testing.T) {
	t.Parallel()
	s := apptest.New(t, apptest.Options{WatchHeartbeat: 20 * time.Millisecond})
	s.Seed(t)
	dir := t.TempDir()
	cache, err := resolver.NewCache([]string{"web"}, resolver.WithDir(dir))
	if err != nil {
		t.Fatal(err)
	}
	if err := cache.ApplyView(view("web", 5, 3)); err != nil {
		t.Fatal(err)
	}
	token := s.Token(t, apptest.Viewer)
	c := newClient(t, resolver.Config{
		URLs: []string{s.URL}, Services: []string{"web"}, HTTPClient: s.Client, CacheDir: dir,
		Token: func(context.Context) (string, error) { return token, nil },
	}, &sleeps{})

	eventually(t, "connected, hearing heartbeats", func() bool { st := c.Stats(); return st.Connected && st.Frames >= 3 })
	if st := c.Stats(); st.Synced || st.Syncs != 0 || version(c, "web") != 5 {
		t.Fatalf("before muster has a view: synced %v (%d events), holding v%d; want unsynced on v5", st.Synced, st.Syncs, version(c, "web"))
	}
	web1001 := view("web", 1001, 4)
	s.Hub.Publish([]stream.Update{{View: viewFrame(t, web1001), Delta: deltaFrame(t, deltaTo(view("web", 900, 2), web1001))}})
	eventually(t, "view 1001, then synced", func() bool { st := c.Stats(); return version(c, "web") == 1001 && st.Synced && st.Syncs == 1 })
	if st := c.Stats(); st.Cache.Gaps != 0 || st.Reconnects != 0 {
		t.Fatalf("the first view came as something the client could not apply: %+v", st)
	}
}

// TestScaleDownFollowedAcrossTheRealStack: the server's registered counts
// and the client's shrink guard meet over the real stack (issue 12). api
// (no readiness signal: its instances are capacity on registration) runs
// 10 instances; 6 deregister themselves and the client follows the
// 10 -> 4 scale-down at once, without a hold; then the last 4 go and the
// decommission empties the client's set.
func TestScaleDownFollowedAcrossTheRealStack(t *testing.T) {
	t.Parallel()
	s := apptest.New(t, apptest.Options{})
	s.Seed(t)
	apiTok := s.Token(t, apptest.API)
	var ids []string
	for i := range 10 {
		// A workload registers from the address it registers (loopback here).
		r := s.JSON(t, "POST", "/v1/services/api/instances", apiTok, `{"address":"127.0.0.1","port":`+itoa(9000+i)+`,"zone":"az1"}`)
		if r.Status != http.StatusCreated {
			t.Fatalf("register: %d %s", r.Status, r.Body)
		}
		ids = append(ids, apptest.Decode[registry.Instance](t, r).ID.String())
	}
	publish := func() {
		t.Helper()
		if err := s.Evaluator.SyncNow(t.Context()); err != nil {
			t.Fatal(err)
		}
		s.Evaluator.EvaluateNow()
		s.Publisher.RunOnce()
		s.Clock.Advance(time.Minute) // past every batching window
		s.Publisher.RunOnce()
	}
	publish()
	c := newClient(t, resolver.Config{
		URLs: []string{s.URL}, Services: []string{"api"}, HTTPClient: s.Client,
		Token: func(context.Context) (string, error) { return apiTok, nil },
	}, &sleeps{})
	routable := func() int {
		r, err := c.Resolve("api")
		if err != nil {
			return -1
		}
		return r.Routable()
	}
	eventually(t, "10 routable endpoints of api", func() bool { return routable() == 10 })

	for _, id := range ids[:6] {
		if r := s.DoWith(t, "DELETE", "/v1/instances/"+id, apiTok, "", "", s.AsInstance(id)); r.Status != http.StatusNoContent {
			t.Fatalf("deregister %s: %d %s", id, r.Status, r.Body)
		}
	}
	publish()
	eventually(t, "the scale-down to 4", func() bool { return routable() == 4 })
	r, _ := c.Resolve("api")
	if r.Hold != nil || r.Guarded() {
		t.Fatalf("a registry scale-down was held: %+v", r.Hold)
	}
	if st := c.Stats().Cache; st.RegistryShrinks != 1 || st.ShrinkCapped != 0 {
		t.Fatalf("cache stats %+v, want one registry-explained shrink and no cap", st)
	}

	for _, id := range ids[6:] {
		if r := s.DoWith(t, "DELETE", "/v1/instances/"+id, apiTok, "", "", s.AsInstance(id)); r.Status != http.StatusNoContent {
			t.Fatalf("deregister %s: %d %s", id, r.Status, r.Body)
		}
	}
	publish()
	eventually(t, "the decommission", func() bool { return routable() == 0 })
	if _, err := c.Pick("api"); !errors.Is(err, resolver.ErrNoEndpoints) {
		t.Fatalf("Pick after the decommission: %v, want ErrNoEndpoints", err)
	}
	if r, _ := c.Resolve("api"); r.Hold != nil {
		t.Fatalf("the decommission was held: %+v", r.Hold)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }
