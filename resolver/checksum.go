package resolver

import (
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strconv"
	"strings"
)

// Checksum returns muster's checksum of an endpoint set: the hex SHA-256 of
// the netstring encoding of each endpoint in instance-id order (id,
// address, port, zone, state, weight as strconv 'g' -1, health, "1"/"0" for
// quarantined, the capability count, then each capability). It must stay
// byte-for-byte equal to muster's assembler.Checksum; a test cross-checks
// the two.
func Checksum(eps []Endpoint) string {
	if !slices.IsSortedFunc(eps, compareEndpoints) {
		eps = slices.Clone(eps)
		slices.SortFunc(eps, compareEndpoints)
	}
	return checksumSorted(eps)
}

func compareEndpoints(a, b Endpoint) int { return strings.Compare(a.InstanceID, b.InstanceID) }

func checksumSorted(eps []Endpoint) string {
	h := sha256.New()
	b := make([]byte, 0, 4<<10)
	for i := range eps {
		e := &eps[i]
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
		if len(b) > 32<<10 {
			h.Write(b)
			b = b[:0]
		}
	}
	h.Write(b)
	var sum [sha256.Size]byte
	return hex.EncodeToString(h.Sum(sum[:0]))
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
