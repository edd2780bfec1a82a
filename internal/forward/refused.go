package forward

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/musterhq/muster/internal/assembler"
)

// A peer may refuse a request whole (400, 413, 415, 422): nothing of it is
// applied. Before this, the sender dropped such a batch at once, and one
// rolling upgrade (an older replica refusing a member a newer one added)
// cost every item forwarded to it. A refusal is now treated by what can
// help:
//
//   - a member the peer does not know (400 unknown-field, from a release
//     that decodes strictly): the member is left out of what is sent to
//     that peer from then on (for StripFor), and the batch is sent again.
//     An older replica then gets what it understands, as a tolerant one
//     would have taken it. At most maxStripped members per peer.
//   - a body too large for the peer (413, or 422 on the count of items):
//     the peer's batches are halved (for StripFor) and the items sent
//     again.
//   - anything else it cannot understand (400, 422): the batch is sent again
//     in halves, and only the half the peer refuses is split further, so a
//     few items it cannot take cost those items, not the batch. When both
//     halves are refused the fault is everywhere and splitting stops: a
//     batch of n items costs at most 1 + 2·log2(n) requests (27 for 5,000).
//   - a wrong content type (415) or a body this replica cannot encode:
//     nothing sent again can help.
//
// What is finally refused is counted in
// muster_evidence_forward_refused_total{peer,reason} (and in the dropped
// total, as before), logged, and raises the evidence_forward_refused alarm
// for RefusedAlarmFor after the last refusal.

// Refusal reasons, the label of muster_evidence_forward_refused_total for
// batches a peer refused whole. They differ from the evaluator's refusal
// codes of single items (stale, not_assigned, invalid, ...), which may
// share the counter.
const (
	ReasonUnknownField = "unknown_field"
	ReasonMalformed    = "malformed"
	ReasonTooLarge     = "too_large"
	ReasonMediaType    = "unsupported_media_type"
	ReasonInvalid      = "invalid_request"
	ReasonUnsendable   = "unsendable"
)

// AlarmForwardRefused is raised, per peer, while a peer refused forwarded
// evidence within RefusedAlarmFor: those items were dropped, and that
// peer's evaluator decides without them.
const AlarmForwardRefused = "evidence_forward_refused"

// Defaults of the refusal handling.
const (
	DefaultRefusedAlarmFor = 10 * time.Minute
	DefaultStripFor        = 10 * time.Minute
)

// maxStripped bounds the members left out for one peer: beyond it a peer
// refusing one more is treated as refusing the batch.
const maxStripped = 16

// problemBase is muster's problem type prefix (server.ProblemBase; this
// package does not import server).
const problemBase = "https://muster.dev/problems/"

// refusedError is a peer's refusal of a whole request: its status, the
// problem's type (without problemBase) and first field, and detail.
type refusedError struct {
	status int
	slug   string
	field  string
	// fields are every field the problem names.
	fields []string
	detail string
}

func (e *refusedError) Error() string {
	s := "refused by the peer: " + strconv.Itoa(e.status) + " " + http.StatusText(e.status)
	if e.slug != "" {
		s += " (" + e.slug + ")"
	}
	if e.detail != "" {
		s += ": " + e.detail
	}
	return s
}

func (e *refusedError) Is(target error) bool { return target == errRefused }

// reason is e's label in muster_evidence_forward_refused_total.
func (e *refusedError) reason() string {
	switch {
	case e.status == 0:
		return ReasonUnsendable
	case e.status == http.StatusRequestEntityTooLarge:
		return ReasonTooLarge
	case e.status == http.StatusUnsupportedMediaType:
		return ReasonMediaType
	case e.status == http.StatusUnprocessableEntity:
		return ReasonInvalid
	case e.slug == "unknown-field":
		return ReasonUnknownField
	}
	return ReasonMalformed
}

// tooLarge: the peer's limits are below this batch (a body over its byte
// limit, or more items than it takes in one body), so smaller batches help.
func (e *refusedError) tooLarge() bool {
	if e.status == http.StatusRequestEntityTooLarge {
		return true
	}
	return e.status == http.StatusUnprocessableEntity && len(e.fields) > 0 &&
		!slices.ContainsFunc(e.fields, func(f string) bool { return strings.TrimPrefix(f, "/") != "batches" })
}

// splittable: another part of the batch may be taken where the whole was
// not.
func (e *refusedError) splittable() bool {
	return e.status == http.StatusBadRequest || e.status == http.StatusUnprocessableEntity
}

