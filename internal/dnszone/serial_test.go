package dnszone_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/musterhq/muster/internal/dnszone"
	"github.com/musterhq/muster/internal/stream"
	"github.com/musterhq/muster/internal/wait"
	"github.com/musterhq/muster/resolver"
)

// zoneServer is a started dnszone.Server on loopback following its own
// hub, as a replica's zone follows its replica's hub.
type zoneServer struct {
	hub  *stream.Hub
	s    *dnszone.Server
	addr string
}

func startZone(t *testing.T, cfg dnszone.Config) *zoneServer {
	t.Helper()
	z := &zoneServer{hub: stream.NewHub(stream.Config{})}
	cfg.Addr, cfg.Services, cfg.Interval, cfg.Hub = "127.0.0.1:0", []string{dnszone.AllServices}, 10*time.Millisecond, z.hub
	cfg.Ready = func() bool { return true }
	s, err := dnszone.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	z.s, z.addr = s, s.Addr().String()
	return z
}

// ownerView is a view as its owner publishes it: version, generated_at
// by the owner's clock.
type ownerView struct {
	service string
	version uint64
	at      time.Time
	addr    string
}

func (v ownerView) update(t *testing.T) stream.Update {
	eps := []resolver.Endpoint{{InstanceID: fmt.Sprintf("00000000-0000-0000-0000-%012d", v.version%1000), Address: v.addr, Port: 80,
		Zone: "az1", State: "eligible", Weight: 1, Health: resolver.HealthKnown}}
	b, err := json.Marshal(resolver.View{Service: v.service, Version: v.version, Endpoints: eps, GeneratedAt: v.at,
		Checksum: resolver.Checksum(eps)})
	if err != nil {
		t.Fatal(err)
	}
	return stream.Update{View: &stream.Frame{Kind: stream.KindView, Service: v.service, Version: v.version, JSON: b}}
}

// soaSerial asks the zone for its SOA over UDP.
func (z *zoneServer) soaSerial(t *testing.T) uint32 {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(zoneName, dns.TypeSOA)
	r, _, err := (&dns.Client{Net: "udp", Timeout: 2 * time.Second}).Exchange(m, z.addr)
	if err != nil || r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
		t.Fatalf("SOA at %s: %v %v", z.addr, r, err)
	}
	return r.Answer[0].(*dns.SOA).Serial
}

// shows reports whether the zone answers every view's TXT version over
// UDP: it has committed them all.
func (z *zoneServer) shows(t *testing.T, views ...ownerView) bool {
	t.Helper()
	for _, v := range views {
		m := new(dns.Msg)
		m.SetQuestion(v.service+"."+zoneName, dns.TypeTXT)
		r, _, err := (&dns.Client{Net: "udp", Timeout: 2 * time.Second}).Exchange(m, z.addr)
		if err != nil || len(r.Answer) != 1 || !strings.Contains(r.Answer[0].String(), fmt.Sprintf("muster-view-version=%d", v.version)) {
			return false
		}
	}
	return true
}

// publish publishes views to the zone's hub in one batch and waits until
// the zone serves them; it returns the SOA serial then, failing the test
// unless it is after prev in RFC 1982 order (prev 0: no check).
func (z *zoneServer) publish(t *testing.T, prev uint32, views ...ownerView) uint32 {
	t.Helper()
	var ups []stream.Update
	for _, v := range views {
		ups = append(ups, v.update(t))
	}
	z.hub.Publish(ups)
	latest := map[string]ownerView{} // of a service published twice, the later
	for _, v := range views {
		latest[v.service] = v
	}
	want := slices.Collect(maps.Values(latest))
	wait.For(t, 10*time.Second, fmt.Sprintf("%s serving %v", z.addr, want), func() bool { return z.shows(t, want...) })
	serial := z.soaSerial(t)
	if prev != 0 && int32(serial-prev) <= 0 {
		t.Fatalf("%s: serial %d after publishing %v, %d before: not later in RFC 1982 order", z.addr, serial, views, prev)
	}
	return serial
}

