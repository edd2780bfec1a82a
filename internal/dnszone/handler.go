package dnszone

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/miekg/dns"
)

// tsigFudge is the TSIG time window muster signs with (RFC 8945's 300 s).
const tsigFudge = 300

// tsigRoom is what a TSIG record (hmac-sha256, the key's name) may add to
// a signed UDP answer, kept free when truncating.
const tsigRoom = 100

// qtypeLabel bounds the qtype label of muster_dns_queries_total.
func qtypeLabel(t uint16) string {
	switch t {
	case dns.TypeA, dns.TypeAAAA, dns.TypeSRV, dns.TypeTXT, dns.TypeSOA, dns.TypeNS, dns.TypeANY, dns.TypeAXFR, dns.TypeIXFR:
		return dns.TypeToString[t]
	}
	return "other"
}

func rcodeLabel(rc int) string {
	if s, ok := dns.RcodeToString[rc]; ok {
		return s
	}
	return "other"
}

// ServeDNS answers one request from the current zone. It reads memory
// only: the zone is an immutable snapshot loaded atomically.
func (s *Server) ServeDNS(w dns.ResponseWriter, r *dns.Msg) {
	z := s.cur.Load()
	_, tcp := w.RemoteAddr().(*net.TCPAddr)
	if len(r.Question) != 1 {
		m := new(dns.Msg)
		m.SetRcodeFormatError(r)
		s.write(w, r, m, tcp, false)
		return
	}
	q := r.Question[0]
	signed := r.IsTsig() != nil
	if signed && w.TsigStatus() != nil {
		// A bad signature, or a key muster does not hold: NOTAUTH,
		// unsigned (RFC 8945 5.2).
		m := new(dns.Msg)
		m.SetRcode(r, dns.RcodeNotAuth)
		s.write(w, r, m, tcp, false)
		if q.Qtype == dns.TypeAXFR || q.Qtype == dns.TypeIXFR {
			s.m.transfers.WithLabelValues(strings.ToLower(dns.TypeToString[q.Qtype]), "refused").Inc()
		}
		s.log.Debug("dns: request with a bad TSIG refused", "remote", w.RemoteAddr().String(), "err", w.TsigStatus())
		return
	}
	if !z.ready && r.Opcode == dns.OpcodeQuery && inZone(strings.ToLower(q.Name), z.origin) {
		// Rebuilding after a start: no answer rather than a wrong one.
		// Resolvers try another server or serve what they hold (RFC
		// 8767); secondaries keep their copy and retry.
		m := new(dns.Msg)
		m.SetRcode(r, dns.RcodeServerFailure)
		if q.Qtype == dns.TypeAXFR || q.Qtype == dns.TypeIXFR {
			s.m.transfers.WithLabelValues(strings.ToLower(dns.TypeToString[q.Qtype]), "not_ready").Inc()
		}
		s.write(w, r, m, tcp, signed)
		return
	}
	if r.Opcode == dns.OpcodeQuery && (q.Qtype == dns.TypeAXFR || q.Qtype == dns.TypeIXFR) {
		s.transfer(w, r, z, tcp, signed)
		return
	}
	m := s.answer(r, z, tcp)
	s.write(w, r, m, tcp, signed)
}

// write finishes m for the transport (EDNS0, truncation to the client's
// buffer on UDP), signs it when the request was signed, sends it and
// counts it.
func (s *Server) write(w dns.ResponseWriter, r, m *dns.Msg, tcp, sign bool) {
	size := dns.MinMsgSize
	if opt := r.IsEdns0(); opt != nil {
		// The client's buffer, up to muster's own (RFC 6891 6.2.5): a
		// spoofed query asking for 64 KiB gets no more than UDPSize.
		size = min(max(int(opt.UDPSize()), dns.MinMsgSize), s.cfg.UDPSize)
		if m.IsEdns0() == nil {
			m.SetEdns0(uint16(s.cfg.UDPSize), false)
		}
	}
	if tcp {
		size = dns.MaxMsgSize
	}
	if sign {
		size -= tsigRoom
	}
	fit(m, size)
	if sign {
		t := r.IsTsig()
		m.SetTsig(t.Hdr.Name, t.Algorithm, tsigFudge, time.Now().Unix())
	}
	qt := uint16(0)
	if len(r.Question) == 1 {
		qt = r.Question[0].Qtype
	}
	s.m.queries.WithLabelValues(qtypeLabel(qt), rcodeLabel(m.Rcode)).Inc()
	if err := w.WriteMsg(m); err != nil {
		s.log.Debug("dns: write answer", "remote", w.RemoteAddr().String(), "err", err)
	}
}

