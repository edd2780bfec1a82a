package dnszone

import (
	"errors"
	"net"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/musterhq/muster/resolver"
)

// FuzzServeDNS: whatever a hostile client sends, once it unpacks as a
// DNS message (the listener drops what does not), answering it neither
// panics nor writes a message that does not pack. The seeds are real
// queries of every kind the zone answers, transfers included, over UDP
// and TCP, with and without a (bad) TSIG status.
func FuzzServeDNS(f *testing.F) {
	seed := func(name string, qtype uint16, edns uint16, mod func(*dns.Msg)) {
		m := new(dns.Msg)
		m.SetQuestion(name, qtype)
		if edns > 0 {
			m.SetEdns0(edns, true)
		}
		if mod != nil {
			mod(m)
		}
		b, err := m.Pack()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, byte(0))
		f.Add(b, byte(3))
	}
	for _, q := range []struct {
		name  string
		qtype uint16
	}{
		{"web.muster.internal.", dns.TypeA}, {"az1.web.muster.internal.", dns.TypeAAAA}, {"_web._tcp.muster.internal.", dns.TypeSRV},
		{"_muster.muster.internal.", dns.TypeTXT}, {"muster.internal.", dns.TypeSOA}, {"muster.internal.", dns.TypeNS},
		{"nope.muster.internal.", dns.TypeA}, {"example.com.", dns.TypeA}, {"web.muster.internal.", dns.TypeANY},
		{"muster.internal.", dns.TypeAXFR}, {"_tcp.muster.internal.", dns.TypeSRV}, {"a.b.c.web.muster.internal.", dns.TypeA},
	} {
		seed(q.name, q.qtype, 0, nil)
		seed(q.name, q.qtype, 4096, nil)
	}
	seed("muster.internal.", dns.TypeIXFR, 0, func(m *dns.Msg) {
		m.Ns = []dns.RR{&dns.SOA{Hdr: dns.RR_Header{Name: "muster.internal.", Rrtype: dns.TypeSOA, Class: dns.ClassINET}, Serial: 1}}
	})
	seed("muster.internal.", dns.TypeAXFR, 0, func(m *dns.Msg) { m.SetTsig("k.", dns.HmacSHA256, 300, time.Now().Unix()) })
	seed("muster.internal.", dns.TypeSOA, 0, func(m *dns.Msg) { m.Opcode = dns.OpcodeNotify })
	seed("web.muster.internal.", dns.TypeA, 0, func(m *dns.Msg) { m.SetEdns0(512, false); m.IsEdns0().SetVersion(1) })

	s := newTestServer(f, Config{TSIGKeyName: "k.", TSIGSecret: "MDEyMzQ1Njc4OWFiY2RlZg==", Secondaries: mustSecondaries(f, "127.0.0.1:5300")})
	eps := []resolver.Endpoint{endpoint(0, "az1", 1), endpoint(1, "az2", 0.5)}
	s.apply(frame(f, viewOf("web", 1, nil, eps...)))
	s.commit()

	f.Fuzz(func(t *testing.T, packet []byte, how byte) {
		m := new(dns.Msg)
		if err := m.Unpack(packet); err != nil {
			return
		}
		if len(m.Question) != 1 {
			// The listener's accept function answers FORMERR itself.
			return
		}
		w := &recorder{remote: udpFrom("127.0.0.1")}
		if how&1 != 0 {
			w.remote = &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 999}
		}
		if how&2 != 0 {
			w.tsig = errors.New("bad signature")
		}
		s.ServeDNS(w, m)
		if len(w.msgs) == 0 {
			t.Fatalf("no answer to %v", m)
		}
	})
}
