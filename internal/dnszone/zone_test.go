package dnszone

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/musterhq/muster/internal/stream"
	"github.com/musterhq/muster/internal/wait"
	"github.com/musterhq/muster/resolver"
)

func ptr[T any](v T) *T { return &v }

// endpoint i of a test view.
func endpoint(i int, zone string, weight float64) resolver.Endpoint {
	return resolver.Endpoint{InstanceID: fmt.Sprintf("00000000-0000-0000-0000-%012d", i), Address: fmt.Sprintf("10.0.0.%d", i+1),
		Port: 8000 + i, Zone: zone, State: "eligible", Weight: weight, Health: resolver.HealthKnown}
}

func viewOf(service string, version uint64, zones map[string]resolver.Zone, eps ...resolver.Endpoint) resolver.View {
	return resolver.View{Service: service, Version: version, Endpoints: eps, Zones: zones, Checksum: resolver.Checksum(eps)}
}

func frame(t testing.TB, v resolver.View) *stream.Frame {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return &stream.Frame{Kind: stream.KindView, Service: v.Service, Version: v.Version, JSON: b}
}

// newTestServer is a Server that is never started: tests apply frames and
// commit by hand, and call ServeDNS with a recording writer.
func newTestServer(t testing.TB, cfg Config) *Server {
	t.Helper()
	cfg.Addr = "127.0.0.1:0"
	if cfg.Services == nil {
		cfg.Services = []string{AllServices}
	}
	cfg.Hub = stream.NewHub(stream.Config{})
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// recorder is a dns.ResponseWriter that keeps what was written.
type recorder struct {
	remote net.Addr
	tsig   error
	msgs   []*dns.Msg
}

func (r *recorder) LocalAddr() net.Addr  { return &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 53} }
func (r *recorder) RemoteAddr() net.Addr { return r.remote }
func (r *recorder) WriteMsg(m *dns.Msg) error {
	if _, err := m.Pack(); err != nil {
		return err
	}
	r.msgs = append(r.msgs, m)
	return nil
}
func (r *recorder) Write(b []byte) (int, error) { return len(b), nil }
func (r *recorder) Close() error                { return nil }
func (r *recorder) TsigStatus() error           { return r.tsig }
func (r *recorder) TsigTimersOnly(bool)         {}
func (r *recorder) Hijack()                     {}

func udpFrom(ip string) net.Addr { return &net.UDPAddr{IP: net.ParseIP(ip), Port: 5353} }

func query(t testing.TB, s *Server, name string, qtype uint16) *dns.Msg {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	w := &recorder{remote: udpFrom("127.0.0.1")}
	s.ServeDNS(w, m)
	if len(w.msgs) != 1 {
		t.Fatalf("%s %s: %d answers written", dns.TypeToString[qtype], name, len(w.msgs))
	}
	return w.msgs[0]
}

func addrs(m *dns.Msg) []string {
	var out []string
	for _, rr := range m.Answer {
		switch rr := rr.(type) {
		case *dns.A:
			out = append(out, rr.A.String())
		case *dns.AAAA:
			out = append(out, rr.AAAA.String())
		}
	}
	return out
}

