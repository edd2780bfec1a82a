package forward_test

import (
	"encoding/json"
	"errors"
	"io"
	"math/bits"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/musterhq/muster/internal/forward"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/wait"
)

// judgingPeer is a peer's POST /v1/peer/reports whose answer judge
// decides from the body: 200 with the reports taken, or a refusal of the
// whole request as problem+json (status, type slug, first field).
type judgingPeer struct {
	*httptest.Server
	requests atomic.Int64

	mu    sync.Mutex
	taken []json.RawMessage // each report as it arrived
}

type verdict struct {
	status      int
	slug, field string
}

func newJudgingPeer(t *testing.T, judge func(body []byte) verdict) *judgingPeer {
	p := &judgingPeer{}
	p.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// A peer of the release before: JSON only. The sender falls
		// back to JSON for it.
		if r.Header.Get("Content-Type") == forward.BinaryContentType {
			http.Error(w, "unsupported media type", http.StatusUnsupportedMediaType)
			return
		}
		p.requests.Add(1)
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if v := judge(body); v.status != http.StatusOK {
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(v.status)
			pb := map[string]any{"type": "https://muster.dev/problems/" + v.slug, "title": http.StatusText(v.status), "status": v.status,
				"detail": "refused by the test's peer", "instance": r.URL.Path}
			if v.field != "" {
				pb["errors"] = []map[string]string{{"field": v.field, "message": "refused"}}
			}
			_ = json.NewEncoder(w).Encode(pb)
			return
		}
		var b struct {
			Batches []struct {
				Reports []json.RawMessage `json:"reports"`
			} `json:"batches"`
		}
		if err := json.Unmarshal(body, &b); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		p.mu.Lock()
		n := 0
		for _, g := range b.Batches {
			p.taken = append(p.taken, g.Reports...)
			n += len(g.Reports)
		}
		p.mu.Unlock()
		_ = json.NewEncoder(w).Encode(forward.Result{Accepted: n})
	}))
	t.Cleanup(p.Close)
	return p
}

func (p *judgingPeer) reports() []json.RawMessage {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]json.RawMessage(nil), p.taken...)
}

