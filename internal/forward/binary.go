package forward

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/google/uuid"

	"github.com/musterhq/muster/internal/evaluator"
)

// BinaryContentType is the compact form of a forwarded body, which a
// replica sends a peer that takes it (every peer of this release; one of
// the release before answers 415, and is then sent JSON). Forwarding is
// the one request a replica makes per batch of samples it did not keep,
// so its encoding is most of the cost of spreading evidence over
// replicas: JSON spends about a microsecond per report each way, this
// form a few dozen nanoseconds.
//
// The layout, integers as unsigned varints unless said otherwise:
//
//	"MEV1"
//	batches
//	per batch: length and bytes of the actor as JSON (once per batch:
//	  rare and small), reports
//	per report: the instance id (16 bytes), a flags byte, then what the
//	  flags say is there: the class and outcome when not one of the
//	  known ones (length and bytes), at (Unix nanoseconds, zig-zag
//	  varint), successes, failures, dependency (length and bytes)
//
// The flags byte: bits 0-1 the class (probe, self, passive; 3: spelled
// out), bits 2-4 the outcome (none, success, failure, hard_failure,
// unobservable; 7: spelled out), bit 5 at, bit 6 successes and failures,
// bit 7 dependency. A receiver refuses a body it cannot read whole, as it
// refuses malformed JSON: nothing of it is applied.
const BinaryContentType = "application/x-muster-evidence"

var binaryMagic = []byte("MEV1")

var (
	classCodes   = []string{"probe", "self", "passive"}
	outcomeCodes = []string{"", "success", "failure", "hard_failure", "unobservable"}
)

const (
	classSpelled   = 3
	outcomeSpelled = 7
	flagAt         = 1 << 5
	flagCounts     = 1 << 6
	flagDependency = 1 << 7
)

func codeOf(codes []string, s string) (byte, bool) {
	for i, c := range codes {
		if c == s {
			return byte(i), true
		}
	}
	return 0, false
}

// appendString appends s with its length.
func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// encodeBinary is encode in the compact form.
func encodeBinary(items []item) ([]byte, error) {
	// Batches are runs of one actor: count them first.
	runs := 0
	for i := range items {
		if i == 0 || items[i-1].o.actor != items[i].o.actor && *items[i-1].o.actor != *items[i].o.actor {
			runs++
		}
	}
	b := make([]byte, 0, 16+len(items)*24)
	b = append(b, binaryMagic...)
	b = binary.AppendUvarint(b, uint64(runs))
	for len(items) > 0 {
		n := 1
		for n < len(items) && (items[n].o.actor == items[0].o.actor || *items[n].o.actor == *items[0].o.actor) {
			n++
		}
		actor, err := json.Marshal(items[0].o.actor)
		if err != nil {
			return nil, err
		}
		b = binary.AppendUvarint(b, uint64(len(actor)))
		b = append(b, actor...)
		b = binary.AppendUvarint(b, uint64(n))
		for i := range items[:n] {
			if it := &items[i]; it.compact {
				b = append(b, it.id[:]...)
				b = append(b, it.flags)
				b = binary.AppendVarint(b, it.at)
				continue
			}
			r := items[i].report()
			b = appendReport(b, &r)
		}
		items = items[n:]
	}
	return b, nil
}

func appendReport(b []byte, r *evaluator.Report) []byte {
	b = append(b, r.InstanceID[:]...)
	class, knownClass := codeOf(classCodes, r.Class)
	if !knownClass {
		class = classSpelled
	}
	outcome, knownOutcome := codeOf(outcomeCodes, r.Outcome)
	if !knownOutcome {
		outcome = outcomeSpelled
	}
	flags := class | outcome<<2
	if r.At != nil {
		flags |= flagAt
	}
	if r.Successes != nil || r.Failures != nil {
		flags |= flagCounts
	}
	if r.Dependency != "" {
		flags |= flagDependency
	}
	b = append(b, flags)
	if !knownClass {
		b = appendString(b, r.Class)
	}
	if !knownOutcome {
		b = appendString(b, r.Outcome)
	}
	if r.At != nil {
		b = binary.AppendVarint(b, r.At.UnixNano())
	}
	if flags&flagCounts != 0 {
		// Present-ness of each travels as value+1 (0: absent).
		b = binary.AppendUvarint(b, countPlusOne(r.Successes))
		b = binary.AppendUvarint(b, countPlusOne(r.Failures))
	}
	if r.Dependency != "" {
		b = appendString(b, r.Dependency)
	}
	return b
}

func countPlusOne(c *uint32) uint64 {
	if c == nil {
		return 0
	}
	return uint64(*c) + 1
}

// binaryReader reads a compact body; the first error sticks.
type binaryReader struct {
	b   []byte
	err error
}

