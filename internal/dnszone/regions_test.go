package dnszone_test

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/musterhq/muster/internal/dnszone"
	"github.com/musterhq/muster/internal/stream"
	"github.com/musterhq/muster/internal/wait"
	"github.com/musterhq/muster/resolver"
)

// regionalView is service's view (a remote series when region is set),
// one endpoint at addr with weight w, every zone at traffic weight tw.
func regionalView(t *testing.T, service, region string, version uint64, addr string, w, tw float64) *stream.Frame {
	t.Helper()
	name := service
	if region != "" {
		name = stream.RemoteSeries(service, region)
	}
	state := "eligible"
	if w == 0 {
		state = resolver.StateIneligible
	}
	eps := []resolver.Endpoint{{InstanceID: "00000000-0000-0000-0000-00000000000" + string(rune('1'+len(region))), Address: addr, Port: 80,
		Zone: "az1", State: state, Weight: w, Health: resolver.HealthKnown, Region: region}}
	v := resolver.View{Service: name, Version: version, Endpoints: eps, Region: region, Checksum: resolver.Checksum(eps),
		Zones: map[string]resolver.Zone{"az1": {Guard: resolver.GuardOK, Eligible: 1, Total: 1, MinHealthyFraction: 0.5, TrafficWeight: &tw}}}
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return &stream.Frame{Kind: stream.KindView, Service: name, Version: version, JSON: b}
}

// TestRemoteAnswersOnlyWhenLocalCapacityIsGone (issue 29): with fallback
// region b, web's A records are a's own while a has capacity; when a's
// instance is withdrawn, or a is drained (a region shift: traffic weight
// 0), they are b's; when a has capacity again, a's. A service only b has
// is answered when the zone names it (DNS carries no identity: not under
// "*").
func TestRemoteAnswersOnlyWhenLocalCapacityIsGone(t *testing.T) {
	hub := stream.NewHub(stream.Config{})
	s, err := dnszone.New(dnszone.Config{Addr: "127.0.0.1:0", Services: []string{"web", "billing"}, Interval: 10 * time.Millisecond,
		Hub: hub, Regions: []string{"b"}, Ready: func() bool { return true }})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	addr := s.Addr().String()
	answers := func(name string) []string {
		m := new(dns.Msg)
		m.SetQuestion(name+"."+zoneName, dns.TypeA)
		r, _, err := (&dns.Client{Net: "udp", Timeout: 2 * time.Second}).Exchange(m, addr)
		if err != nil || r == nil {
			return nil
		}
		var out []string
		for _, rr := range r.Answer {
			if a, ok := rr.(*dns.A); ok {
				out = append(out, a.A.String())
			}
		}
		slices.Sort(out)
		return out
	}
	expect := func(name, want string) {
		t.Helper()
		wait.For(t, 10*time.Second, name+" answering "+want, func() bool {
			got := answers(name)
			return len(got) == 1 && got[0] == want
		})
	}
	hub.Publish([]stream.Update{{View: regionalView(t, "web", "", 1, "10.1.0.1", 1, 1)}})
	hub.PublishRemote([]*stream.Frame{regionalView(t, "web", "b", 7, "10.2.0.1", 1, 1), regionalView(t, "billing", "b", 3, "10.2.9.9", 1, 1)})
	expect("web", "10.1.0.1")
	expect("billing", "10.2.9.9")
	// a's instance withdrawn: b answers.
	hub.Publish([]stream.Update{{View: regionalView(t, "web", "", 2, "10.1.0.1", 0, 1)}})
	expect("web", "10.2.0.1")
	// a has it back; then a is drained (region shift): b again.
	hub.Publish([]stream.Update{{View: regionalView(t, "web", "", 3, "10.1.0.1", 1, 1)}})
	expect("web", "10.1.0.1")
	hub.Publish([]stream.Update{{View: regionalView(t, "web", "", 4, "10.1.0.1", 1, 0)}})
	expect("web", "10.2.0.1")
	// b drained too (turned off): nobody has capacity, a's own answer.
	hub.PublishRemote([]*stream.Frame{regionalView(t, "web", "b", 8, "10.2.0.1", 1, 0)})
	expect("web", "10.1.0.1")
}
