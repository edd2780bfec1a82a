package federation

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/musterhq/muster/internal/stream"
	"github.com/musterhq/muster/resolver"
)

// TestRemoteViewsReachTheSink (issue 29): a view the aggregate takes is
// handed to the sink as a frame of its remote series: the peer's version,
// its region on the view and on every endpoint, the aggregate's age, and
// the peer's checksum, which still verifies. A version not newer is not
// handed over again; a sink installed late gets what is held.
func TestRemoteViewsReachTheSink(t *testing.T) {
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	a := NewAggregate([]PeerConfig{{Name: "b", URLs: []string{"http://b"}}}, 30*time.Second, func() time.Time { return now })
	a.update("b", func(ps *PeerStatus) { ps.LastContact = now.Add(-2 * time.Second) })
	eps := []resolver.Endpoint{ep("00000000-0000-0000-0000-000000000001", "10.2.0.1", 80), ep("00000000-0000-0000-0000-000000000002", "10.2.0.2", 80)}
	v := view("billing", 12, eps...)
	v.Checksum = resolver.Checksum(eps)
	if !a.put(RemoteView{Region: "b", View: v, ReceivedAt: now}) {
		t.Fatal("put refused a first view")
	}
	var got []*stream.Frame
	a.SetSink(func(fs []*stream.Frame) { got = append(got, fs...) })
	if len(got) != 1 {
		t.Fatalf("a late sink got %d frames, want the one held", len(got))
	}
	f := got[0]
	if f.Service != "billing@b" || f.Version != 12 || f.Kind != stream.KindView {
		t.Fatalf("frame %+v", f)
	}
	var served resolver.View
	if err := json.Unmarshal(f.JSON, &served); err != nil {
		t.Fatal(err)
	}
	if served.Service != "billing@b" || served.Region != "b" || served.AgeSeconds != 2 || served.Version != 12 {
		t.Fatalf("served view %+v", served)
	}
	for _, e := range served.Endpoints {
		if e.Region != "b" {
			t.Fatalf("an endpoint without its region: %+v", e)
		}
	}
	if resolver.Checksum(served.Endpoints) != v.Checksum || served.Checksum != v.Checksum {
		t.Fatalf("the peer's checksum does not verify on the served view")
	}
	// The aggregate's own copy is the peer's view, unchanged.
	if held, _, _ := a.View("b", "billing"); held.View.Endpoints[0].Region != "" || held.View.Service != "billing" {
		t.Fatalf("Encode changed the held copy: %+v", held.View)
	}
	if a.put(RemoteView{Region: "b", View: v, ReceivedAt: now}) {
		t.Fatal("put took the same version again")
	}
}

// TestPeerGrantsFailStatic: the callers a peer granted are what it last
// said; a service whose grants could not be read keeps them; a service
// the peer no longer lists has none.
func TestPeerGrantsFailStatic(t *testing.T) {
	a := NewAggregate([]PeerConfig{{Name: "b", URLs: []string{"http://b"}}}, 30*time.Second, nil)
	closed := func(ch <-chan struct{}) bool {
		select {
		case <-ch:
			return true
		default:
			return false
		}
	}
	rev := a.Revoked()
	a.setGrants("b", map[string][]string{"billing": {"checkout"}, "web": {"api"}}, []string{"billing", "web"})
	if !a.Granted("b", "billing", "checkout") || a.Granted("b", "billing", "api") || a.Granted("c", "billing", "checkout") {
		t.Fatal("grants as read")
	}
	if closed(rev) {
		t.Fatal("Revoked closed by grants given")
	}
	// billing's grants could not be read this time: they stand; web's
	// were withdrawn: Revoked is closed.
	a.setGrants("b", map[string][]string{"web": {}}, []string{"billing", "web"})
	if !a.Granted("b", "billing", "checkout") || a.Granted("b", "web", "api") {
		t.Fatal("a failed read revoked, or a revocation was not taken")
	}
	if !closed(rev) {
		t.Fatal("Revoked not closed by a grant withdrawn")
	}
	rev = a.Revoked()
	a.setGrants("b", map[string][]string{"web": {}}, []string{"billing", "web"})
	if closed(rev) {
		t.Fatal("Revoked closed by a read that changed nothing")
	}
	// billing is gone from the peer: no grants.
	a.setGrants("b", map[string][]string{"web": {}}, []string{"web"})
	if a.Granted("b", "billing", "checkout") || !closed(rev) {
		t.Fatal("a service the peer no longer lists is still granted, or Revoked not closed")
	}
}
