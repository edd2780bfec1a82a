package dnszone

import (
	"encoding/binary"
	"hash/fnv"
	"math"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/miekg/dns"

	"github.com/musterhq/muster/resolver"
)

// rrsets are the records at one owner name, by type. A name present with
// no records (a zone of a service with nothing routable in it) exists: it
// answers NODATA, not NXDOMAIN.
type rrsets map[uint16][]dns.RR

// serviceRecords are one service's names and records, built from one
// view. Immutable once built: queries read it without a lock.
type serviceRecords struct {
	service string
	version uint64
	names   map[string]rrsets // owner name (lower case, fully qualified) -> records
	all     []dns.RR          // every record, in a stable order (for AXFR and diffs)
	keys    []string          // all[i].String(), computed once (diffs compare them)
	// stamp is the view's generated_at (set by the service's owner) in
	// tenths of a second since the Unix epoch, 0 when unset; hash is
	// the view's (service, version) hashed. Both make the serial (see
	// contentPoint).
	stamp int64
	hash  uint64
}

// buildService turns a view's routing targets into records:
//
//	SERVICE.ZONE          A/AAAA of every target; TXT "muster-view-version=N"
//	ZONENAME.SERVICE.ZONE A/AAAA of the targets in that zone
//	ID.SERVICE.ZONE       A/AAAA of one target (the SRV records' targets)
//	_SERVICE._tcp.ZONE    SRV of every target: priority 0, weight from its share
//
// targets is resolver.Snapshot.Targets: exactly the endpoints the Go
// resolver routes to. zones names the view's zones (each gets a name even
// when none of its endpoints is routable).
func buildService(origin, service string, version uint64, generatedAt time.Time, targets []resolver.Target, zones []string, ttl uint32) *serviceRecords {
	sr := &serviceRecords{service: service, version: version, names: map[string]rrsets{}, stamp: max(0, generatedAt.UnixMilli()/100)}
	if generatedAt.IsZero() {
		sr.stamp = 0
	}
	h := fnv.New64a()
	h.Write([]byte(service))
	h.Write(binary.BigEndian.AppendUint64([]byte{0}, version))
	sr.hash = h.Sum64()
	base := service + "." + origin
	srvName := "_" + service + "._tcp." + origin
	hdr := func(name string, t uint16) dns.RR_Header {
		return dns.RR_Header{Name: name, Rrtype: t, Class: dns.ClassINET, Ttl: ttl}
	}
	add := func(name string, rr dns.RR) {
		set := sr.names[name]
		if set == nil {
			set = rrsets{}
			sr.names[name] = set
		}
		t := rr.Header().Rrtype
		set[t] = append(set[t], rr)
		sr.all = append(sr.all, rr)
	}
	type nameAddr struct {
		name string
		ip   netip.Addr
	}
	seen := map[nameAddr]bool{}
	addr := func(name string, ip netip.Addr) {
		ip = ip.Unmap()
		if seen[nameAddr{name, ip}] {
			return // two instances on one address: one A record
		}
		seen[nameAddr{name, ip}] = true
		if ip.Is4() {
			add(name, &dns.A{Hdr: hdr(name, dns.TypeA), A: ip.Unmap().AsSlice()})
		} else {
			add(name, &dns.AAAA{Hdr: hdr(name, dns.TypeAAAA), AAAA: ip.AsSlice()})
		}
	}
	sr.names[base] = rrsets{}
	add(base, &dns.TXT{Hdr: hdr(base, dns.TypeTXT), Txt: []string{"muster-view-version=" + strconv.FormatUint(version, 10)}})
	for _, z := range zones {
		if validLabel(z) {
			if _, ok := sr.names[z+"."+base]; !ok {
				sr.names[z+"."+base] = rrsets{}
			}
		}
	}
	maxShare := 0.0
	for _, t := range targets {
		maxShare = max(maxShare, t.Share)
	}
	sr.names[srvName] = rrsets{}
	for _, t := range targets {
		ip, err := netip.ParseAddr(t.Address)
		if err != nil {
			continue // muster registers IP addresses only
		}
		addr(base, ip)
		if validLabel(t.Zone) {
			addr(t.Zone+"."+base, ip)
		}
		inst := strings.ToLower(t.InstanceID) + "." + base
		addr(inst, ip)
		if t.Port > 0 && t.Port <= math.MaxUint16 {
			add(srvName, &dns.SRV{Hdr: hdr(srvName, dns.TypeSRV), Priority: 0, Weight: srvWeight(t.Share, maxShare),
				Port: uint16(t.Port), Target: inst})
		}
	}
	sr.keys = make([]string, len(sr.all))
	order := make([]int, len(sr.all))
	for i, rr := range sr.all {
		sr.keys[i], order[i] = rr.String(), i
	}
	slices.SortFunc(order, func(a, b int) int { return strings.Compare(sr.keys[a], sr.keys[b]) })
	all, keys := make([]dns.RR, len(order)), make([]string, len(order))
	for i, k := range order {
		all[i], keys[i] = sr.all[k], sr.keys[k]
	}
	sr.all, sr.keys = all, keys
	return sr
}

