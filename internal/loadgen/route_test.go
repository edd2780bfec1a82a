package loadgen

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/musterhq/muster/internal/app/apptest"
)

// TestEvidenceOwnersFollowTheReplicas: loadgen's --route owner reads
// two real replicas' GET /v1/evidence/routes (450 services, asked in
// pages of 200) and sends each service to the URL of the replica its
// shard is dealt to, learning which URL is which replica from the
// replicas themselves. A token the replicas refuse is an error.
func TestEvidenceOwnersFollowTheReplicas(t *testing.T) {
	t.Parallel()
	a, b := apptest.Pair(t)
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
