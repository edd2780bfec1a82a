package assembler

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"math/bits"
	"strconv"
)

// Checksum returns the checksum of an endpoint set: the sum, modulo 2^256,
// of the SHA-256 digests of the endpoints' canonical encodings, each digest
// read as a big-endian unsigned integer, written as 64 hex digits. A sum
// does not depend on order, and a client holding the previous sum updates
// it for a delta by subtracting the digests of the endpoints the delta
// replaces or removes and adding those of its upserts, in time proportional
// to the delta rather than the view. The empty set's checksum is 64 zeros.
//
// The canonical encoding of one endpoint is the sequence of netstrings
// (decimal length, ':', bytes, ',') of: the instance id in its
// 36-character form, address, port in decimal, zone, state, weight
// (shortest decimal that round-trips, strconv 'g' -1), health, "1" or "0"
// for quarantined, the number of capabilities in decimal, then each
// capability.
//
// The checksum detects divergence between muster's view and a client's
// copy (a lost or misapplied delta, a bug). On its own it is a public
// function of the endpoints: anyone who can put bytes in front of a
// replica or a client can compute it for endpoints of their choosing. So
// the owner also signs each view with the region's key over its service,
// version, this checksum and its zones (sign.go), and replicas, and
// clients given the region's public keys, believe only a view whose
// signature verifies over the checksum they recomputed. Instance ids are
// unique within a view, so no digest is ever counted twice.
func Checksum(eps []Endpoint) string {
	var buf []byte
	return checksumSorted(eps, &buf)
}

func compareEndpoints(a, b Endpoint) int { return bytes.Compare(a.InstanceID[:], b.InstanceID[:]) }

// checksumSorted hashes eps (in any order; the name is historical),
// reusing *scratch.
func checksumSorted(eps []Endpoint, scratch *[]byte) string {
	var acc sum256
	b := (*scratch)[:0]
	for i := range eps {
		b = appendCanonical(b[:0], &eps[i])
		acc.add(sha256.Sum256(b))
	}
	*scratch = b[:0]
	return acc.String()
}

// appendCanonical appends e's canonical encoding to b.
func appendCanonical(b []byte, e *Endpoint) []byte {
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
	return b
}

// sum256 is a 256-bit unsigned integer, most significant limb first.
type sum256 [4]uint64

func (s *sum256) add(d [sha256.Size]byte) {
	var c uint64
	for i := 3; i >= 0; i-- {
		s[i], c = bits.Add64(s[i], binary.BigEndian.Uint64(d[i*8:]), c)
	}
}

func (s *sum256) String() string {
	var b [32]byte
	for i := range s {
		binary.BigEndian.PutUint64(b[i*8:], s[i])
	}
	return hex.EncodeToString(b[:])
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