// refusal reads a peer's whole-request refusal from its answer: a
// problem+json body when it is one (decoded leniently: a newer peer may
// add members), else its status and text.
func refusal(status int, body []byte) *refusedError {
	e := &refusedError{status: status, detail: string(bytes.TrimSpace(body))}
	var p struct {
		Type   string `json:"type"`
		Detail string `json:"detail"`
		Errors []struct {
			Field string `json:"field"`
		} `json:"errors"`
	}
	if json.Unmarshal(body, &p) == nil && strings.HasPrefix(p.Type, problemBase) {
		e.slug, e.detail = strings.TrimPrefix(p.Type, problemBase), p.Detail
		for _, f := range p.Errors {
			e.fields = append(e.fields, f.Field)
		}
		if len(e.fields) > 0 {
			e.field = e.fields[0]
		}
	}
	return e
}

// peerLimits is what a sender learned of an older peer: the members it
// does not know and how many items it takes at once. Guarded by
// Forwarder.mu.
type peerLimits struct {
	// stripped maps a member's pattern (memberPath) to when it was found
	// unknown; forgotten after StripFor, so a peer upgraded meanwhile is
	// sent the member again.
	stripped map[string]time.Time
	// maxItems, when positive, bounds the items of one request to it,
	// from maxItemsAt for StripFor (then full batches are tried again).
	maxItems   int
	maxItemsAt time.Time
}

// refusals is one peer's episode of refusals, for the alarm.
type refusals struct {
	since, last time.Time
	items       int
	reason      string
	detail      string
}

// batchLimit is how many items one request to p may carry.
func (f *Forwarder) batchLimit(p *peerQueue) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	if p.limits.maxItems > 0 && f.cfg.Now().Sub(p.limits.maxItemsAt) <= f.cfg.StripFor {
		return min(p.limits.maxItems, f.cfg.MaxBatch)
	}
	p.limits.maxItems = 0
	return f.cfg.MaxBatch
}

// strippedFor is the members left out of what is sent to p now.
func (f *Forwarder) strippedFor(p *peerQueue) [][]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(p.limits.stripped) == 0 {
		return nil
	}
	now := f.cfg.Now()
	var out [][]string
	for m, at := range p.limits.stripped {
		if now.Sub(at) > f.cfg.StripFor {
			delete(p.limits.stripped, m)
			continue
		}
		out = append(out, strings.Split(m, "/")[1:])
	}
	return out
}

// salvage handles batch, which p refused whole with rf (see the comment
// at the top of this file). It returns what should be sent again (at
// once when err is nil; after the usual backoff when err, a failure to
// reach p meanwhile, is not).
func (f *Forwarder) salvage(ctx context.Context, p *peerQueue, batch []item, rf *refusedError) (again []item, err error) {
	switch {
	case rf.reason() == ReasonUnknownField && f.learnUnknown(p, rf.field):
		return batch, nil
	case rf.tooLarge() && len(batch) > 1:
		f.mu.Lock()
		p.limits.maxItems, p.limits.maxItemsAt = max(1, len(batch)/2), f.cfg.Now()
		f.mu.Unlock()
		f.log.Warn("peer refused a batch as too large; sending it smaller batches", "peer", p.id, "items", len(batch), "now", max(1, len(batch)/2), "err", rf)
		return batch, nil
	case rf.splittable():
		return f.isolate(ctx, p, batch, rf)
	}
	f.refuse(p, batch, rf)
	return nil, nil
}

