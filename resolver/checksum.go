package resolver

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"math/bits"
	"runtime"
	"sort"
	"strconv"
	"sync"
)

// Checksum returns muster's checksum of an endpoint set: the sum, modulo
// 2^256, of the SHA-256 digests of each endpoint's canonical encoding (each
// digest read as a big-endian unsigned integer), as 64 hex digits. The
// canonical encoding is the netstrings of id, address, port, zone, state,
// weight as strconv 'g' -1, health, "1"/"0" for quarantined, the
// capability count, then each capability. A sum does not depend on order,
// and a delta is checked by adjusting the held sum for the endpoints it
// touches. It must stay equal to muster's assembler.Checksum; a test
// cross-checks the two.
func Checksum(eps []Endpoint) string {
	s := sumOf(eps)
	return s.String()
}

func compareEndpoints(a, b Endpoint) int { return cmpString(a.InstanceID, b.InstanceID) }

// sum256 is a 256-bit unsigned integer, most significant limb first.
type sum256 [4]uint64

func (s *sum256) add(d *[sha256.Size]byte) {
	var c uint64
	for i := 3; i >= 0; i-- {
		s[i], c = bits.Add64(s[i], binary.BigEndian.Uint64(d[i*8:]), c)
	}
}

func (s *sum256) addSum(o sum256) {
	var c uint64
	for i := 3; i >= 0; i-- {
		s[i], c = bits.Add64(s[i], o[i], c)
	}
}

func (s *sum256) sub(d *[sha256.Size]byte) {
	var b uint64
	for i := 3; i >= 0; i-- {
		s[i], b = bits.Sub64(s[i], binary.BigEndian.Uint64(d[i*8:]), b)
	}
}

func (s sum256) String() string {
	var b [32]byte
	for i := range s {
		binary.BigEndian.PutUint64(b[i*8:], s[i])
	}
	return hex.EncodeToString(b[:])
}

// matches reports whether hexSum is s in lowercase hex, without
// allocating.
func (s sum256) matches(hexSum string) bool {
	if len(hexSum) != 64 {
		return false
	}
	var b [32]byte
	if _, err := hex.Decode(b[:], []byte(hexSum)); err != nil {
		return false
	}
	for i := range s {
		if binary.BigEndian.Uint64(b[i*8:]) != s[i] {
			return false
		}
	}
	return true
}

// parallelSum is the view size from which sumOf splits the hashing over
// the available CPUs (the sum is associative, so the parts just add).
const parallelSum = 8192

func sumOf(eps []Endpoint) sum256 {
	parts := min(runtime.GOMAXPROCS(0), len(eps)/(parallelSum/2))
	if parts < 2 {
		return sumRange(eps)
	}
	sums := make([]sum256, parts)
	var wg sync.WaitGroup
	for p := range parts {
		lo, hi := p*len(eps)/parts, (p+1)*len(eps)/parts
		wg.Go(func() { sums[p] = sumRange(eps[lo:hi]) })
	}
	wg.Wait()
	var s sum256
	for _, part := range sums {
		s.addSum(part)
	}
	return s
}

func sumRange(eps []Endpoint) sum256 {
	var s sum256
	b := make([]byte, 0, 512)
	for i := range eps {
		d := digest(&b, &eps[i])
		s.add(&d)
	}
	return s
}

// digest hashes e's canonical encoding, using *buf as scratch.
func digest(buf *[]byte, e *Endpoint) [sha256.Size]byte {
	b := (*buf)[:0]
	b = netstring(b, e.InstanceID)
	b = netstring(b, e.Address)
	var num [32]byte
	b = netstringB(b, strconv.AppendInt(num[:0], int64(e.Port), 10))
	b = netstring(b, e.Zone)
	b = netstring(b, e.State)
	b = netstringB(b, strconv.AppendFloat(num[:0], e.Weight, 'g', -1, 64))
	b = netstring(b, e.Health)
	if e.Quarantined {
		b = netstring(b, "1")
	} else {
		b = netstring(b, "0")
	}
	b = netstringB(b, strconv.AppendInt(num[:0], int64(len(e.Capabilities)), 10))
	for _, c := range e.Capabilities {
		b = netstring(b, c)
	}
	*buf = b
	return sha256.Sum256(b)
}

// deltaSum returns held's sum adjusted for a delta: the digest of every
// held endpoint the delta removes or replaces is subtracted once, and the
// digest of every upsert added. held is sorted by id; upserts are unique.
func deltaSum(held sum256, old []*Endpoint, upserts []Endpoint, removals []string) sum256 {
	s := held
	b := make([]byte, 0, 512)
	var touched []int
	find := func(id string) {
		i := sort.Search(len(old), func(i int) bool { return old[i].InstanceID >= id })
		if i < len(old) && old[i].InstanceID == id {
			touched = append(touched, i)
		}
	}
	for _, id := range removals {
		find(id)
	}
	for i := range upserts {
		find(upserts[i].InstanceID)
	}
	sort.Ints(touched)
	for k, i := range touched {
		if k > 0 && touched[k-1] == i {
			continue
		}
		d := digest(&b, old[i])
		s.sub(&d)
	}
	for i := range upserts {
		d := digest(&b, &upserts[i])
		s.add(&d)
	}
	return s
}

func netstring(b []byte, s string) []byte {
	b = strconv.AppendInt(b, int64(len(s)), 10)
	b = append(b, ':')
	b = append(b, s...)
	return append(b, ',')
}

func netstringB(b, s []byte) []byte {
	b = strconv.AppendInt(b, int64(len(s)), 10)
	b = append(b, ':')
	b = append(b, s...)
	return append(b, ',')
}
