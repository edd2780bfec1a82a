package forward_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/musterhq/muster/internal/evaluator"
	"github.com/musterhq/muster/internal/forward"
	"github.com/musterhq/muster/internal/wait"
)

// TestToLocalClock: forwarded times move by the receiver's clock minus
// the signing time, either way; a report without a time keeps none.
func TestToLocalClock(t *testing.T) {
	recv := time.Date(2026, 12, 3, 9, 0, 0, 0, time.UTC)
	for _, senderAhead := range []time.Duration{30 * time.Second, -30 * time.Second, 0} {
		signed := recv.Add(senderAhead)
		// Taken 2 s before signing, on the sender's clock.
		at := signed.Add(-2 * time.Second)
		reports := []evaluator.Report{{At: &at}, {}}
		forward.ToLocalClock(reports, signed, recv)
		if want := recv.Add(-2 * time.Second); reports[0].At == nil || !reports[0].At.Equal(want) {
			t.Errorf("sender %s ahead: at %v, want %v on the receiver's clock", senderAhead, reports[0].At, want)
		}
		if reports[1].At != nil {
			t.Errorf("a report without a time got %v", reports[1].At)
		}
		if !at.Equal(signed.Add(-2 * time.Second)) {
			t.Errorf("the caller's time was changed in place: %v", at)
		}
	}
}

// refusingPeer answers POST /v1/peer/reports as a replica does, refusing
// the items whose ids are in codes with that code: a retryable code only
// for its first retryFor attempts, then the item is applied.
type refusingPeer struct {
	*httptest.Server
	mu       sync.Mutex
	retryFor int
	codes    map[uuid.UUID]string
	always   map[uuid.UUID]bool // refused whatever the code
	seen     map[uuid.UUID]int  // attempts per id
	applied  map[uuid.UUID]bool
	status   int  // when set, every body is refused with it
	oldStyle bool // answer counts only, as the release before
}

func newRefusingPeer(t *testing.T) *refusingPeer {
	p := &refusingPeer{codes: map[uuid.UUID]string{}, always: map[uuid.UUID]bool{}, seen: map[uuid.UUID]int{}, applied: map[uuid.UUID]bool{}, retryFor: 2}
	p.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// A peer of the release before: JSON only. The sender falls
		// back to JSON for it.
		if r.Header.Get("Content-Type") == forward.BinaryContentType {
			http.Error(w, "unsupported media type", http.StatusUnsupportedMediaType)
			return
		}
		body, _ := io.ReadAll(r.Body)
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.status != 0 {
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(p.status)
			_, _ = w.Write([]byte(`{"type":"malformed-json","detail":"json: unknown field \"age\""}`))
			return
		}
		var b forward.Body
		if err := json.Unmarshal(body, &b); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		res := forward.Result{Refusals: []forward.Refusal{}}
		i := 0
		for _, bt := range b.Batches {
			for _, rep := range bt.Reports {
				p.seen[rep.InstanceID]++
				code, refuse := p.codes[rep.InstanceID]
				if refuse && evaluator.Retryable(code) && !p.always[rep.InstanceID] && p.seen[rep.InstanceID] > p.retryFor {
					refuse = false
				}
				if refuse {
					res.Refused++
					res.Refusals = append(res.Refusals, forward.Refusal{Index: i, Code: code})
				} else {
					res.Accepted++
					p.applied[rep.InstanceID] = true
				}
				i++
			}
		}
		if p.oldStyle {
			res.Refusals = nil
		}
		_ = json.NewEncoder(w).Encode(res)
	}))
	t.Cleanup(p.Close)
	return p
}

func (p *refusingPeer) attempts(id uuid.UUID) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.seen[id]
}

func (p *refusingPeer) appliedCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.applied)
}

