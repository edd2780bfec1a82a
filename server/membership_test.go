package server_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/musterhq/muster/internal/app"
	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/ownership"
	"github.com/musterhq/muster/internal/peer"
	"github.com/musterhq/muster/internal/relay"
	"github.com/musterhq/muster/internal/wait"
)

// rogueReplica is a server of the attacker's choosing posing as a
// replica: it answers the peer stream with a snapshot of web at a version
// far above muster's, its endpoint at 203.0.113.66, and counts every
// request it is sent (and the signature headers of the last).
type rogueReplica struct {
	*httptest.Server
	hits    atomic.Int64
	headers atomic.Pointer[http.Header]
}

func newRogue(t *testing.T) *rogueReplica {
	t.Helper()
	r := &rogueReplica{}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.hits.Add(1)
		h := req.Header.Clone()
		r.headers.Store(&h)
		if req.URL.Path != relay.Path {
			w.WriteHeader(http.StatusOK) // evidence taken, as a sink would
			return
		}
		const version = 1 << 60
		view := fmt.Sprintf(`{"service":"web","version":%d,"endpoints":[{"instance_id":%q,"address":"203.0.113.66","port":443,"zone":"az1","state":"eligible","weight":1,"health":"known"}]}`,
			uint64(version), uuid.New())
		w.Header().Set("Content-Type", "application/x-ndjson")
		fmt.Fprintf(w, `{"kind":"snapshot","service":"web","version":%d,"view":%s,"published_at":%q}`+"\n", uint64(version), view, time.Now().UTC().Format(time.RFC3339Nano))
		fmt.Fprintln(w, `{"kind":"heartbeat"}`)
		w.(http.Flusher).Flush()
		<-req.Context().Done()
	}))
	t.Cleanup(r.Close)
	return r
}

// resolvedAddresses are the endpoint addresses of web as s resolves it.
func resolvedAddresses(t *testing.T, s *stack) (uint64, []string) {
	t.Helper()
	r := s.Do(t, "GET", "/v1/resolve/web", s.Token(t, adminReq), "", "")
	if r.Status != http.StatusOK {
		t.Fatalf("resolve web at %s: %d %s", s.URL, r.Status, r.Body)
	}
	v := apptest.Decode[assembler.View](t, r)
	var out []string
	for _, e := range v.Endpoints {
		out = append(out, e.Address)
	}
	return v.Version, out
}

// leasesNaming counts the shards held by or offered to id.
func leasesNaming(t *testing.T, s *stack, id string) int {
	t.Helper()
	var n int
	if err := s.Pool.QueryRow(t.Context(), `SELECT count(*) FROM shard_leases WHERE owner = $1 OR offered_to = $1`, id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func hasQueueSeries(t *testing.T, s *stack, peerID string) bool {
	t.Helper()
	mfs, err := s.Metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "muster_evidence_forward_queue" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "peer" && l.GetValue() == peerID {
					return true
				}
			}
		}
	}
	return false
}