// TestAnswersAreTheResolversTargets: the zone publishes exactly
// Snapshot.Targets: a drained zone's endpoints are out (unless every zone
// is drained), a tripped zone's ineligible endpoints are in, health
// unknown is in, ineligible is out; SRV weights follow the shares.
func TestAnswersAreTheResolversTargets(t *testing.T) {
	s := newTestServer(t, Config{})
	unknown := endpoint(1, "az1", 1)
	unknown.Health = resolver.HealthUnknown
	out := endpoint(2, "az1", 0)
	out.State = resolver.StateIneligible
	half := endpoint(3, "az1", 0.5)
	tripped := endpoint(4, "az2", 1)
	tripped.State = resolver.StateIneligible
	drained := endpoint(5, "az3", 1)
	zones := map[string]resolver.Zone{
		"az1": {Guard: resolver.GuardOK}, "az2": {Guard: resolver.GuardTripped},
		"az3": {Guard: resolver.GuardOK, TrafficWeight: ptr(0.0)},
	}
	s.apply(frame(t, viewOf("web", 10, zones, endpoint(0, "az1", 1), unknown, out, half, tripped, drained)))
	s.commit()

	got := strings.Join(slices.Sorted(slices.Values(addrs(query(t, s, "web.muster.internal.", dns.TypeA)))), " ")
	want := "10.0.0.1 10.0.0.2 10.0.0.4 10.0.0.5"
	if got != want {
		t.Errorf("A web: %s, want %s (eligible, unknown, half weight, tripped zone; not ineligible, not drained)", got, want)
	}
	if m := query(t, s, "az3.web.muster.internal.", dns.TypeA); m.Rcode != dns.RcodeSuccess || len(m.Answer) != 0 {
		t.Errorf("drained zone az3: %s; want NODATA", m)
	}
	if m := query(t, s, "az2.web.muster.internal.", dns.TypeA); strings.Join(addrs(m), " ") != "10.0.0.5" {
		t.Errorf("tripped zone az2: %v", addrs(m))
	}
	srv := query(t, s, "_web._tcp.muster.internal.", dns.TypeSRV)
	weights := map[uint16]uint16{}
	for _, rr := range srv.Answer {
		weights[rr.(*dns.SRV).Port] = rr.(*dns.SRV).Weight
	}
	if weights[8000] != 65535 || weights[8003] != 32768 || len(weights) != 4 {
		t.Errorf("SRV weights by port %v: want 65535 for full shares, 32768 for half", weights)
	}
	if len(srv.Extra) != 4 {
		t.Errorf("SRV additional section: %d address records, want 4", len(srv.Extra))
	}

	// Every zone drained: traffic weights are ignored (muster must never
	// be the reason traffic stops).
	all := map[string]resolver.Zone{"az1": {Guard: resolver.GuardOK, TrafficWeight: ptr(0.0)}}
	s.apply(frame(t, viewOf("web", 11, all, endpoint(0, "az1", 1), endpoint(1, "az1", 1))))
	s.commit()
	if got := addrs(query(t, s, "web.muster.internal.", dns.TypeA)); len(got) != 2 {
		t.Errorf("every zone drained: %v, want both endpoints", got)
	}
}

// TestDeltasAndStaleFrames: a delta that follows the held view is
// applied; one that does not (or fails its checksum) falls back to the
// hub's latest view; an old version changes nothing.
func TestDeltasAndStaleFrames(t *testing.T) {
	s := newTestServer(t, Config{})
	v1 := viewOf("web", 1, map[string]resolver.Zone{"az1": {Guard: resolver.GuardOK}}, endpoint(0, "az1", 1), endpoint(1, "az1", 1))
	s.apply(frame(t, v1))
	d := resolver.Delta{Service: "web", FromVersion: 1, Version: 2, Removals: []string{endpoint(0, "", 0).InstanceID},
		Checksum: resolver.Checksum([]resolver.Endpoint{endpoint(1, "az1", 1)})}
	b, _ := json.Marshal(d)
	s.apply(&stream.Frame{Kind: stream.KindDelta, Service: "web", Version: 2, FromVersion: 1, JSON: b})
	s.commit()
	if got := addrs(query(t, s, "web.muster.internal.", dns.TypeA)); strings.Join(got, ",") != "10.0.0.2" {
		t.Fatalf("after the delta: %v", got)
	}
	s.apply(frame(t, v1)) // stale
	if len(s.pending) != 0 {
		t.Fatal("a stale view was applied")
	}
	// A delta with a wrong checksum, and no newer view at the hub:
	// nothing changes, and it is counted.
	bad := resolver.Delta{Service: "web", FromVersion: 2, Version: 3, Removals: []string{endpoint(1, "", 0).InstanceID}, Checksum: "00"}
	b, _ = json.Marshal(bad)
	s.apply(&stream.Frame{Kind: stream.KindDelta, Service: "web", Version: 3, FromVersion: 2, JSON: b})
	if len(s.pending) != 0 || s.held["web"].Version != 2 {
		t.Fatalf("a delta failing its checksum was applied: held v%d", s.held["web"].Version)
	}
	// The hub has v4: a gap is filled from it.
	v4 := viewOf("web", 4, nil, endpoint(7, "az1", 1))
	s.cfg.Hub.Publish([]stream.Update{{View: frame(t, v4)}})
	s.apply(&stream.Frame{Kind: stream.KindDelta, Service: "web", Version: 4, FromVersion: 3, JSON: []byte(`{}`)})
	s.commit()
	if got := addrs(query(t, s, "web.muster.internal.", dns.TypeA)); strings.Join(got, ",") != "10.0.0.8" {
		t.Fatalf("after the gap: %v", got)
	}
}

