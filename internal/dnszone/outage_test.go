package dnszone_test

import (
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/musterhq/muster/db/dbtest"
	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/dnszone"
	"github.com/musterhq/muster/internal/stream"
	"github.com/musterhq/muster/internal/wait"
	"github.com/musterhq/muster/resolver"
)

// TestServesWhilePostgreSQLIsDown: with muster's PostgreSQL stopped, the
// zone answers as before over UDP and TCP, and still follows what the hub
// publishes (its views come from memory, never from the database).
func TestServesWhilePostgreSQLIsDown(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("stops a PostgreSQL cluster of its own")
	}
	pc := dbtest.NewCluster(t)
	cfg := dnszone.Config{Zone: zoneName, Services: []string{dnszone.AllServices}, Interval: 20 * time.Millisecond}
	s := apptest.New(t, apptest.Options{DatabaseURL: pc.URL(), DNS: &cfg})
	s.Seed(t)
	e := &env{s: s, addr: s.DNS.Addr().String()}
	e.register(t, "az1", "10.0.1.1", "10.0.1.2")
	e.publish(t)
	answer := func(netw string) []string {
		var out []string
		for _, rr := range e.exchange(t, "api."+zoneName, dns.TypeA, netw, 0).Answer {
			out = append(out, rr.(*dns.A).A.String())
		}
		slices.Sort(out)
		return out
	}
	wait.For(t, 2*time.Second, "api in the zone", func() bool { return len(answer("udp")) == 2 })

	pc.Stop(t)
	t.Cleanup(func() { pc.Start(t) }) // so the stack shuts down as usual
	wait.For(t, 10*time.Second, "muster to see PostgreSQL down", func() bool { return !s.Monitor.Up() })
	for _, netw := range []string{"udp", "tcp"} {
		if got := answer(netw); !slices.Equal(got, []string{"10.0.1.1", "10.0.1.2"}) {
			t.Fatalf("with PostgreSQL down, over %s: %v", netw, got)
		}
	}
	// A publication (as the evaluator and publisher make from memory
	// while the database is away) reaches the zone.
	v, ok := s.Hub.View("api")
	if !ok {
		t.Fatal("no view of api in the hub")
	}
	var view resolver.View
	if err := json.Unmarshal(v.JSON, &view); err != nil {
		t.Fatal(err)
	}
	view.Version++
	view.Endpoints = view.Endpoints[:1]
	view.Checksum = resolver.Checksum(view.Endpoints)
	b, _ := json.Marshal(view)
	s.Hub.Publish([]stream.Update{{View: &stream.Frame{Kind: stream.KindView, Service: "api", Version: view.Version, JSON: b}}})
	wait.For(t, time.Second, "the zone following the hub with PostgreSQL down", func() bool { return len(answer("udp")) == 1 })
}
