package server_test

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/musterhq/muster/internal/app"
	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/wait"
	"github.com/musterhq/muster/server"
)

type evidenceRoutes struct {
	Self           string            `json:"self"`
	Owners         map[string]string `json:"owners"`
	RefreshSeconds int               `json:"refresh_seconds"`
}

func getEvidenceRoutes(t *testing.T, s *stack, token string, services ...string) (apptest.Response, evidenceRoutes) {
	t.Helper()
	q := url.Values{"service": services}
	r := s.Do(t, "GET", "/v1/evidence/routes?"+q.Encode(), token, "", "")
	if r.Status != http.StatusOK {
		return r, evidenceRoutes{}
	}
	return r, apptest.Decode[evidenceRoutes](t, r)
}

// TestEvidenceRoutesNameTheOwner: two replicas on one database with the
// shards split between them. Both answer GET /v1/evidence/routes alike,
// each naming itself, and the owners they name are the replicas the
// shards are dealt to. A report sent to a service's owner is evaluated
// there and forwarded nowhere; the same report sent to the other
// replica is forwarded to the owner, as before. Bad questions are
// refused with problem+json.
func TestEvidenceRoutesNameTheOwner(t *testing.T) {
	t.Parallel()
	hold := []string{app.WorkerOwnership}
	a := apptest.New(t, apptest.Options{Replica: "a", Hold: hold})
	b := apptest.New(t, apptest.Options{Replica: "b", Pool: a.Pool, Hold: hold})
	a.Seed(t)
	rounds(t, a, b, a, b, a, b)

	names := []string{"web"}
	for i := range 40 {
		names = append(names, fmt.Sprintf("svc-%d", i))
	}
	// A workload may ask: it is a reporter like any other.
	_, fromA := getEvidenceRoutes(t, a, a.Token(t, webReq), names...)
	_, fromB := getEvidenceRoutes(t, b, b.Token(t, webReq), names...)
	if fromA.Self != "a" || fromB.Self != "b" || fromA.RefreshSeconds < 1 {
		t.Fatalf("self %q and %q (refresh %d), want a and b", fromA.Self, fromB.Self, fromA.RefreshSeconds)
	}
	count := map[string]int{}
	for _, n := range names {
		want, known := a.App.Ownership.Owner(n)
		if !known || fromA.Owners[n] != want || fromB.Owners[n] != want {
			t.Fatalf("%s: a says %q, b says %q, the leases say %q (known %v)", n, fromA.Owners[n], fromB.Owners[n], want, known)
		}
		count[want]++
	}
	if count["a"] == 0 || count["b"] == 0 {
		t.Fatalf("owners %v: the shards are not split", count)
	}

	own, other, otherID := a, b, "b"
	if fromA.Owners["web"] == "b" {
		own, other, otherID = b, a, "a"
	}
	in := registerOnHost(t, own, 9000)
	if err := other.Evaluator.SyncNow(t.Context()); err != nil {
		t.Fatal(err)
	}
	// Each forwarder has a sender for the other replica.
	own.App.Forwarder.RunOnce(t.Context())
	other.App.Forwarder.RunOnce(t.Context())
	ownID := map[string]string{"a": "b", "b": "a"}[otherID]
	if res := postReportsWith(t, other, other.Token(t, webReq), credentialHeader(in.Credential), selfReport(in.ID, "success")); res.Accepted != 1 {
		t.Fatalf("report to the other replica: %+v", res)
	}
	wait.For(t, 10*time.Second, "the report sent to the other replica at the owner", func() bool {
		return labelled(t, own, "muster_samples_forwarded_total", "result", "accepted") == 1
	})
	if n := labelled(t, other, "muster_evidence_forwarded_total", "peer", ownID); n != 1 {
		t.Errorf("the other replica forwarded %v items to the owner, want 1", n)
	}
	if res := postReportsWith(t, own, own.Token(t, webReq), credentialHeader(in.Credential), selfReport(in.ID, "success")); res.Accepted != 1 {
		t.Fatalf("report to the owner: %+v", res)
	}
	// Stopping the owner's forwarder delivers whatever it queued.
	own.App.Forwarder.Stop()
	if n := own.App.Forwarder.Queued(otherID) + int(labelled(t, own, "muster_evidence_forwarded_total", "peer", otherID)+labelled(t, other, "muster_samples_forwarded_total", "result", "accepted")); n != 0 {
		t.Errorf("the owner forwarded (or queued) %d items of its own service", n)
	}

	tok := a.Token(t, webReq)
	for _, tc := range []struct {
		name, query string
	}{
		{"no service", ""},
		{"an empty name", "service="},
		{"not a name", "service=" + url.QueryEscape("web/../x")},
		{"too many", "service=" + strings.Repeat("x&service=", server.MaxEvidenceRouteServices) + "x"},
	} {
		r := a.Do(t, "GET", "/v1/evidence/routes?"+tc.query, tok, "", "")
		if r.Status != http.StatusBadRequest || r.Problem(t).Type == "" {
			t.Errorf("%s: %d %s, want 400 problem+json", tc.name, r.Status, r.Body)
		}
	}
	if r := a.Do(t, "GET", "/v1/evidence/routes?service=web", "", "", ""); r.Status != http.StatusUnauthorized {
		t.Errorf("unauthenticated: %d, want 401", r.Status)
	}
}
