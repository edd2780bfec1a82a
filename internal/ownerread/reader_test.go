package ownerread_test

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/eligibility"
	"github.com/musterhq/muster/internal/evaluator"
	"github.com/musterhq/muster/internal/ownerread"
	"github.com/musterhq/muster/internal/peer"
	"github.com/musterhq/muster/internal/testclock"
)

// fakeEvaluator is this replica's own evaluator state.
type fakeEvaluator struct{ qs []evaluator.QuarantineAlarm }

func (f fakeEvaluator) ServiceEligibility(string) (evaluator.ServiceEligibility, error) {
	return evaluator.ServiceEligibility{}, nil
}
func (f fakeEvaluator) QuarantineAlarms() []evaluator.QuarantineAlarm { return slices.Clone(f.qs) }
func (f fakeEvaluator) AllServiceStats() ([]eligibility.ServiceStats, time.Time, error) {
	return nil, time.Time{}, nil
}

// owners is a fixed reading of the leases.
type owners map[string]string

func (o owners) Owner(service string) (string, bool) { return o[service], true }
func (o owners) Publishes(string) bool               { return false }

func quarantine(service string) evaluator.QuarantineAlarm {
	return evaluator.QuarantineAlarm{InstanceID: uuid.New(), Service: service, Zone: "az1", Reason: "flapping"}
}

// TestQuarantinesMergeHoldAndCache: the merged list takes each service's
// quarantines from the replica the reading names as owner (this one's
// own for its services, the peer's for the peer's, nothing the peer
// sends about a service it does not own), reuses the list within
// CacheFor, leaves a peer that stops answering out and names it, and
// QuarantinesHeld stands in its last answer until HoldFor has passed.
func TestQuarantinesMergeHoldAndCache(t *testing.T) {
	t.Parallel()
	mine, theirs, stray := quarantine("mine"), quarantine("theirs"), quarantine("mine")
	var asked atomic.Int64
	var down atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked.Add(1)
		if r.URL.Path != ownerread.QuarantinesPath || r.Header.Get(peer.Header) == "" {
			http.Error(w, "unexpected "+r.URL.Path, http.StatusBadRequest)
			return
		}
		if down.Load() {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		// The peer also sends one about a service this replica owns (its
		// reading is older): it must not be listed twice.
		_ = json.NewEncoder(w).Encode(ownerread.QuarantineBody([]evaluator.QuarantineAlarm{theirs, stray}))
	}))
	t.Cleanup(srv.Close)
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	clk := testclock.New(time.Now())
	r, err := ownerread.New(ownerread.Config{
		Self: "a", Evaluator: fakeEvaluator{qs: []evaluator.QuarantineAlarm{mine}},
		Ownership: owners{"mine": "a", "theirs": "b"},
		Peers:     func() []ownerread.Peer { return []ownerread.Peer{{ID: "b", Address: srv.URL, Owns: true}} },
		Signer:    peer.Signer{ID: "a", Key: audit.NewKeySigner(key), Now: clk.Now},
		Now:       clk.Now,
	})
	if err != nil {
		t.Fatal(err)
	}
	ids := func(qs []evaluator.QuarantineAlarm) []uuid.UUID {
		var out []uuid.UUID
		for _, q := range qs {
			out = append(out, q.InstanceID)
		}
		return out
	}
	want := []uuid.UUID{mine.InstanceID, theirs.InstanceID}

	qs, unanswered := r.Quarantines(t.Context())
	if !slices.Equal(ids(qs), want) || len(unanswered) != 0 {
		t.Fatalf("quarantines %v, unanswered %v; want %v from both", ids(qs), unanswered, want)
	}
	r.Quarantines(t.Context())
	if n := asked.Load(); n != 1 {
		t.Errorf("the peer was asked %d times within the cache's second, want 1", n)
	}

	down.Store(true)
	clk.Advance(ownerread.DefaultCacheFor)
	qs, unanswered = r.Quarantines(t.Context())
	if !slices.Equal(ids(qs), want[:1]) || !slices.Equal(unanswered, []string{"b"}) {
		t.Errorf("with b down: quarantines %v, unanswered %v; want only this replica's, and b named", ids(qs), unanswered)
	}
	qs, unanswered = r.QuarantinesHeld(t.Context())
	if !slices.Equal(ids(qs), want) || len(unanswered) != 0 {
		t.Errorf("held with b down: quarantines %v, unanswered %v; want b's last answer stood in", ids(qs), unanswered)
	}
	clk.Advance(ownerread.DefaultHoldFor)
	qs, unanswered = r.QuarantinesHeld(t.Context())
	if !slices.Equal(ids(qs), want[:1]) || !slices.Equal(unanswered, []string{"b"}) {
		t.Errorf("held past HoldFor: quarantines %v, unanswered %v; want b's left out and named", ids(qs), unanswered)
	}
}