// TestIXFRHistoryAndFallback: IXFR from a serial in the history sends the
// diffs since (RFC 1995 layout); from one older than the history, the
// whole zone; from the current serial, the SOA alone.
func TestIXFRHistoryAndFallback(t *testing.T) {
	s := newTestServer(t, Config{History: 2, TSIGKeyName: "k.", TSIGSecret: "MDEyMzQ1Njc4OWFiY2RlZg==",
		Secondaries: mustSecondaries(t, "127.0.0.1:5300")})
	s0 := s.Serial()
	var serials []uint32
	for i := range 3 {
		s.apply(frame(t, viewOf("web", uint64(i+1), nil, endpoint(i, "az1", 1))))
		s.commit()
		serials = append(serials, s.Serial())
	}
	ixfr := func(from uint32) []dns.RR {
		m := new(dns.Msg)
		m.SetIxfr("muster.internal.", from, "ns.muster.internal.", "hostmaster.muster.internal.")
		m.SetTsig("k.", dns.HmacSHA256, 300, time.Now().Unix())
		var rrs []dns.RR
		w := &xfrRecorder{recorder: recorder{remote: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 999}}}
		s.ServeDNS(w, m)
		for _, msg := range w.msgs {
			rrs = append(rrs, msg.Answer...)
		}
		return rrs
	}
	inc := ixfr(serials[0])
	// SOA(cur), SOA(s1) -web0 SOA(s2) +web2..., SOA(cur)
	if len(inc) < 4 || inc[0].(*dns.SOA).Serial != serials[2] || inc[1].(*dns.SOA).Serial != serials[0] || inc[len(inc)-1].(*dns.SOA).Serial != serials[2] {
		t.Fatalf("incremental answer from %d: %v", serials[0], inc)
	}
	soas := 0
	for _, rr := range inc {
		if rr.Header().Rrtype == dns.TypeSOA {
			soas++
		}
	}
	// Two diffs: SOA, (SOA removed SOA added) twice, SOA.
	if soas != 6 || !strings.Contains(fmt.Sprint(inc), "10.0.0.3") || !strings.Contains(fmt.Sprint(inc), "10.0.0.1") {
		t.Errorf("incremental answer from %d: %d SOAs, want 6, and the removals and additions: %v", serials[0], soas, inc)
	}
	full := ixfr(s0) // older than the 2 diffs kept
	if len(full) < 3 || full[1].Header().Rrtype == dns.TypeSOA {
		t.Errorf("IXFR from outside the history: want the whole zone, got %v", full)
	}
	if cur := ixfr(serials[2]); len(cur) != 1 || cur[0].(*dns.SOA).Serial != serials[2] {
		t.Errorf("IXFR from the current serial: %v", cur)
	}
}

// xfrRecorder collects the messages dns.Transfer writes.
type xfrRecorder struct{ recorder }