func refusedMetric(t *testing.T, h *harness, peer, reason string) float64 {
	t.Helper()
	mfs, err := h.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "muster_evidence_forward_refused_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, lp := range m.GetLabel() {
				l[lp.GetName()] = lp.GetValue()
			}
			if l["peer"] == peer && l["reason"] == reason {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// TestRefusedItemsAreRetriedOrCounted: of a batch forwarded to a peer,
// the items it applies are counted delivered; those it refuses for a
// reason a retry may fix (its copy of an assignment lags) are sent again
// and delivered once it takes them, or counted refused when it still
// refuses them after the retries; those it refuses for good (future) are
// counted refused by peer and reason, never delivered, and raise
// evidence_refused with the figures while they occur.
func TestRefusedItemsAreRetriedOrCounted(t *testing.T) {
	t.Parallel()
	k := newKey(t)
	b := newRefusingPeer(t)
	h := newHarness(t, k, func(c *forward.Config) { c.RetryAfter = 5 * time.Millisecond },
		forward.Peer{ID: "b", Address: b.URL})
	wait.For(t, 10*time.Second, "the forwarder to know peer b", func() bool { return hasSeries(h, "b") })

	reports := items(10)
	// 0-1: refused twice for a lagging assignment, then taken; 2: refused
	// as not granted however often it is sent; 3-5: refused for good;
	// 6-9: taken.
	b.mu.Lock()
	b.codes[reports[0].InstanceID], b.codes[reports[1].InstanceID] = "not_assigned", "not_assigned"
	b.codes[reports[2].InstanceID], b.always[reports[2].InstanceID] = "not_granted", true
	for _, r := range reports[3:6] {
		b.codes[r.InstanceID] = "future"
	}
	b.retryFor = 2
	b.mu.Unlock()
	h.f.Offer(prober, reports, nil)

	wait.For(t, 10*time.Second, "the retried items settled", func() bool {
		return h.metric(t, "muster_evidence_forwarded_total", "b") >= 6 && refusedMetric(t, h, "b", "not_granted") >= 1
	})
	if n := h.metric(t, "muster_evidence_forwarded_total", "b"); n != 6 {
		t.Errorf("delivered %v, want 6 (4 taken at once, 2 after retries)", n)
	}
	if n, want := b.attempts(reports[2].InstanceID), 1+forward.DefaultRetryRefused; n != want {
		t.Errorf("an item refused as not granted every time was sent %d times, want %d", n, want)
	}
	if n := refusedMetric(t, h, "b", "not_granted"); n != 1 {
		t.Errorf("refused{not_granted} = %v, want 1", n)
	}
	if b.appliedCount() != 6 {
		t.Errorf("the peer applied %d items, want 6", b.appliedCount())
	}
	for _, r := range reports[:2] {
		if n := b.attempts(r.InstanceID); n != 3 {
			t.Errorf("a lagging item was sent %d times, want 3 (refused twice, then taken)", n)
		}
	}
	if n := refusedMetric(t, h, "b", "future"); n != 3 {
		t.Errorf("refused{future} = %v, want 3", n)
	}
	for _, r := range reports[3:6] {
		if n := b.attempts(r.InstanceID); n != 1 {
			t.Errorf("an item refused for good was sent %d times, want once", n)
		}
	}
	alarms := h.f.Alarms()
	if len(alarms) != 1 || alarms[0].Kind != forward.AlarmEvidenceRefused ||
		!strings.Contains(alarms[0].Detail, "replica b refused 4 ") || !strings.Contains(alarms[0].Detail, "future 3, not_granted 1") {
		t.Fatalf("alarms %+v, want one evidence_refused naming b, future 3 and not_granted 1", alarms)
	}
	// The alarm ends a while after the last refusal.
	h.setNow(h.now.Add(forward.DefaultRefusedAlarm + time.Second))
	if alarms := h.f.Alarms(); len(alarms) != 0 {
		t.Errorf("alarms a minute after the last refusal: %+v", alarms)
	}
	if h.f.Queued("b") != 0 {
		t.Errorf("%d items still queued", h.f.Queued("b"))
	}
}

// TestWholeBodyRefusalsAreCounted: a peer of an older release that
// refuses a whole body (400: an unknown field), and one that answers
// only how many it refused: neither is counted delivered; both are
// counted refused by reason and raise evidence_refused.
func TestWholeBodyRefusalsAreCounted(t *testing.T) {
	t.Parallel()
	k := newKey(t)
	strict, counts := newRefusingPeer(t), newRefusingPeer(t)
	strict.status = http.StatusBadRequest
	counts.oldStyle = true
	h := newHarness(t, k, nil, forward.Peer{ID: "strict", Address: strict.URL}, forward.Peer{ID: "counts", Address: counts.URL})
	wait.For(t, 10*time.Second, "the forwarder to know both peers", func() bool { return hasSeries(h, "strict") && hasSeries(h, "counts") })
	reports := items(5)
	counts.mu.Lock()
	counts.codes[reports[0].InstanceID] = "stale"
	counts.mu.Unlock()
	h.f.Offer(prober, reports, nil)
	// The body refused whole is looked at in halves (refused.go) and,
	// refused every time, dropped and counted under the peer's reason.
	strictRefused := func() float64 {
		n := 0.0
		for _, r := range []string{forward.ReasonUnknownField, forward.ReasonMalformed, forward.ReasonInvalid} {
			n += refusedMetric(t, h, "strict", r)
		}
		return n
	}
	wait.For(t, 10*time.Second, "both answers counted", func() bool {
		return strictRefused() == 5 && refusedMetric(t, h, "counts", "unreported") == 1
	})
	if n := h.metric(t, "muster_evidence_forwarded_total", "strict"); n != 0 {
		t.Errorf("delivered to the peer that refused the body: %v", n)
	}
	wait.For(t, 10*time.Second, "4 delivered to the peer that counts", func() bool { return h.metric(t, "muster_evidence_forwarded_total", "counts") == 4 })
	kinds := map[string]string{}
	for _, a := range h.f.Alarms() {
		kinds[a.Kind] += a.Detail
	}
	if len(kinds) != 2 || kinds[forward.AlarmForwardRefused] == "" || kinds[forward.AlarmEvidenceRefused] == "" {
		t.Fatalf("alarms %v, want one for the body refused whole and one for the item refused", kinds)
	}
	if !strings.Contains(kinds[forward.AlarmForwardRefused], "unknown field") {
		t.Errorf("the alarm does not quote the peer's answer: %s", kinds[forward.AlarmForwardRefused])
	}
}