// TestAHandWrittenReplicaIsNeverFollowed: replicas a and b share one
// database; a owns and publishes web. Someone with write access to the
// database adds a row to table replicas (last_seen a day ahead, ready,
// the address of a rogue server that streams web at a far higher version
// with its endpoint at 203.0.113.66). Neither replica believes it: it is
// not followed (the rogue is sent no request), sent no evidence, dealt,
// offered or released no shard; web keeps resolving to muster's own
// endpoints at muster's version on both; and each replica raises
// replica_unsealed naming the row and lists it under unbelieved in GET
// /v1/replicas. Then b's own sealed row is changed to point at a second
// rogue: a stops believing (and following) b and names the forged row,
// until b's next heartbeat writes it back as it sealed it.
func TestAHandWrittenReplicaIsNeverFollowed(t *testing.T) {
	t.Parallel()
	// b is never ready, so a owns and publishes every service; both
	// ownership workers are stepped by the test.
	b := apptest.New(t, apptest.Options{Replica: "b", Hold: []string{app.WorkerOwnership},
		Ownership: func(c *ownership.Config) { c.Ready = func() bool { return false } }})
	a := apptest.New(t, apptest.Options{Replica: "a", Pool: b.Pool, Hold: []string{app.WorkerOwnership}})
	round := func() {
		t.Helper()
		for _, s := range []*stack{a, b} {
			if err := s.App.Ownership.RunOnce(t.Context()); err != nil {
				t.Fatal(err)
			}
			s.App.Relay.RunOnce(t.Context())
			s.App.Forwarder.RunOnce(t.Context())
		}
	}
	// b, not ready, hands a what it took while nobody was ready.
	wait.For(t, 10*time.Second, "a owning every shard", func() bool {
		round()
		return len(a.App.Ownership.Owned()) == 64
	})
	if err := a.Publisher.Prepare(t.Context()); err != nil {
		t.Fatal(err)
	}
	a.Seed(t)
	if err := b.Authz.RunOnce(t.Context()); err != nil { // b's copy of the services
		t.Fatal(err)
	}
	var ids []string
	for port := 9000; port < 9004; port++ {
		ids = append(ids, registerOnHost(t, a, port).ID.String())
	}
	a.Admit(t, ids...)
	a.Publisher.RunOnce()
	a.Clock.Advance(2 * time.Second)
	a.Publisher.RunOnce()
	muster, ok := a.Publisher.View("web")
	if !ok || len(muster.Endpoints) != 4 {
		t.Fatalf("a publishes web as %+v (%v)", muster, ok)
	}
	round()
	wait.For(t, 10*time.Second, "a and b following each other, b holding a's view of web", func() bool {
		v, ok := b.Hub.View("web")
		return following(a, "b") && following(b, "a") && ok && v.Version == muster.Version
	})

	rogue, rogue2 := newRogue(t), newRogue(t)
	if _, err := a.Pool.Exec(t.Context(), `INSERT INTO replicas (id, started_at, last_seen, address, region, ready)
		VALUES ('rogue', clock_timestamp(), clock_timestamp() + interval '1 day', $1, 'local', true)`, rogue.URL); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		round()
	}
	// Evidence reported to b reaches a, web's owner, and nothing
	// reaches the rogue.
	b.KnowCredentials(a)
	before := labelled(t, b, "muster_evidence_forwarded_total", "peer", "a")
	b.Admit(t, ids[0])
	wait.For(t, 10*time.Second, "a report to b forwarded to a", func() bool {
		return labelled(t, b, "muster_evidence_forwarded_total", "peer", "a") > before
	})
	for _, s := range []*stack{a, b} {
		for _, st := range s.App.Relay.Status() {
			if st.Peer == "rogue" || st.Address == rogue.URL {
				t.Errorf("%s follows the rogue: %+v", s.App.Ownership.ID(), st)
			}
		}
		if hasQueueSeries(t, s, "rogue") {
			t.Errorf("%s forwards evidence to the rogue", s.App.Ownership.ID())
		}
		al, ok := alarmOf(s.Server.Alarms(), ownership.AlarmReplicaUnsealed)
		if !ok || !strings.Contains(al.Detail, `"rogue"`) || !strings.Contains(al.Detail, rogue.URL) {
			t.Errorf("%s's replica_unsealed alarm: %+v (%v), want one naming the row", s.App.Ownership.ID(), al, ok)
		}
		if n := labelled(t, s, "muster_replicas_unbelieved", "reason", "unsealed"); n != 1 {
			t.Errorf("%s: muster_replicas_unbelieved{reason=unsealed} = %v, want 1", s.App.Ownership.ID(), n)
		}
		version, addrs := resolvedAddresses(t, s)
		if version != muster.Version || len(addrs) != 4 || strings.Contains(strings.Join(addrs, ","), "203.0.113.66") {
			t.Errorf("%s resolves web at %d to %v, want muster's version %d and endpoints", s.App.Ownership.ID(), version, addrs, muster.Version)
		}
	}
	if n := leasesNaming(t, a, "rogue"); n != 0 {
		t.Errorf("%d shards held by or offered to the rogue", n)
	}
	if n := rogue.hits.Load(); n != 0 {
		t.Errorf("the rogue was sent %d requests", n)
	}
	r := a.Do(t, "GET", "/v1/replicas", a.Token(t, adminReq), "", "")
	var region ownership.RegionStatus
	if err := json.Unmarshal(r.Body, &region); err != nil || r.Status != http.StatusOK {
		t.Fatalf("GET /v1/replicas: %d %s", r.Status, r.Body)
	}
	if len(region.Unbelieved) != 1 || region.Unbelieved[0].ID != "rogue" || region.Unbelieved[0].Reason != ownership.UnbelievedUnsealed {
		t.Errorf("unbelieved %+v, want the rogue's row, unsealed", region.Unbelieved)
	}
	for _, rep := range region.Replicas {
		if rep.ID == "rogue" || !rep.Sealed {
			t.Errorf("listed replica %+v, want a and b only, sealed", rep)
		}
	}
	if !strings.Contains(string(r.Body), `"sealed":true`) {
		t.Errorf("GET /v1/replicas shows no sealed replica: %s", r.Body)
	}

	// b's sealed row, its address changed by hand: not believed, b no
	// longer followed, the forged row named; nothing reaches rogue2.
	if _, err := a.Pool.Exec(t.Context(), `UPDATE replicas SET address = $1 WHERE id = 'b'`, rogue2.URL); err != nil {
		t.Fatal(err)
	}
	if err := a.App.Ownership.RunOnce(t.Context()); err != nil {
		t.Fatal(err)
	}
	a.App.Relay.RunOnce(t.Context())
	for _, st := range a.App.Relay.Status() {
		if st.Peer == "b" || st.Address == rogue2.URL {
			t.Errorf("a follows the forged row of b: %+v", st)
		}
	}
	var forged bool
	for _, u := range a.App.Ownership.Region().Unbelieved {
		forged = forged || (u.ID == "b" && u.Reason == ownership.UnbelievedBadSeal && u.Address == rogue2.URL)
	}
	al, _ := alarmOf(a.Server.Alarms(), ownership.AlarmReplicaUnsealed)
	if !forged || !strings.Contains(fmt.Sprint(a.Server.Alarms()), rogue2.URL) {
		t.Errorf("the forged row of b: unbelieved %+v, alarms %+v", a.App.Ownership.Region().Unbelieved, al)
	}
	if n := leasesNaming(t, a, "b"); n != 0 {
		t.Errorf("%d shards held by or offered to b", n)
	}

	// b's next heartbeat writes its row back as it sealed it.
	wait.For(t, 10*time.Second, "a following b again", func() bool { round(); return following(a, "b") })
	if n := rogue.hits.Load() + rogue2.hits.Load(); n != 0 {
		t.Errorf("the rogues were sent %d requests", n)
	}
	for _, u := range a.App.Ownership.Region().Unbelieved {
		if u.ID == "b" {
			t.Errorf("b still unbelieved after its heartbeat: %+v", u)
		}
	}
}