// srvWeight scales a share to 1..65535 relative to the largest share of
// the service: the largest gets 65535, and no routable target gets 0
// (RFC 2782 gives weight 0 almost no traffic).
func srvWeight(share, maxShare float64) uint16 {
	if maxShare <= 0 || share <= 0 {
		return 1
	}
	w := math.Round(share / maxShare * math.MaxUint16)
	return uint16(min(max(w, 1), math.MaxUint16))
}

// validLabel: a name muster can publish as one DNS label (registry names
// are RFC 1123 labels already; this keeps a hostile view from making
// names that do not parse).
func validLabel(s string) bool {
	if s == "" || len(s) > 63 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// zone is the whole zone at one serial: the apex records and each
// service's records. Immutable: a commit builds a new zone that shares
// every unchanged service's records, and queries load the current one
// atomically.
type zone struct {
	origin string
	serial uint32
	// point is the serial before it is cut to 32 bits (serial =
	// uint32(point)), and fp the XOR of every service's hash: see
	// contentPoint and nextPoint.
	point    uint64
	fp       uint64
	soa      *dns.SOA
	apex     map[string]rrsets // the origin, in-zone nameservers, _muster, _tcp
	services map[string]*serviceRecords
	// history holds the diffs of the last commits, oldest first, ending
	// at serial (for IXFR).
	history []diff
	// ready: views have been published since muster started (Config.Ready).
	// Until then the zone is not served: an empty zone would tell every
	// client that no service exists, and a secondary would transfer it.
	ready bool
}

// lookup finds the records at qname (lower case, fully qualified, inside
// the origin). ok is false for a name that does not exist (NXDOMAIN).
func (z *zone) lookup(qname string) (set rrsets, ok bool) {
	if set, ok := z.apex[qname]; ok {
		return set, true
	}
	if len(qname) <= len(z.origin) || !strings.HasSuffix(qname, z.origin) || qname[len(qname)-len(z.origin)-1] != '.' {
		return nil, false
	}
	rel := qname[:len(qname)-len(z.origin)-1]
	last, rest := rel, ""
	if i := strings.LastIndexByte(rel, '.'); i >= 0 {
		last, rest = rel[i+1:], rel[:i]
	}
	svc := last
	if last == "_tcp" {
		if !strings.HasPrefix(rest, "_") || strings.Contains(rest, ".") {
			return nil, false
		}
		svc = rest[1:]
	}
	sr := z.services[svc]
	if sr == nil {
		return nil, false
	}
	set, ok = sr.names[qname]
	return set, ok
}

// records lists every record of the zone but the SOA, in a stable order:
// the apex, then the services in name order.
func (z *zone) records() []dns.RR {
	var out []dns.RR
	for _, name := range sortedKeys(z.apex) {
		for _, t := range sortedKeys(z.apex[name]) {
			if t != dns.TypeSOA {
				out = append(out, z.apex[name][t]...)
			}
		}
	}
	for _, name := range sortedKeys(z.services) {
		out = append(out, z.services[name].all...)
	}
	return out
}

func sortedKeys[K interface{ ~string | ~uint16 }, V any](m map[K]V) []K {
	keys := make([]K, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// diff is what IXFR sends for one commit: the records removed and added
// between two serials (RFC 1995).
type diff struct {
	from, to       uint32
	removed, added []dns.RR
}

// diffServices compares one service's records before and after (either
// may be nil).
func diffServices(old, cur *serviceRecords) (removed, added []dns.RR) {
	if old == nil {
		old = &serviceRecords{}
	}
	if cur == nil {
		cur = &serviceRecords{}
	}
	// Both are sorted by key: merge.
	i, j := 0, 0
	for i < len(old.keys) || j < len(cur.keys) {
		switch {
		case j == len(cur.keys) || (i < len(old.keys) && old.keys[i] < cur.keys[j]):
			removed = append(removed, old.all[i])
			i++
		case i == len(old.keys) || cur.keys[j] < old.keys[i]:
			added = append(added, cur.all[j])
			j++
		default:
			i, j = i+1, j+1
		}
	}
	return removed, added
}

// fpBits is how many low bits of a serial point hold the content's
// fingerprint.
const fpBits = 7

// contentPoint is the serial point a zone's content determines: the
// newest view's stamp (tenths of a second of its owner's clock) above
// fpBits of the fingerprint of every (service, version) it holds. Every
// replica holding the same views computes the same point.
func contentPoint(newest int64, fp uint64) uint64 {
	return uint64(newest)<<fpBits | fp&(1<<fpBits-1)
}

// nextPoint is the serial point of a commit whose content gives point c
// (with fingerprint fp), after a zone at prev: c when it is above prev,
// or when prev was never served (a zone not ready yet: nobody holds its
// serial); otherwise prev moved on by 1 to 8, the distance taken from
// bits of fp above those in c, so that two replicas moving on from one
// serial with different content rarely land on the same one.
func nextPoint(prev, c, fp uint64, served bool) uint64 {
	if !served || c > prev {
		return c
	}
	return prev + 1 + (fp>>fpBits)%8
}

// serialLess is RFC 1982's s1 < s2 for 32-bit serials.
func serialLess(s1, s2 uint32) bool {
	return s1 != s2 && (s1 < s2 && s2-s1 < 1<<31 || s1 > s2 && s1-s2 > 1<<31)
}