func mustSecondaries(t testing.TB, s string) []netip.AddrPort {
	t.Helper()
	out, err := ParseSecondaries(s)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestSerialArithmetic: RFC 1982 order, across the wrap; a commit's
// serial point is its content's unless that is not above the previous
// one.
func TestSerialArithmetic(t *testing.T) {
	for _, c := range []struct {
		a, b uint32
		less bool
	}{{1, 2, true}, {2, 1, false}, {0xffffffff, 0, true}, {0, 0xffffffff, false}, {5, 5, false}, {0, 1 << 31, false}, {1 << 30, 0, false}} {
		if got := serialLess(c.a, c.b); got != c.less {
			t.Errorf("serialLess(%d, %d) = %v", c.a, c.b, got)
		}
	}
	for _, c := range []struct {
		prev, c, fp uint64
		served      bool
		want        uint64
	}{
		{prev: 100, c: 200, served: true, want: 200},                  // the content's point, above
		{prev: 200, c: 150, fp: 3 << fpBits, served: true, want: 204}, // not above: moved on by 1 + 3
		{prev: 200, c: 200, fp: 7 << fpBits, served: true, want: 208},
		{prev: 200, c: 150, served: false, want: 150}, // never served: the content's point
	} {
		if got := nextPoint(c.prev, c.c, c.fp, c.served); got != c.want {
			t.Errorf("nextPoint(%d, %d, %#x, %v) = %d, want %d", c.prev, c.c, c.fp, c.served, got, c.want)
		}
	}
	if got := contentPoint(12345, 0xff); got != 12345<<fpBits|0x7f {
		t.Errorf("contentPoint(12345, 0xff) = %d", got)
	}
}

// TestConfigValidate: bad settings are refused naming the field.
func TestConfigValidate(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{Addr: "127.0.0.1:53", Hub: &stream.Hub{}}, "Services is required"},
		{Config{Addr: "nope", Services: []string{"web"}, Hub: &stream.Hub{}}, "Addr"},
		{Config{Addr: ":53", Services: []string{"Web_1"}, Hub: &stream.Hub{}}, "not a service name"},
		{Config{Addr: ":53", Services: []string{"*", "web"}, Hub: &stream.Hub{}}, "not both"},
		{Config{Addr: ":53", Services: []string{"web"}, Hub: &stream.Hub{}, Secondaries: mustSecondaries(t, "10.0.0.1")}, "TSIG key"},
		{Config{Addr: ":53", Services: []string{"web"}, Hub: &stream.Hub{}, TSIGKeyName: "k", TSIGSecret: "c2hvcnQ="}, "at least 16"},
		{Config{Addr: ":53", Services: []string{"web"}, Hub: &stream.Hub{}, TTL: time.Millisecond}, "TTL"},
		{Config{Addr: ":53", Services: []string{"web"}}, "Hub"},
	} {
		err := c.cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Validate(%+v) = %v, want an error naming %q", c.cfg, err, c.want)
		}
	}
	ok := Config{Addr: "127.0.0.1:8053", Services: []string{"web"}, Hub: &stream.Hub{}}
	if err := ok.Validate(); err != nil || ok.Zone != DefaultZone || ok.TTL != DefaultTTL || ok.Nameservers[0] != "ns.muster.internal." || len(ok.NameserverAddrs) != 1 {
		t.Errorf("defaults: %v %+v", err, ok)
	}
	if _, err := ParseSecondaries("10.0.0.1:5300, 10.0.0.2,nope"); err == nil {
		t.Error("ParseSecondaries took nope")
	}
}

// TestServedListAndReservedNames: only listed services are served (the
// rest is NXDOMAIN, as if absent), and a service named like an in-zone
// nameserver is left out.
func TestServedListAndReservedNames(t *testing.T) {
	s := newTestServer(t, Config{Services: []string{"web", "ns"}})
	if got := s.wanted(); strings.Join(got, ",") != "web" {
		t.Errorf("wanted %v: want web only (ns is the nameserver's name)", got)
	}
	if m := query(t, s, "ns.muster.internal.", dns.TypeA); len(m.Answer) != 1 {
		t.Errorf("the nameserver's glue: %s", m)
	}
	if m := query(t, s, "muster.internal.", dns.TypeNS); len(m.Answer) != 1 || len(m.Extra) != 1 {
		t.Errorf("NS at the apex with glue: %s", m)
	}
}