// answer is the reply to a query (anything but a transfer) from z.
func (s *Server) answer(r *dns.Msg, z *zone, tcp bool) *dns.Msg {
	m := new(dns.Msg)
	m.SetReply(r)
	m.RecursionAvailable = false
	if r.Opcode != dns.OpcodeQuery {
		// NOTIFY or anything else: muster is the primary; nothing to
		// hear from anyone.
		m.SetRcode(r, dns.RcodeRefused)
		if r.Opcode != dns.OpcodeNotify {
			m.SetRcode(r, dns.RcodeNotImplemented)
		}
		return m
	}
	if opt := r.IsEdns0(); opt != nil && opt.Version() != 0 {
		m.SetEdns0(uint16(s.cfg.UDPSize), false)
		m.IsEdns0().SetExtendedRcode(dns.RcodeBadVers)
		m.Rcode = dns.RcodeBadVers
		return m
	}
	q := r.Question[0]
	qname := strings.ToLower(q.Name)
	if (q.Qclass != dns.ClassINET && q.Qclass != dns.ClassANY) || !inZone(qname, z.origin) {
		m.SetRcode(r, dns.RcodeRefused) // not muster's zone: no recursion, no answer
		return m
	}
	m.Authoritative = true
	set, ok := z.lookup(qname)
	if !ok {
		m.Rcode = dns.RcodeNameError
		m.Ns = []dns.RR{z.soa}
		return m
	}
	var ans []dns.RR
	switch {
	case q.Qtype == dns.TypeANY && !tcp && len(set) > 0:
		// RFC 8482: no full ANY answers over UDP, which would make
		// muster an amplifier; over TCP they are complete.
		ans = []dns.RR{&dns.HINFO{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeHINFO, Class: dns.ClassINET,
			Ttl: uint32(s.cfg.TTL / time.Second)}, Cpu: "RFC8482"}}
	case q.Qtype == dns.TypeANY:
		for _, t := range sortedKeys(set) {
			ans = append(ans, set[t]...)
		}
	default:
		ans = slices.Clone(set[q.Qtype])
	}
	if len(ans) == 0 {
		m.Ns = []dns.RR{z.soa} // NODATA: the name exists
		return m
	}
	if (q.Qtype == dns.TypeA || q.Qtype == dns.TypeAAAA) && len(ans) > 1 {
		// Round-robin: most clients take the first address.
		k := int(s.rotate.Add(1) % uint32(len(ans)))
		ans = append(ans[k:], ans[:k]...)
	}
	m.Answer = ans
	for _, rr := range ans {
		var target string
		switch rr := rr.(type) {
		case *dns.SRV:
			target = rr.Target
		case *dns.NS:
			target = rr.Ns
		default:
			continue
		}
		if tset, ok := z.lookup(target); ok {
			m.Extra = append(m.Extra, tset[dns.TypeA]...)
			m.Extra = append(m.Extra, tset[dns.TypeAAAA]...)
		}
	}
	return m
}

// mayTransfer: a configured secondary's address, and a verified TSIG
// signature with muster's key.
func (s *Server) mayTransfer(w dns.ResponseWriter, r *dns.Msg, signed bool) bool {
	if !signed || s.tsig == nil || w.TsigStatus() != nil {
		return false
	}
	if _, ok := s.tsig[strings.ToLower(r.IsTsig().Hdr.Name)]; !ok {
		return false
	}
	ap, err := netip.ParseAddrPort(w.RemoteAddr().String())
	return err == nil && s.xfrFrom[ap.Addr().Unmap()]
}

