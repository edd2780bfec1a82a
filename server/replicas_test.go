package server_test

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/ownership"
	"github.com/musterhq/muster/internal/relay"
)

// TestReplicasAPI (issue 27): GET /v1/replicas shows the region's shard
// ownership from memory: the one replica holds all 64 shards, none is
// unowned; a workload may not read it.
func TestReplicasAPI(t *testing.T) {
	t.Parallel()
	s := apptest.New(t, apptest.Options{})
	if err := s.App.Ownership.RunOnce(t.Context()); err != nil {
		t.Fatal(err)
	}
	r := s.Do(t, "GET", "/v1/replicas", s.Token(t, apptest.Admin), "", "")
	if r.Status != http.StatusOK {
		t.Fatalf("GET /v1/replicas: %d %s", r.Status, r.Body)
	}
	got := apptest.Decode[ownership.RegionStatus](t, r)
	if got.Self != "apptest" || got.Shards != 64 || len(got.Replicas) != 1 || got.Replicas[0].Shards != 64 || len(got.Unowned) != 0 || len(got.Owned) != 64 {
		t.Fatalf("region %+v", got)
	}
	// Alone in its region, it follows no peer.
	if relay := apptest.Decode[struct {
		Relay []relay.PeerStatus `json:"relay"`
	}](t, r).Relay; relay == nil || len(relay) != 0 {
		t.Fatalf("relay %v, want an empty list", relay)
	}
	if left := apptest.Decode[struct {
		EpochsLeft *uint64 `json:"epochs_left"`
	}](t, r).EpochsLeft; left == nil || *left != s.App.Publisher.EpochsLeft() || *left == 0 {
		t.Fatalf("epochs_left %v, want the publisher's %d", left, s.App.Publisher.EpochsLeft())
	}
	if r := s.Do(t, "GET", "/v1/replicas", s.Token(t, apptest.Web), "", ""); r.Status != http.StatusForbidden {
		t.Fatalf("a workload reads the replicas: %d", r.Status)
	}
}

// TestRegionsAPI (issue 29): GET /v1/regions names this region and the
// peer regions followed (none here: an empty list); operators of any
// role and tools read it, a workload may not.
func TestRegionsAPI(t *testing.T) {
	t.Parallel()
	s := apptest.New(t, apptest.Options{})
	r := s.Do(t, "GET", "/v1/regions", s.Token(t, apptest.Viewer), "", "")
	if r.Status != http.StatusOK {
		t.Fatalf("GET /v1/regions: %d %s", r.Status, r.Body)
	}
	got := apptest.Decode[struct {
		Region string            `json:"region"`
		Peers  []json.RawMessage `json:"peers"`
	}](t, r)
	if got.Region == "" || got.Peers == nil || len(got.Peers) != 0 {
		t.Fatalf("regions %s", r.Body)
	}
	if r := s.Do(t, "GET", "/v1/regions", s.Token(t, apptest.Web), "", ""); r.Status != http.StatusForbidden {
		t.Fatalf("a workload reads the regions: %d", r.Status)
	}
	if r := s.Do(t, "GET", "/v1/regions/b/views/billing", s.Token(t, apptest.Viewer), "", ""); r.Status != http.StatusNotFound {
		t.Fatalf("a view of a region not followed: %d %s", r.Status, r.Body)
	}
}