// learnUnknown notes that p does not know the member at pointer, and
// reports whether leaving it out may help (it was not already left out,
// and p's list is not full).
func (f *Forwarder) learnUnknown(p *peerQueue, pointer string) bool {
	m := memberPath(pointer)
	if m == "" {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := p.limits.stripped[m]; ok || len(p.limits.stripped) >= maxStripped {
		return false
	}
	if p.limits.stripped == nil {
		p.limits.stripped = map[string]time.Time{}
	}
	p.limits.stripped[m] = f.cfg.Now()
	f.log.Warn("peer does not know a member of forwarded evidence (an older release?); it is left out of what that peer is sent",
		"peer", p.id, "member", m, "for", f.cfg.StripFor)
	return true
}

// isolate sends batch, refused whole with rf, again in halves, and splits
// further only a half refused beside one taken (see the top of the file).
func (f *Forwarder) isolate(ctx context.Context, p *peerQueue, batch []item, rf *refusedError) ([]item, error) {
	if len(batch) == 1 || !rf.splittable() {
		f.refuse(p, batch, rf)
		return nil, nil
	}
	half := len(batch) / 2
	parts := [2][]item{batch[:half], batch[half:]}
	var refused [2]*refusedError
	for i, part := range parts {
		n, err := f.deliver(ctx, p, part)
		if err == nil {
			parts[i] = nil
			continue
		}
		if !errors.As(err, &refused[i]) {
			// p is away: what was not taken is sent again later, the
			// half refused included (it will be looked at again).
			again := slices.Clone(part[n:])
			if i == 0 {
				return append(again, parts[1]...), err
			}
			if refused[0] != nil {
				again = append(slices.Clone(parts[0]), again...)
			}
			return again, err
		}
		parts[i] = part[n:]
	}
	switch {
	case refused[0] != nil && refused[1] != nil:
		f.refuse(p, parts[0], refused[0])
		f.refuse(p, parts[1], refused[1])
		return nil, nil
	case refused[0] != nil:
		return f.isolate(ctx, p, parts[0], refused[0])
	case refused[1] != nil:
		return f.isolate(ctx, p, parts[1], refused[1])
	}
	return nil, nil
}

// refuse drops items p refused: counted by reason, logged, and on the
// alarm.
func (f *Forwarder) refuse(p *peerQueue, items []item, rf *refusedError) {
	if len(items) == 0 {
		return
	}
	reason := rf.reason()
	p.dropped.Add(float64(len(items)))
	f.met.refused.WithLabelValues(p.id, reason).Add(float64(len(items)))
	now := f.cfg.Now()
	f.mu.Lock()
	ep := f.refusals[p.id]
	if ep == nil || now.Sub(ep.last) > f.cfg.RefusedAlarmFor {
		ep = &refusals{since: now}
		f.refusals[p.id] = ep
	}
	ep.last, ep.reason, ep.detail = now, reason, rf.Error()
	ep.items += len(items)
	f.mu.Unlock()
	f.log.Error("peer refused forwarded evidence; dropped", "peer", p.id, "items", len(items), "reason", reason, "err", rf)
}

// Alarms returns an AlarmForwardRefused for each peer that refused
// forwarded requests whole within RefusedAlarmFor, and an
// AlarmEvidenceRefused for each that refused items of requests it took
// (itemAlarms).
func (f *Forwarder) Alarms() []assembler.Alarm {
	out := f.itemAlarms()
	now := f.cfg.Now()
	f.mu.Lock()
	defer f.mu.Unlock()
	out = append(out, f.dropAlarms(now)...)
	for id, ep := range f.refusals {
		if now.Sub(ep.last) > f.cfg.RefusedAlarmFor {
			delete(f.refusals, id)
			continue
		}
		out = append(out, assembler.Alarm{Kind: AlarmForwardRefused, Since: ep.since, Detail: fmt.Sprintf(
			"replica %s refused %d evidence items forwarded to it since %s (last %s ago, %s: %s); they were dropped, and its evaluator decides without them: does it run another release? (docs/replicas.md, \"Rolling upgrade\")",
			id, ep.items, ep.since.UTC().Format(time.RFC3339), now.Sub(ep.last).Truncate(time.Second), ep.reason, ep.detail)})
	}
	slices.SortFunc(out, func(a, b assembler.Alarm) int { return strings.Compare(a.Detail, b.Detail) })
	return out
}

// memberPath is a JSON pointer's pattern: its array indexes as "*", so
// "/batches/0/reports/12/age" names that member of every report. "" for
// a pointer to no object member (the root, or an array element).
func memberPath(pointer string) string {
	if !strings.HasPrefix(pointer, "/") {
		return ""
	}
	parts := strings.Split(pointer, "/")[1:]
	for i, s := range parts {
		if s != "" && strings.Trim(s, "0123456789") == "" {
			parts[i] = "*"
		}
	}
	if last := parts[len(parts)-1]; last == "*" || last == "" {
		return ""
	}
	return "/" + strings.Join(parts, "/")
}

// strip removes from body (JSON) the members at the paths given (split
// memberPath patterns, "*" any array element; each segment still in
// JSON-pointer escaping). It runs only for a peer that refused a member,
// so the extra decode and encode cost nothing otherwise.
func strip(body []byte, paths [][]string) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	for _, path := range paths {
		stripPath(v, path)
	}
	return json.Marshal(v)
}

func stripPath(v any, path []string) {
	if len(path) == 0 {
		return
	}
	seg := unescapePointer(path[0])
	switch x := v.(type) {
	case map[string]any:
		if len(path) == 1 {
			delete(x, seg)
			return
		}
		stripPath(x[seg], path[1:])
	case []any:
		if path[0] != "*" {
			return
		}
		for _, e := range x {
			stripPath(e, path[1:])
		}
	}
}

func unescapePointer(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~1", "/"), "~0", "~")
}