// transfer answers AXFR and IXFR (RFC 5936, 1995) to the configured
// secondaries, and refuses everyone else.
func (s *Server) transfer(w dns.ResponseWriter, r *dns.Msg, z *zone, tcp, signed bool) {
	q := r.Question[0]
	kind := strings.ToLower(dns.TypeToString[q.Qtype])
	refuse := func(why string) {
		m := new(dns.Msg)
		m.SetRcode(r, dns.RcodeRefused)
		s.m.transfers.WithLabelValues(kind, "refused").Inc()
		s.logRefusal(kind, w.RemoteAddr().String(), why)
		s.write(w, r, m, tcp, signed && w.TsigStatus() == nil)
	}
	if !strings.EqualFold(q.Name, z.origin) {
		refuse("not muster's zone")
		return
	}
	if !s.mayTransfer(w, r, signed) {
		refuse("not a configured secondary signing with muster's TSIG key")
		return
	}
	var clientSerial uint32
	haveSerial := false
	if q.Qtype == dns.TypeIXFR {
		for _, rr := range r.Ns {
			if soa, ok := rr.(*dns.SOA); ok {
				clientSerial, haveSerial = soa.Serial, true
			}
		}
		if !haveSerial {
			m := new(dns.Msg)
			m.SetRcodeFormatError(r)
			s.m.transfers.WithLabelValues(kind, "refused").Inc()
			s.write(w, r, m, tcp, true)
			return
		}
		if !serialLess(clientSerial, z.serial) || !tcp {
			// Current (or newer than muster?): the SOA alone. Over UDP the
			// SOA alone too, which sends the client to TCP (RFC 1995 2).
			m := new(dns.Msg)
			m.SetReply(r)
			m.Authoritative = true
			m.Answer = []dns.RR{z.soa}
			s.m.transfers.WithLabelValues(kind, "current").Inc()
			s.write(w, r, m, tcp, true)
			return
		}
	} else if !tcp {
		refuse("AXFR over UDP")
		return
	}
	rrs, result := s.axfrRecords(z), "full"
	if haveSerial {
		if inc := s.ixfrRecords(z, clientSerial); inc != nil {
			rrs, result = inc, "incremental"
		}
	}
	ch := make(chan *dns.Envelope)
	tr := new(dns.Transfer)
	errc := make(chan error, 1)
	go func() { errc <- tr.Out(w, r, ch) }()
	const per = 200 // records per message: well inside 64 KiB
	for i := 0; i < len(rrs); i += per {
		ch <- &dns.Envelope{RR: rrs[i:min(i+per, len(rrs))]}
	}
	close(ch)
	err := <-errc
	if err != nil {
		s.log.Warn("dns: zone transfer failed", "kind", kind, "remote", w.RemoteAddr().String(), "err", err)
		s.m.transfers.WithLabelValues(kind, "failed").Inc()
		return
	}
	s.m.transfers.WithLabelValues(kind, result).Inc()
	s.m.queries.WithLabelValues(qtypeLabel(q.Qtype), rcodeLabel(dns.RcodeSuccess)).Inc()
	s.log.Debug("dns: zone transferred", "kind", kind, "result", result, "serial", z.serial, "records", len(rrs), "remote", w.RemoteAddr().String())
}

// axfrRecords is the whole zone between two copies of its SOA.
func (s *Server) axfrRecords(z *zone) []dns.RR {
	out := []dns.RR{z.soa}
	out = append(out, z.records()...)
	return append(out, z.soa)
}

// ixfrRecords is the incremental answer from serial from to z's serial,
// or nil when the history does not reach back to it.
func (s *Server) ixfrRecords(z *zone, from uint32) []dns.RR {
	i := slices.IndexFunc(z.history, func(d diff) bool { return d.from == from })
	if i < 0 {
		return nil
	}
	out := []dns.RR{z.soa}
	for _, d := range z.history[i:] {
		out = append(out, soaAt(z.soa, d.from))
		out = append(out, d.removed...)
		out = append(out, soaAt(z.soa, d.to))
		out = append(out, d.added...)
	}
	return append(out, z.soa)
}