// TestBadTSIGIsNotAuth: a request whose signature did not verify gets
// NOTAUTH, unsigned.
func TestBadTSIGIsNotAuth(t *testing.T) {
	s := newTestServer(t, Config{TSIGKeyName: "k.", TSIGSecret: "MDEyMzQ1Njc4OWFiY2RlZg==", Secondaries: mustSecondaries(t, "127.0.0.1:5300")})
	m := new(dns.Msg)
	m.SetAxfr("muster.internal.")
	m.SetTsig("k.", dns.HmacSHA256, 300, time.Now().Unix())
	w := &recorder{remote: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 999}, tsig: errors.New("bad signature")}
	s.ServeDNS(w, m)
	if len(w.msgs) != 1 || w.msgs[0].Rcode != dns.RcodeNotAuth || w.msgs[0].IsTsig() != nil {
		t.Fatalf("bad TSIG: %v", w.msgs)
	}
}

// TestANYIsMinimalOverUDP: RFC 8482: ANY over UDP gets one HINFO record
// (no amplification); over TCP every record at the name.
func TestANYIsMinimalOverUDP(t *testing.T) {
	s := newTestServer(t, Config{})
	s.apply(frame(t, viewOf("web", 1, nil, endpoint(0, "az1", 1), endpoint(1, "az1", 1))))
	s.commit()
	if m := query(t, s, "web.muster.internal.", dns.TypeANY); len(m.Answer) != 1 || m.Answer[0].Header().Rrtype != dns.TypeHINFO {
		t.Errorf("ANY over UDP: %v", m.Answer)
	}
	q := new(dns.Msg)
	q.SetQuestion("web.muster.internal.", dns.TypeANY)
	w := &recorder{remote: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 999}}
	s.ServeDNS(w, q)
	if len(w.msgs) != 1 || len(w.msgs[0].Answer) != 3 { // two A, one TXT
		t.Errorf("ANY over TCP: %v", w.msgs)
	}
}