// TestUpgradeModeFollowsAnUnsealedReplica: in upgrade mode a replica
// believes an unsealed row (a replica of the release before, which seals
// nothing), follows it with both signature headers (the old one for that
// release), and raises peer_trust_upgrade; in strict mode the same row is
// not followed.
func TestUpgradeModeFollowsAnUnsealedReplica(t *testing.T) {
	t.Parallel()
	old := newRogue(t)
	a := apptest.New(t, apptest.Options{Replica: "a", PeerUpgrade: true, Hold: []string{app.WorkerOwnership}})
	if _, err := a.Pool.Exec(t.Context(), `INSERT INTO replicas (id, started_at, last_seen, address, region, ready)
		VALUES ('old', clock_timestamp(), clock_timestamp(), $1, 'local', false)`, old.URL); err != nil {
		t.Fatal(err)
	}
	if err := a.App.Ownership.RunOnce(t.Context()); err != nil {
		t.Fatal(err)
	}
	a.App.Relay.RunOnce(t.Context())
	wait.For(t, 10*time.Second, "a following the unsealed replica", func() bool { return old.hits.Load() > 0 })
	h := old.headers.Load()
	if s, err := peer.ParseHeader(h.Get(peer.Header)); err != nil || s.Receiver != "old" || h.Get(peer.HeaderV1) == "" {
		t.Errorf("a's request to the old replica: %s %q (%v), %s %q; want both, for old", peer.Header, h.Get(peer.Header), err, peer.HeaderV1, h.Get(peer.HeaderV1))
	}
	if _, ok := alarmOf(a.Server.Alarms(), app.AlarmPeerTrustUpgrade); !ok {
		t.Error("no peer_trust_upgrade alarm in upgrade mode")
	}
	for _, rep := range a.App.Ownership.Region().Replicas {
		if rep.Sealed != (rep.ID == "a") {
			t.Errorf("%s sealed %v", rep.ID, rep.Sealed)
		}
	}

	strict := apptest.New(t, apptest.Options{Replica: "s", Pool: a.Pool, Hold: []string{app.WorkerOwnership}})
	if err := strict.App.Ownership.RunOnce(t.Context()); err != nil {
		t.Fatal(err)
	}
	strict.App.Relay.RunOnce(t.Context())
	for _, st := range strict.App.Relay.Status() {
		if st.Peer == "old" {
			t.Errorf("a strict replica follows the unsealed row: %+v", st)
		}
	}
	if _, ok := alarmOf(strict.Server.Alarms(), app.AlarmPeerTrustUpgrade); ok {
		t.Error("peer_trust_upgrade raised in strict mode")
	}
	if _, ok := alarmOf(strict.Server.Alarms(), ownership.AlarmReplicaUnsealed); !ok {
		t.Error("no replica_unsealed alarm for the old replica in strict mode")
	}
}