func (r *binaryReader) fail(format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf(format, args...)
	}
}

func (r *binaryReader) uvarint(what string) uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.fail("%s: not a varint", what)
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *binaryReader) varint(what string) int64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Varint(r.b)
	if n <= 0 {
		r.fail("%s: not a varint", what)
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *binaryReader) bytes(what string, limit int) []byte {
	n := r.uvarint(what + " length")
	if r.err != nil {
		return nil
	}
	if n > uint64(limit) || n > uint64(len(r.b)) {
		r.fail("%s: %d bytes, over the limit of %d or past the end", what, n, limit)
		return nil
	}
	out := r.b[:n]
	r.b = r.b[n:]
	return out
}

func (r *binaryReader) count(what string) *uint32 {
	v := r.uvarint(what)
	switch {
	case r.err != nil || v == 0:
		return nil
	case v-1 > math.MaxUint32:
		r.fail("%s: %d is over 2^32-1", what, v-1)
		return nil
	}
	c := uint32(v - 1)
	return &c
}

// errBinary wraps every reason a compact body is refused.
var errBinary = errors.New("malformed compact evidence body")

// DecodeBinary reads a compact body (BinaryContentType) into its
// batches. It refuses the body whole, wrapping errBinary, for anything it
// cannot read or that is out of bounds: at most maxReports reports in
// all, strings within maxField bytes. Actors are decoded, not checked
// (Actor.Principal checks them).
func DecodeBinary(body []byte, maxReports int) ([]Batch, error) {
	if len(body) < len(binaryMagic) || string(body[:len(binaryMagic)]) != string(binaryMagic) {
		return nil, fmt.Errorf("%w: it does not start with %q", errBinary, binaryMagic)
	}
	r := &binaryReader{b: body[len(binaryMagic):]}
	nb := r.uvarint("batches")
	if r.err == nil && nb > uint64(maxReports) {
		r.fail("%d batches, more than the %d reports a body may hold", nb, maxReports)
	}
	var out []Batch
	total := 0
	for i := uint64(0); r.err == nil && i < nb; i++ {
		var bt Batch
		if raw := r.bytes("actor", 8*maxField); r.err == nil {
			if err := json.Unmarshal(raw, &bt.Actor); err != nil {
				r.fail("batch %d: actor: %v", i, err)
			}
		}
		n := r.uvarint("reports")
		if r.err == nil && n > uint64(maxReports-total) {
			r.fail("batch %d: %d reports, more than the %d a body may hold", i, n, maxReports)
		}
		if r.err != nil {
			break
		}
		total += int(n)
		bt.Reports = make([]evaluator.Report, n)
		// The reports' times, one allocation for the batch.
		ats := make([]time.Time, n)
		for j := range bt.Reports {
			r.report(&bt.Reports[j], &ats[j])
			if r.err != nil {
				break
			}
		}
		out = append(out, bt)
	}
	if r.err == nil && len(r.b) > 0 {
		r.fail("%d bytes after the last batch", len(r.b))
	}
	if r.err != nil {
		return nil, fmt.Errorf("%w: %w", errBinary, r.err)
	}
	return out, nil
}

// report reads one report into rep; its time, when it has one, into at.
func (r *binaryReader) report(rep *evaluator.Report, at *time.Time) {
	if len(r.b) < 17 {
		r.fail("a report cut short")
		return
	}
	rep.InstanceID = uuid.UUID(r.b[:16])
	flags := r.b[16]
	r.b = r.b[17:]
	switch c := flags & 3; c {
	case classSpelled:
		rep.Class = string(r.bytes("class", maxField))
	default:
		rep.Class = classCodes[c]
	}
	switch o := flags >> 2 & 7; {
	case o == outcomeSpelled:
		rep.Outcome = string(r.bytes("outcome", maxField))
	case int(o) < len(outcomeCodes):
		rep.Outcome = outcomeCodes[o]
	default:
		r.fail("outcome code %d", o)
	}
	if flags&flagAt != 0 {
		*at = time.Unix(0, r.varint("at")).UTC()
		rep.At = at
	}
	if flags&flagCounts != 0 {
		rep.Successes = r.count("successes")
		rep.Failures = r.count("failures")
	}
	if flags&flagDependency != 0 {
		rep.Dependency = string(r.bytes("dependency", maxField))
	}
}

// EncodeBinary is b in the compact form (BinaryContentType), for tests
// and tools that speak to a replica as a peer.
func EncodeBinary(b Body) ([]byte, error) {
	var items []item
	for i := range b.Batches {
		items = append(items, newItems(&b.Batches[i].Actor, b.Batches[i].Reports, time.Time{})...)
	}
	return encodeBinary(items)
}