// TestWorkerShape: Stop before Start and twice is safe, a second Start is
// refused, an immediate Stop after Start returns; an address in use fails
// Start, unless Optional, which serves nothing and says so.
func TestWorkerShape(t *testing.T) {
	s := newTestServer(t, Config{})
	s.Stop()
	if err := s.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := s.Start(t.Context()); err == nil {
		t.Error("a second Start succeeded")
	}
	s.Stop()
	s.Stop()

	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	hub := stream.NewHub(stream.Config{})
	strict, err := New(Config{Addr: busy.Addr().String(), Services: []string{"web"}, Hub: hub})
	if err != nil {
		t.Fatal(err)
	}
	if err := strict.Start(t.Context()); err == nil {
		strict.Stop()
		t.Errorf("Start on an address in use (%s) succeeded", busy.Addr())
	}
	optional, err := New(Config{Addr: busy.Addr().String(), Services: []string{"web"}, Hub: hub, Optional: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := optional.Start(t.Context()); err != nil || optional.Addr() != nil {
		t.Errorf("Optional on an address in use: %v, serving on %v", err, optional.Addr())
	}
	optional.Stop()
}

// TestAdditionalRecordsAreTrimmedWithoutTC: an SRV answer that fits 512
// bytes while its targets' addresses do not comes without TC (RFC 2181
// 9): the client has what it asked for. Room permitting, the addresses
// come too.
func TestAdditionalRecordsAreTrimmedWithoutTC(t *testing.T) {
	for _, c := range []struct{ n, minExtra, maxExtra int }{{3, 3, 3}, {6, 0, 5}} {
		s := newTestServer(t, Config{})
		var eps []resolver.Endpoint
		for i := range c.n {
			eps = append(eps, endpoint(i, "az1", 1))
		}
		s.apply(frame(t, viewOf("web", 1, nil, eps...)))
		s.commit()
		m := query(t, s, "_web._tcp.muster.internal.", dns.TypeSRV)
		m.Compress = true
		if m.Truncated || len(m.Answer) != c.n || len(m.Extra) < c.minExtra || len(m.Extra) > c.maxExtra || m.Len() > 512 {
			t.Errorf("SRV of %d over UDP: TC %v, %d answers, %d additional, %d bytes; want all answers, %d to %d addresses, no TC, at most 512 bytes",
				c.n, m.Truncated, len(m.Answer), len(m.Extra), m.Len(), c.minExtra, c.maxExtra)
		}
	}
}

// TestConcurrentQueriesShareTheZone: queries answered at once from one
// zone (its records are shared, never copied per query) while commits
// replace it; the race detector checks nobody writes what others read.
func TestConcurrentQueriesShareTheZone(t *testing.T) {
	s := newTestServer(t, Config{})
	var eps []resolver.Endpoint
	for i := range 40 {
		eps = append(eps, endpoint(i, fmt.Sprintf("az%d", i%3), 1))
	}
	s.apply(frame(t, viewOf("web", 1, nil, eps...)))
	s.commit()
	done := make(chan struct{})
	var wg sync.WaitGroup
	var answered atomic.Int64
	for g := range 8 {
		wg.Go(func() {
			names := []string{"web.muster.internal.", "_web._tcp.muster.internal.", "az1.web.muster.internal.", "nope.muster.internal.", "muster.internal."}
			types := []uint16{dns.TypeA, dns.TypeSRV, dns.TypeA, dns.TypeA, dns.TypeNS}
			for i := 0; ; i++ {
				select {
				case <-done:
					return
				default:
				}
				m := new(dns.Msg)
				m.SetQuestion(names[(i+g)%len(names)], types[(i+g)%len(names)])
				if i%2 == 0 {
					m.SetEdns0(1232, false)
				}
				w := &recorder{remote: udpFrom("127.0.0.1")}
				if i%3 == 0 {
					w.remote = &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 999}
				}
				s.ServeDNS(w, m)
				answered.Add(1)
			}
		})
	}
	for v := range 20 {
		s.apply(frame(t, viewOf("web", uint64(v+2), nil, eps[v:]...)))
		s.commit()
		for n := answered.Load(); answered.Load() < n+50; { // let queries run against this zone
			runtime.Gosched()
		}
	}
	close(done)
	wg.Wait()
}

// TestNotServedUntilReady: until Config.Ready first holds (muster has
// published views since it started, as /readyz says), names in the zone
// are SERVFAIL, transfers too, and no NOTIFY goes out: no NXDOMAIN for
// services that exist, no empty zone for a secondary to take. Then the
// zone is served.
func TestNotServedUntilReady(t *testing.T) {
	var ready atomic.Bool
	hub := stream.NewHub(stream.Config{})
	s, err := New(Config{Addr: "127.0.0.1:0", Services: []string{AllServices}, Hub: hub, Interval: 10 * time.Millisecond,
		Ready: ready.Load, TSIGKeyName: "k.", TSIGSecret: "MDEyMzQ1Njc4OWFiY2RlZg==", Secondaries: mustSecondaries(t, "127.0.0.1:1")})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	hub.Publish([]stream.Update{{View: frame(t, viewOf("web", 1, nil, endpoint(0, "az1", 1)))}})
	ask := func(name string, qtype uint16) int {
		m := new(dns.Msg)
		m.SetQuestion(name, qtype)
		r, _, err := (&dns.Client{Timeout: 2 * time.Second}).Exchange(m, s.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		return r.Rcode
	}
	// The follower takes the view meanwhile; the zone stays unserved.
	wait.For(t, 2*time.Second, "the view taken in", func() bool { return s.Services() == 1 })
	for _, q := range []struct {
		name  string
		qtype uint16
	}{{"web.muster.internal.", dns.TypeA}, {"nope.muster.internal.", dns.TypeA}, {"muster.internal.", dns.TypeSOA}} {
		if rc := ask(q.name, q.qtype); rc != dns.RcodeServerFailure {
			t.Errorf("%s %s before ready: %s, want SERVFAIL", dns.TypeToString[q.qtype], q.name, dns.RcodeToString[rc])
		}
	}
	if rc := ask("example.com.", dns.TypeA); rc != dns.RcodeRefused {
		t.Errorf("outside the zone before ready: %s, want REFUSED", dns.RcodeToString[rc])
	}
	ready.Store(true)
	wait.For(t, 2*time.Second, "the zone served once ready", func() bool { return ask("web.muster.internal.", dns.TypeA) == dns.RcodeSuccess })
	if rc := ask("nope.muster.internal.", dns.TypeA); rc != dns.RcodeNameError {
		t.Errorf("unknown service once ready: %s", dns.RcodeToString[rc])
	}
}