// soaAt is the zone's SOA with another serial (the version a diff starts
// or ends at).
func soaAt(soa *dns.SOA, serial uint32) *dns.SOA {
	c := dns.Copy(soa).(*dns.SOA)
	c.Serial = serial
	return c
}

// notifyLoop tells every secondary of each new serial (RFC 1996), signed
// with the TSIG key. Changes that land while a round is under way are
// announced by the next round, with the serial current then.
func (s *Server) notifyLoop(ctx context.Context) {
	var sent uint32
	first := true
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.notify:
		}
		z := s.cur.Load()
		if !z.ready || (!first && z.serial == sent) {
			continue
		}
		first, sent = false, z.serial
		for _, sec := range s.cfg.Secondaries {
			s.sendNotify(ctx, sec, z)
		}
	}
}

// sendNotify sends one NOTIFY, retrying twice, each try bounded.
func (s *Server) sendNotify(ctx context.Context, to netip.AddrPort, z *zone) {
	c := &dns.Client{Net: "udp", Timeout: time.Second, TsigSecret: s.tsig}
	for try := range 3 {
		m := new(dns.Msg)
		m.SetNotify(z.origin)
		m.Answer = []dns.RR{z.soa}
		m.SetTsig(s.cfg.TSIGKeyName, dns.HmacSHA256, tsigFudge, time.Now().Unix())
		tctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		resp, _, err := c.ExchangeContext(tctx, m, to.String())
		cancel()
		if err == nil && resp.Rcode == dns.RcodeSuccess {
			s.m.notifies.WithLabelValues("acknowledged").Inc()
			return
		}
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			s.log.Warn("dns: NOTIFY answered with an error", "secondary", to.String(), "rcode", dns.RcodeToString[resp.Rcode], "try", try+1)
		} else {
			s.log.Warn("dns: NOTIFY not answered", "secondary", to.String(), "err", err, "try", try+1)
		}
	}
	s.m.notifies.WithLabelValues("failed").Inc()
}

// refusalLogEvery bounds the log lines of refused transfers: a scan of
// the zone should cost a counter, not the log.
const refusalLogEvery = 10 * time.Second

// logRefusal logs a refused transfer, at most once per refusalLogEvery
// (saying how many went unlogged since); muster_dns_transfers_total
// counts them all.
func (s *Server) logRefusal(kind, remote, why string) {
	n := s.refusedQuiet.Add(1)
	now := time.Now().UnixNano()
	last := s.refusalLogged.Load()
	if now-last < int64(refusalLogEvery) || !s.refusalLogged.CompareAndSwap(last, now) {
		return
	}
	s.refusedQuiet.Add(-n)
	s.log.Info("dns: zone transfer refused", "kind", kind, "remote", remote, "why", why, "refused_since_last_line", n-1)
}

// fit cuts m to size bytes as sent (compressed). The answer and authority
// sections are cut with TC set (the client asks again over TCP); the
// additional section (SRV targets' addresses, glue) is only trimmed, as
// RFC 2181 9 allows: missing extras are no reason to retry.
func fit(m *dns.Msg, size int) {
	var extra []dns.RR
	var opt *dns.OPT
	for _, rr := range m.Extra {
		if o, ok := rr.(*dns.OPT); ok {
			opt = o
		} else {
			extra = append(extra, rr)
		}
	}
	only := func(rrs []dns.RR) []dns.RR {
		if opt != nil {
			rrs = append(rrs, opt)
		}
		return rrs
	}
	m.Extra = only(nil)
	m.Truncate(size)
	if m.Truncated || len(extra) == 0 {
		return
	}
	m.Compress = true
	for n := len(extra); n > 0; n /= 2 {
		m.Extra = only(slices.Clone(extra[:n]))
		if m.Len() <= size {
			return
		}
	}
	m.Extra = only(nil)
}