// TestSerialIsTheSameForTheSameViews (issue 27): two zone servers, as two
// replicas, fed the same publications of two owners in different
// interleavings and batches (one sees an older-stamped view arrive after
// a newer one, the other gets three in one commit), raise their serials
// with every change, and serve the same serial once they hold the same
// views.
func TestSerialIsTheSameForTheSameViews(t *testing.T) {
	t.Parallel()
	g0 := time.Now().Add(-time.Minute).Truncate(time.Millisecond)
	const x, y = 3 << 31, 5 << 31 // two owners' epochs
	a1 := ownerView{"api", x | 1, g0, "10.0.0.1"}
	b1 := ownerView{"web", x | 2, g0.Add(time.Second), "10.0.0.2"}
	c1 := ownerView{"db", y | 1, g0.Add(2 * time.Second), "10.0.0.3"}
	a2 := ownerView{"api", y | 2, g0.Add(3 * time.Second), "10.0.0.4"} // api moved to owner y
	b2 := ownerView{"web", x | 7, g0.Add(4 * time.Second), "10.0.0.5"}
	c2 := ownerView{"db", y | 9, g0.Add(5 * time.Second), "10.0.0.6"}

	one, two := startZone(t, dnszone.Config{}), startZone(t, dnszone.Config{})
	var s1, s2 uint32
	for _, v := range []ownerView{a1, b1, c1, a2, b2} {
		s1 = one.publish(t, s1, v)
	}
	s2 = two.publish(t, s2, c1)
	s2 = two.publish(t, s2, b1) // stamped before c1: arrives late
	s2 = two.publish(t, s2, a1, a2, b2)
	if s1 != s2 {
		t.Errorf("same views, serials %d and %d", s1, s2)
	}
	// One more change, this time the late arrival last on the second:
	// both still move on, and meet again at the next newest view.
	s1 = one.publish(t, s1, c2)
	s2 = two.publish(t, s2, c2)
	if s1 != s2 {
		t.Errorf("same views after c2, serials %d and %d", s1, s2)
	}
}

// TestSerialDoesNotGoBackWithTheClock: the owner's clock steps back an
// hour (its next views are stamped earlier than the last): the serial
// still rises with every change, never falls.
func TestSerialDoesNotGoBackWithTheClock(t *testing.T) {
	t.Parallel()
	z := startZone(t, dnszone.Config{})
	g0 := time.Now()
	serial := z.publish(t, 0, ownerView{"api", 3<<31 | 1, g0, "10.0.0.1"})
	for i := range 5 {
		// Each an hour and a bit further back than the one before.
		at := g0.Add(-time.Duration(i+1) * 61 * time.Minute)
		serial = z.publish(t, serial, ownerView{"api", 3<<31 | uint64(i+2), at, fmt.Sprintf("10.0.1.%d", i)})
	}
	// And a new owner whose clock is a day behind.
	z.publish(t, serial, ownerView{"api", 4 << 31, g0.Add(-24 * time.Hour), "10.0.2.1"})
}

// TestIXFRFromAnOldSerial: a secondary (here a TSIG-signed IXFR over TCP
// from the secondary's address) that holds a serial from several commits
// back gets the diffs since, from that serial to the current one, with
// this serial scheme's non-consecutive serials.
func TestIXFRFromAnOldSerial(t *testing.T) {
	t.Parallel()
	secret := newSecret(t)
	secondaries, err := dnszone.ParseSecondaries(fmt.Sprintf("127.0.0.1:%d", freePort(t)))
	if err != nil {
		t.Fatal(err)
	}
	z := startZone(t, dnszone.Config{TSIGKeyName: keyName, TSIGSecret: secret,
		// A secondary on loopback nobody listens on: transfers from
		// 127.0.0.1 are allowed, NOTIFYs go unanswered.
		Secondaries: secondaries})
	g0 := time.Now()
	old := z.publish(t, 0, ownerView{"api", 3<<31 | 1, g0, "10.0.0.1"})
	serial := old
	for i := range 4 {
		serial = z.publish(t, serial, ownerView{"api", 3<<31 | uint64(i+2), g0.Add(time.Duration(i+1) * time.Second), fmt.Sprintf("10.0.1.%d", i)})
	}
	m := new(dns.Msg)
	m.SetIxfr(zoneName, old, "ns."+zoneName, "hostmaster."+zoneName)
	m.SetTsig(keyName, dns.HmacSHA256, 300, time.Now().Unix())
	tr := &dns.Transfer{TsigSecret: map[string]string{keyName: secret}}
	envs, err := tr.In(m, z.addr)
	if err != nil {
		t.Fatal(err)
	}
	var rrs []dns.RR
	for e := range envs {
		if e.Error != nil {
			t.Fatal(e.Error)
		}
		rrs = append(rrs, e.RR...)
	}
	var soas []uint32
	for _, rr := range rrs {
		if soa, ok := rr.(*dns.SOA); ok {
			soas = append(soas, soa.Serial)
		}
	}
	// Current, then 4 diffs (from, to), then current: an incremental
	// answer walking from the old serial to the current one.
	if len(soas) != 10 || soas[0] != serial || soas[1] != old || soas[len(soas)-2] != serial || soas[len(soas)-1] != serial {
		t.Fatalf("IXFR from %d (current %d): SOA serials %v in %v", old, serial, soas, rrs)
	}
	for i := 1; i+2 < len(soas); i += 2 {
		if soas[i+1] != soas[i+2] || int32(soas[i+2]-soas[i]) <= 0 {
			t.Errorf("diff %d goes from %d to %d, the next starts at %d", i/2, soas[i], soas[i+1], soas[i+2])
		}
	}
	if !strings.Contains(fmt.Sprint(rrs), "10.0.0.1") || !strings.Contains(fmt.Sprint(rrs), "10.0.1.3") {
		t.Errorf("the diffs lack the first address removed or the last added: %v", rrs)
	}
}
