package assembler

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strconv"
)

// Checksum returns the checksum of an endpoint set: the hex SHA-256 of the
// canonical encoding of the endpoints in instance-id order, so it does not
// depend on the order of eps. The canonical encoding of one endpoint is the
// sequence of netstrings (decimal length, ':', bytes, ',') of: the instance
// id in its 36-character form, address, port in decimal, zone, state,
// weight (shortest decimal that round-trips, strconv 'g' -1), health, "1" or
// "0" for quarantined, the number of capabilities in decimal, then each
// capability. A client recomputes it to detect divergence.
func Checksum(eps []Endpoint) string {
	if !slices.IsSortedFunc(eps, compareEndpoints) {
		eps = slices.Clone(eps)
		slices.SortFunc(eps, compareEndpoints)
	}
	var buf []byte
	return checksumSorted(eps, &buf)
}

func compareEndpoints(a, b Endpoint) int { return bytes.Compare(a.InstanceID[:], b.InstanceID[:]) }

// checksumSorted hashes eps, already in id order, reusing *scratch.
func checksumSorted(eps []Endpoint, scratch *[]byte) string {
	h := sha256.New()
	b := (*scratch)[:0]
	for i := range eps {
		e := &eps[i]
		var id [36]byte
		uuidText(&id, e.InstanceID)
		b = netstring(b, id[:])
		b = netstringS(b, e.Address)
		var num [32]byte
		b = netstring(b, strconv.AppendInt(num[:0], int64(e.Port), 10))
		b = netstringS(b, e.Zone)
		b = netstringS(b, e.State)
		b = netstring(b, strconv.AppendFloat(num[:0], e.Weight, 'g', -1, 64))
		b = netstringS(b, e.Health)
		if e.Quarantined {
			b = netstringS(b, "1")
		} else {
			b = netstringS(b, "0")
		}
		b = netstring(b, strconv.AppendInt(num[:0], int64(len(e.Capabilities)), 10))
		for _, c := range e.Capabilities {
			b = netstringS(b, c)
		}
		if len(b) > 32<<10 {
			h.Write(b)
			b = b[:0]
		}
	}
	h.Write(b)
	*scratch = b[:0]
	var sum [sha256.Size]byte
	return hex.EncodeToString(h.Sum(sum[:0]))
}

// uuidText writes id in its canonical 36-character form without
// allocating (uuid.UUID.String allocates).
func uuidText(dst *[36]byte, id [16]byte) {
	hex.Encode(dst[0:8], id[0:4])
	dst[8] = '-'
	hex.Encode(dst[9:13], id[4:6])
	dst[13] = '-'
	hex.Encode(dst[14:18], id[6:8])
	dst[18] = '-'
	hex.Encode(dst[19:23], id[8:10])
	dst[23] = '-'
	hex.Encode(dst[24:], id[10:])
}

func netstring(b, s []byte) []byte {
	b = strconv.AppendInt(b, int64(len(s)), 10)
	b = append(b, ':')
	b = append(b, s...)
	return append(b, ',')
}

func netstringS(b []byte, s string) []byte {
	b = strconv.AppendInt(b, int64(len(s)), 10)
	b = append(b, ':')
	b = append(b, s...)
	return append(b, ',')
}
