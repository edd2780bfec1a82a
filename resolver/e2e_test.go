package resolver_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/musterhq/muster/db/dbtest"
	"github.com/musterhq/muster/resolver"
	"github.com/musterhq/muster/server/servertest"
	"github.com/musterhq/muster/stream"
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
	s := servertest.New(t, servertest.Options{})
	s.Seed(t)
	web10, web11 := view("web", 10, 4), view("web", 11, 5)
	s.Hub.Publish([]stream.Update{{View: viewFrame(t, web10)}})
	token := s.Token(t, servertest.Viewer)
	sl, dir := &sleeps{}, t.TempDir()
	c := newClient(t, resolver.Config{
		URLs: []string{s.URL}, Services: []string{"web"}, HTTPClient: s.Client, CacheDir: dir,
		Token: func(context.Context) (string, error) { return token, nil },
	}, sl)

	eventually(t, "view 10 from muster", func() bool { return version(c, "web") == 10 })
	eventually(t, "connected", func() bool { return c.Stats().Connected })
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
