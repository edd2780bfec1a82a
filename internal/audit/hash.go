package audit

import (
	"crypto/sha256"
	"strconv"
	"time"
)

// Row is one audit_events row as stored, every column the hash covers plus
// the hash itself: what Verify and an export work from.
type Row struct {
	Seq        int64     `json:"seq"`
	At         time.Time `json:"at"`
	ActorKind  string    `json:"actor_kind"`
	Actor      string    `json:"actor"`
	Action     string    `json:"action"`
	TargetKind string    `json:"target_kind"`
	Target     string    `json:"target"`
	Outcome    string    `json:"outcome"`
	Reason     string    `json:"reason"`
	// Before and After are PostgreSQL's own text of the jsonb values
	// (jsonb_out), nil for SQL NULL: the hash covers that text, so it
	// must be carried byte for byte, never re-encoded.
	Before   []byte `json:"before"`
	After    []byte `json:"after"`
	PrevHash []byte `json:"prev_hash"`
	Hash     []byte `json:"hash"`
}

// Canonical returns the bytes a row's hash is the SHA-256 of (doc.go
// describes the form): the text PostgreSQL gives jsonb_build_array(seq,
// epoch microseconds, actor_kind, actor, action, target_kind, target,
// outcome, reason, before, after, hex(prev_hash)), rebuilt here from the
// columns so that verification never asks the database how to hash.
func (r Row) Canonical() []byte {
	b := make([]byte, 0, 256+len(r.Before)+len(r.After)+len(r.Reason))
	b = append(b, '[')
	b = strconv.AppendInt(b, r.Seq, 10)
	b = append(b, ", "...)
	b = strconv.AppendInt(b, r.At.UnixMicro(), 10)
	for _, s := range []string{r.ActorKind, r.Actor, r.Action, r.TargetKind, r.Target, r.Outcome, r.Reason} {
		b = append(b, ", "...)
		b = appendJSONString(b, s)
	}
	for _, j := range [][]byte{r.Before, r.After} {
		b = append(b, ", "...)
		if j == nil {
			b = append(b, "null"...)
		} else {
			b = append(b, j...)
		}
	}
	b = append(b, ", "...)
	b = append(b, '"')
	b = appendHex(b, r.PrevHash)
	b = append(b, '"', ']')
	return b
}

// Digest is the hash the row should carry: SHA-256 of Canonical.
func (r Row) Digest() []byte {
	d := sha256.Sum256(r.Canonical())
	return d[:]
}

// appendJSONString quotes s the way PostgreSQL's escape_json does: the two
// mandatory escapes, the five short control escapes, \u00xx (lower-case
// hex) for the other control characters, and every other character,
// non-ASCII included, as it is. A text column holds valid UTF-8 in a UTF8
// database, so s is taken as such; invalid bytes are copied too, and would
// simply make the digest disagree with the stored hash.
func appendJSONString(b []byte, s string) []byte {
	const hexdigits = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch c {
		case '"':
			b = append(b, '\\', '"')
		case '\\':
			b = append(b, '\\', '\\')
		case '\b':
			b = append(b, '\\', 'b')
		case '\f':
			b = append(b, '\\', 'f')
		case '\n':
			b = append(b, '\\', 'n')
		case '\r':
			b = append(b, '\\', 'r')
		case '\t':
			b = append(b, '\\', 't')
		default:
			if c < ' ' {
				b = append(b, '\\', 'u', '0', '0', hexdigits[c>>4], hexdigits[c&0xf])
			} else {
				b = append(b, c)
			}
		}
	}
	return append(b, '"')
}

func appendHex(b, src []byte) []byte {
	const hexdigits = "0123456789abcdef"
	for _, c := range src {
		b = append(b, hexdigits[c>>4], hexdigits[c&0xf])
	}
	return b
}