// refusedTotal is muster_evidence_forward_refused_total{peer, reason}.
func refusedTotal(t *testing.T, h *harness, peer, reason string) float64 {
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
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["peer"] == peer && labels["reason"] == reason {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// olderBody is what a replica of an older release knows of POST
// /v1/peer/reports: its actors have no cluster and its reports no
// dependency. Like the release before this one, it decodes strictly and
// refuses a body with a member it does not know, naming it.
type olderBody struct {
	Batches []struct {
		Actor struct {
			Issuer  string `json:"issuer,omitempty"`
			Home    bool   `json:"home,omitempty"`
			Subject string `json:"subject"`
			Kind    string `json:"kind"`
			Service string `json:"service,omitempty"`
			Team    string `json:"team,omitempty"`
			Role    string `json:"role,omitempty"`
			Pod     string `json:"pod,omitempty"`
		} `json:"actor"`
		Reports []struct {
			InstanceID uuid.UUID  `json:"instance_id"`
			Class      string     `json:"class"`
			Outcome    string     `json:"outcome,omitempty"`
			At         *time.Time `json:"at,omitempty"`
			Successes  *uint32    `json:"successes,omitempty"`
			Failures   *uint32    `json:"failures,omitempty"`
		} `json:"reports"`
	} `json:"batches"`
}

func strictOlderPeer(body []byte) verdict {
	var b olderBody
	err := jsonv2.Unmarshal(body, &b, jsonv2.RejectUnknownMembers(true))
	var sem *jsonv2.SemanticError
	switch {
	case err == nil:
		return verdict{status: http.StatusOK}
	case errors.As(err, &sem) && errors.Is(err, jsonv2.ErrUnknownName):
		return verdict{http.StatusBadRequest, "unknown-field", string(sem.JSONPointer)}
	}
	return verdict{http.StatusBadRequest, "malformed-json", ""}
}

// TestAnOlderPeerIsSentWhatItKnows: a peer of an older release refuses a
// body whole for a member it does not know (400 unknown-field, naming it).
// The forwarder leaves that member out of what it sends that peer and
// sends the batch again, so every item arrives, without the members the
// peer does not know; nothing is refused or dropped, and it takes one
// refused request per member, not one per batch.
func TestAnOlderPeerIsSentWhatItKnows(t *testing.T) {
	t.Parallel()
	b := newJudgingPeer(t, strictOlderPeer)
	h := newHarness(t, newKey(t), nil, forward.Peer{ID: "b", Address: b.URL})
	wait.For(t, 10*time.Second, "the forwarder to know peer b", func() bool { return hasSeries(h, "b") })

	pod := identity.Principal{Kind: identity.KindWorkload, Service: "web", Subject: "web", Pod: "web-1", Cluster: "eu-1"}
	reports := items(40)
	for i := range reports {
		if i%2 == 0 {
			reports[i].Dependency = "db"
		}
	}
	for i := 0; i < len(reports); i += 10 {
		h.f.Offer(pod, reports[i:i+10], nil)
		wait.For(t, 10*time.Second, "the batch delivered", func() bool { return h.f.Queued("b") == 0 })
	}
	got := b.reports()
	if len(got) != len(reports) {
		t.Fatalf("the older peer took %d of %d reports", len(got), len(reports))
	}
	for _, r := range got {
		if strings.Contains(string(r), "dependency") {
			t.Fatalf("a report sent with a member the peer does not know: %s", r)
		}
	}
	if n := h.metric(t, "muster_evidence_forwarded_total", "b"); n != float64(len(reports)) {
		t.Errorf("forwarded %v, want %d", n, len(reports))
	}
	if d, r := h.metric(t, "muster_evidence_forward_dropped_total", "b"), refusedTotal(t, h, "b", forward.ReasonUnknownField); d != 0 || r != 0 {
		t.Errorf("dropped %v, refused %v; want neither", d, r)
	}
	// Four batches, two members to learn (actor's cluster, reports'
	// dependency): two refused requests in all, then one per batch.
	if n := b.requests.Load(); n != 4+2 {
		t.Errorf("%d requests for 4 batches, want 6 (one refusal per unknown member)", n)
	}
	if a := h.f.Alarms(); len(a) != 0 {
		t.Errorf("alarms %+v, want none: nothing was dropped", a)
	}
}

// TestARefusedBatchCostsOnlyWhatThePeerRefuses: a peer refuses a whole
// body (422) when it holds one item it cannot take. The forwarder sends
// the batch again in halves and splits only the half refused, so only that
// item is dropped, in at most 1 + 2·log2(n) requests; it is counted by
// peer and reason, and the evidence_forward_refused alarm is raised for
// RefusedAlarmFor. A peer that refuses everything costs three requests per
// batch, every item counted.
func TestARefusedBatchCostsOnlyWhatThePeerRefuses(t *testing.T) {
	t.Parallel()
	poison := uuid.Must(uuid.NewV7())
	var refuseAll atomic.Bool
	b := newJudgingPeer(t, func(body []byte) verdict {
		if refuseAll.Load() {
			return verdict{http.StatusBadRequest, "malformed-json", ""}
		}
		if strings.Contains(string(body), poison.String()) {
			return verdict{http.StatusUnprocessableEntity, "validation", "/batches/0/actor"}
		}
		return verdict{status: http.StatusOK}
	})
	var now atomic.Int64
	now.Store(time.Date(2026, 12, 3, 9, 0, 0, 0, time.UTC).UnixNano())
	h := newHarness(t, newKey(t), func(c *forward.Config) {
		c.BatchWait = time.Hour // one batch of all that is offered, by MaxBatch
		c.MaxBatch = 100
		c.Now = func() time.Time { return time.Unix(0, now.Load()) }
	}, forward.Peer{ID: "b", Address: b.URL})
	wait.For(t, 10*time.Second, "the forwarder to know peer b", func() bool { return hasSeries(h, "b") })

	reports := items(100)
	reports[37].InstanceID = poison
	h.f.Offer(prober, reports, nil)
	wait.For(t, 10*time.Second, "the batch settled", func() bool {
		return h.f.Queued("b") == 0 && len(b.reports())+int(refusedTotal(t, h, "b", forward.ReasonInvalid)) == 100
	})
	if n := len(b.reports()); n != 99 {
		t.Fatalf("the peer took %d reports, want the 99 it can", n)
	}
	if n := refusedTotal(t, h, "b", forward.ReasonInvalid); n != 1 {
		t.Errorf("refused{reason=invalid_request} = %v, want 1", n)
	}
	if n := h.metric(t, "muster_evidence_forward_dropped_total", "b"); n != 1 {
		t.Errorf("dropped %v, want 1", n)
	}
	if n, most := b.requests.Load(), int64(1+2*bits.Len(100)); n > most {
		t.Errorf("%d requests to isolate one item of 100, want at most %d", n, most)
	}
	alarms := h.f.Alarms()
	if len(alarms) != 1 || alarms[0].Kind != forward.AlarmForwardRefused || !strings.Contains(alarms[0].Detail, "replica b refused 1 ") {
		t.Fatalf("alarms %+v, want one %s for b", alarms, forward.AlarmForwardRefused)
	}

	// Everything refused: both halves are, so splitting stops.
	refuseAll.Store(true)
	before := b.requests.Load()
	h.f.Offer(prober, items(100), nil)
	wait.For(t, 10*time.Second, "the refused batch counted", func() bool {
		return refusedTotal(t, h, "b", forward.ReasonMalformed) == 100
	})
	if n := b.requests.Load() - before; n != 3 {
		t.Errorf("%d requests for a batch refused whatever its part, want 3", n)
	}
	if n := h.metric(t, "muster_evidence_forward_dropped_total", "b"); n != 101 {
		t.Errorf("dropped %v, want 101", n)
	}
	if a := h.f.Alarms(); len(a) != 1 || !strings.Contains(a[0].Detail, "refused 101 ") {
		t.Errorf("alarms %+v, want one counting 101 items", a)
	}
	now.Add(int64(forward.DefaultRefusedAlarmFor + time.Second))
	if a := h.f.Alarms(); len(a) != 0 {
		t.Errorf("alarms %+v after RefusedAlarmFor without a refusal, want none", a)
	}
}

// TestAPeerWithSmallerLimitsIsSentSmallerBatches: a peer whose body limit
// is below this replica's batches (413) is sent them again in smaller
// batches, each item delivered once and nothing refused.
func TestAPeerWithSmallerLimitsIsSentSmallerBatches(t *testing.T) {
	t.Parallel()
	b := newJudgingPeer(t, func(body []byte) verdict {
		if strings.Count(string(body), "instance_id") > 30 {
			return verdict{http.StatusRequestEntityTooLarge, "body-too-large", ""}
		}
		return verdict{status: http.StatusOK}
	})
	h := newHarness(t, newKey(t), func(c *forward.Config) { c.BatchWait = time.Hour; c.MaxBatch = 100 }, forward.Peer{ID: "b", Address: b.URL})
	wait.For(t, 10*time.Second, "the forwarder to know peer b", func() bool { return hasSeries(h, "b") })
	reports := items(300)
	h.f.Offer(prober, reports, nil)
	wait.For(t, 10*time.Second, "every report delivered", func() bool { return len(b.reports()) == len(reports) })
	seen := map[string]bool{}
	for _, r := range b.reports() {
		seen[string(r)] = true
	}
	if len(seen) != len(reports) {
		t.Errorf("%d distinct reports of %d delivered", len(seen), len(reports))
	}
	if n := h.metric(t, "muster_evidence_forward_dropped_total", "b"); n != 0 {
		t.Errorf("dropped %v, want 0", n)
	}
	if n := testutil.CollectAndCount(h.reg, "muster_evidence_forward_refused_total"); n != 0 {
		t.Errorf("%d refusal series, want none", n)
	}
}
