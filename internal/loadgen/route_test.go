package loadgen

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/musterhq/muster/internal/app"
	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/identity"
)

// TestEvidenceOwnersFollowTheReplicas: loadgen's --route owner reads
// two real replicas' GET /v1/evidence/routes (450 services, asked in
// pages of 200) and sends each service to the URL of the replica its
// shard is dealt to, learning which URL is which replica from the
// replicas themselves. A token the replicas refuse is an error.
func TestEvidenceOwnersFollowTheReplicas(t *testing.T) {
	t.Parallel()
	hold := []string{app.WorkerOwnership}
	a := apptest.New(t, apptest.Options{Replica: "a", Hold: hold})
	// b trusts a's issuer, as the replicas of one region trust one.
	b := apptest.New(t, apptest.Options{Replica: "b", Pool: a.Pool, Hold: hold,
		Issuers: []identity.IssuerConfig{{URL: a.Issuer.URL(), Audience: "muster"}}})
	for _, s := range []*apptest.Stack{a, b, a, b, a, b} {
		if err := s.App.Ownership.RunOnce(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	services := make([]lgService, 450)
	for i := range services {
		services[i].name = fmt.Sprintf("svc-%d", i)
	}
	targets := []string{b.URL, a.URL}
	owners, err := evidenceOwners(t.Context(), http.DefaultClient, targets, a.Token(t, apptest.Admin), services)
	if err != nil {
		t.Fatal(err)
	}
	count := [2]int{}
	for _, s := range services {
		want, _ := a.App.Ownership.Owner(s.name)
		i, ok := owners[s.name]
		if !ok || targets[i] != map[string]string{"a": a.URL, "b": b.URL}[want] {
			t.Fatalf("%s sent to target %d (%v), its owner is %q", s.name, i, ok, want)
		}
		count[i]++
	}
	if count[0] == 0 || count[1] == 0 {
		t.Fatalf("services per target %v: the shards are not split", count)
	}
	if _, err := evidenceOwners(t.Context(), http.DefaultClient, targets[:1], "not-a-token", services); err == nil {
		t.Fatal("a refused question read no error")
	}
}
