package server_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"io"
	"net"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/musterhq/muster/internal/app"
	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/eligibility"
	"github.com/musterhq/muster/internal/evaluator"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/ownerread"
	"github.com/musterhq/muster/internal/peer"
	"github.com/musterhq/muster/server"
)

// TestReadsAnsweredByTheOwner: two replicas on one database, the shards
// split between them, so one owns web (and alone evaluates its
// evidence) and the other does not. A hard failure reported to the
// other replica is forwarded to the owner, and the other's GET
// /v1/services/web/eligibility answers what the owner's does; after the
// owner alone is fed flapping probes, the other's answer shows the
// owner's quarantine, which its own evaluator does not hold, and its
// /v1/alarms lists it. With the owner killed before its leases
// move, the other answers 503 owner-unavailable naming it (not
// "unknown"), and its /v1/alarms says it is incomplete and whose part is
// missing.
func TestReadsAnsweredByTheOwner(t *testing.T) {
	t.Parallel()
	kills := map[string]*killable{}
	var mu sync.Mutex
	listener := func(id string) func(net.Listener) (net.Listener, error) {
		return func(ln net.Listener) (net.Listener, error) {
			k := &killable{Listener: ln}
			mu.Lock()
			kills[id] = k
			mu.Unlock()
			return k, nil
		}
	}
	hold := []string{app.WorkerOwnership}
	a := apptest.New(t, apptest.Options{Replica: "a", Listener: listener("a"), Hold: hold})
	b := apptest.New(t, apptest.Options{Replica: "b", Pool: a.Pool, Listener: listener("b"), Hold: hold})
	a.Seed(t)
	rounds(t, a, b, a, b, a, b)

	own, other, ownID, otherID := a, b, "a", "b"
	if id, _ := a.App.Ownership.Owner("web"); id == "b" {
		own, other, ownID, otherID = b, a, "b", "a"
	}
	if id, known := own.App.Ownership.Owner("web"); !known || id != ownID {
		t.Fatalf("%s's reading: web owned by %q (known %v), want itself", ownID, id, known)
	}
	if id, known := other.App.Ownership.Owner("web"); !known || id != ownID {
		t.Fatalf("%s's reading: web owned by %q (known %v), want %s", otherID, id, known, ownID)
	}

	var ids []uuid.UUID
	var admit []string
	creds := map[uuid.UUID]string{}
	for port := 9100; port < 9108; port++ {
		in := registerOnHost(t, own, port)
		ids = append(ids, in.ID)
		admit = append(admit, in.ID.String())
		creds[in.ID] = in.Credential
	}
	own.Admit(t, admit...)
	if err := other.Evaluator.SyncNow(t.Context()); err != nil {
		t.Fatal(err)
	}

	// A hard failure reported to the other replica reaches the owner.
	failed := ids[0]
	if res := postReportsWith(t, other, other.Token(t, webReq), credentialHeader(creds[failed]), selfReport(failed, "hard_failure")); res.Accepted != 1 {
		t.Fatalf("report to %s: %+v", otherID, res)
	}
	other.App.Forwarder.RunOnce(t.Context())
	waitState(t, own, failed, "ineligible")

	// The other replica answers what the owner answers, not what its own
	// evaluator holds.
	ownView := eligibilityOf(t, own)
	otherView := eligibilityOf(t, other)
	if !reflect.DeepEqual(ownView, otherView) {
		t.Errorf("%s answers\n%+v\nthe owner %s answers\n%+v", otherID, otherView, ownID, ownView)
	}
	if n := labelled(t, other, "muster_owner_reads_total", "result", "ok"); n < 1 {
		t.Errorf("%s asked its owner %v times, want at least once", otherID, n)
	}

	// The UI overview's counts of web are the owner's too.
	ownStats, _, err := own.Evaluator.AllServiceStats()
	if err != nil {
		t.Fatal(err)
	}
	stats, _, unanswered, err := other.App.OwnerReads.Stats(t.Context())
	if err != nil || len(unanswered) != 0 {
		t.Fatalf("%s's stats: unanswered %v, %v", otherID, unanswered, err)
	}
	if got, want := statsOf(stats, "web"), statsOf(ownStats, "web"); got == nil || want == nil || !reflect.DeepEqual(*got, *want) {
		t.Errorf("%s's counts of web %+v, the owner's %+v", otherID, got, want)
	}

	// A contract preview replays on the owner, whichever replica is asked.
	ownPreview := previewOf(t, own, http.StatusOK)
	if otherPreview := previewOf(t, other, http.StatusOK); otherPreview != ownPreview {
		t.Errorf("%s's preview\n%s\nthe owner's\n%s", otherID, otherPreview, ownPreview)
	}
	if n := labelledBoth(t, other, "muster_owner_reads_total", "kind", "preview", "result", "ok"); n != 1 {
		t.Errorf("%s asked the owner for %v previews, want 1", otherID, n)
	}

	// A quarantine the owner holds is listed by both.
	if r := own.JSON(t, "PUT", "/v1/probers/prober-az1/assignments", own.Token(t, adminReq), `{"services":["web"]}`); r.Status != http.StatusOK {
		t.Fatalf("assign the prober: %d %s", r.Status, r.Body)
	}
	if err := own.Evaluator.SyncNow(t.Context()); err != nil {
		t.Fatal(err)
	}
	flapped := ids[1]
	flapOnOwner(t, own, other, flapped)
	rounds(t, a, b) // the tenures renewed on the clocks just moved
	// The probes went to the owner's evaluator alone (not through the
	// forwarder), so only the owner knows of the quarantine: the other
	// replica's answer can only be the owner's.
	if local, err := other.Evaluator.ServiceEligibility("web"); err == nil {
		for _, v := range local.Instances {
			if v.InstanceID == flapped && v.QuarantineUntil != nil {
				t.Fatalf("%s's own evaluator knows the quarantine (%+v): the test shows nothing", otherID, v)
			}
		}
	}
	ownView, otherView = eligibilityOf(t, own), eligibilityOf(t, other)
	if !reflect.DeepEqual(ownView, otherView) {
		t.Errorf("after the quarantine %s answers\n%+v\nthe owner %s answers\n%+v", otherID, otherView, ownID, ownView)
	}
	if !quarantinedIn(otherView, flapped) {
		t.Errorf("%s's answer shows no quarantine of %s: %+v", otherID, flapped, otherView)
	}
	for _, s := range []*stack{own, other} {
		s.Clock.Advance(2 * time.Second) // past the lists' cache
		al := alarmListOf(t, s)
		if al.Incomplete {
			t.Errorf("%s: alarms incomplete with both replicas up: %+v", s.URL, al)
		}
		if !hasQuarantine(al.Alarms, flapped) {
			t.Errorf("%s lists no quarantine of %s: %+v", s.URL, flapped, al.Alarms)
		}
	}

	// The owner is killed before its leases move: the other replica
	// says who holds web's verdicts and to retry, and makes none up.
	mu.Lock()
	kills[ownID].kill()
	mu.Unlock()
	r := other.Do(t, "GET", "/v1/services/web/eligibility", other.Token(t, adminReq), "", "")
	if r.Status != http.StatusServiceUnavailable {
		t.Fatalf("eligibility with the owner down: %d %s, want 503", r.Status, r.Body)
	}
	if ct := r.Header.Get("Content-Type"); ct != "application/problem+json" {
		t.Errorf("Content-Type %q, want application/problem+json", ct)
	}
	if ra := r.Header.Get("Retry-After"); ra == "" {
		t.Error("no Retry-After")
	}
	p := r.Problem(t)
	if !strings.HasSuffix(p.Type, "owner-unavailable") || !strings.Contains(p.Detail, "replica "+ownID+" owns service web") {
		t.Errorf("problem %+v, want owner-unavailable naming %s", p, ownID)
	}
	if strings.Contains(string(r.Body), `"unknown"`) {
		t.Errorf("the 503 carries verdicts: %s", r.Body)
	}
	if body := previewOf(t, other, http.StatusServiceUnavailable); !strings.Contains(body, "owner-unavailable") || !strings.Contains(body, "replica "+ownID+" owns service web") {
		t.Errorf("preview with the owner down: %s", body)
	}
	other.Clock.Advance(2 * time.Second)
	al := alarmListOf(t, other)
	if !al.Incomplete {
		t.Errorf("alarms complete with the owner down: %+v", al)
	}
	if hasQuarantine(al.Alarms, flapped) {
		t.Errorf("the quarantine of the owner that is down is listed: %+v", al.Alarms)
	}
	if u, ok := alarmOf(al.Alarms, server.AlarmOwnerUnreachable); !ok || !strings.Contains(u.Detail, "replica "+ownID+" ") {
		t.Errorf("owner_unreachable %+v (listed %v), want it naming %s", u, ok, ownID)
	}
	if stats, _, unanswered, err := other.App.OwnerReads.Stats(t.Context()); err != nil || !reflect.DeepEqual(unanswered, []string{ownID}) || statsOf(stats, "web") != nil {
		t.Errorf("%s's stats with the owner down: web %+v, unanswered %v (%v); want web left out and %s named", otherID, statsOf(stats, "web"), unanswered, err, ownID)
	}
	if n := labelled(t, other, "muster_owner_reads_incomplete_total", "kind", "quarantines"); n < 1 {
		t.Errorf("muster_owner_reads_incomplete_total{kind=quarantines} %v, want at least 1", n)
	}
}

// TestPeerReadsRefuseStrangers: the owner's read endpoints answer only a
// request signed with the region's key by a live replica of the region:
// unsigned, signed with another key, or signed by a replica that is not
// live, they are refused and reveal nothing.
func TestPeerReadsRefuseStrangers(t *testing.T) {
	t.Parallel()
	a := apptest.New(t, apptest.Options{Replica: "a", Hold: []string{app.WorkerOwnership}})
	a.Seed(t)
	if err := a.App.Ownership.RunOnce(t.Context()); err != nil {
		t.Fatal(err)
	}
	_, other, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		signer *peer.Signer
		want   int
	}{
		{"unsigned", nil, http.StatusUnauthorized},
		{"another key", &peer.Signer{ID: "b", Key: audit.NewKeySigner(other)}, http.StatusUnauthorized},
		{"not live", &peer.Signer{ID: "c", Key: apptest.SealKey()}, http.StatusForbidden},
		{"itself, live", &peer.Signer{ID: "a", Key: apptest.SealKey()}, http.StatusOK},
	} {
		for _, path := range []string{ownerread.EligibilityPath + "web", ownerread.QuarantinesPath, ownerread.StatsPath} {
			req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, a.URL+path, nil)
			if err != nil {
				t.Fatal(err)
			}
			if c.signer != nil {
				s := *c.signer
				s.Now = a.Clock.Now
				if err := s.Sign(t.Context(), req, "a", nil); err != nil {
					t.Fatal(err)
				}
			}
			res, err := a.Client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode != c.want {
				t.Errorf("%s %s: %d %s, want %d", c.name, path, res.StatusCode, body, c.want)
			}
			if c.want != http.StatusOK && (res.Header.Get("Content-Type") != "application/problem+json" ||
				strings.Contains(string(body), `"instances"`) || strings.Contains(string(body), `"stats"`) || strings.Contains(string(body), `"quarantines"`)) {
				t.Errorf("%s %s: refused with %s %s", c.name, path, res.Header.Get("Content-Type"), body)
			}
		}
	}
}

// rounds runs one ownership round on each stack in turn.
func rounds(t *testing.T, stacks ...*stack) {
	t.Helper()
	for _, s := range stacks {
		if err := s.App.Ownership.RunOnce(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
}

// previewOf previews web's contract in force as the proposed one on s,
// and returns the body, which must come with status want.
func previewOf(t *testing.T, s *stack, want int) string {
	t.Helper()
	r := s.JSON(t, "POST", "/v1/services/web/contract/preview", s.Token(t, adminReq), `{}`)
	if r.Status != want {
		t.Fatalf("preview on %s: %d %s, want %d", s.URL, r.Status, r.Body, want)
	}
	return string(r.Body)
}

// labelledBoth reads the counter of name with both labels.
func labelledBoth(t *testing.T, s *stack, name, l1, v1, l2, v2 string) float64 {
	t.Helper()
	mfs, err := s.Metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			got := map[string]string{}
			for _, lp := range m.GetLabel() {
				got[lp.GetName()] = lp.GetValue()
			}
			if got[l1] == v1 && got[l2] == v2 {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// eligibilityOf reads web's eligibility from s.
func eligibilityOf(t *testing.T, s *stack) evaluator.ServiceEligibility {
	t.Helper()
	r := s.Do(t, "GET", "/v1/services/web/eligibility", s.Token(t, adminReq), "", "")
	if r.Status != http.StatusOK {
		t.Fatalf("GET eligibility from %s: %d %s", s.URL, r.Status, r.Body)
	}
	return apptest.Decode[evaluator.ServiceEligibility](t, r)
}

type alarmListBody struct {
	Alarms     []assembler.Alarm `json:"alarms"`
	Incomplete bool              `json:"incomplete"`
}

// alarmListOf reads GET /v1/alarms from s.
func alarmListOf(t *testing.T, s *stack) alarmListBody {
	t.Helper()
	r := s.Do(t, "GET", "/v1/alarms", s.Token(t, adminReq), "", "")
	if r.Status != http.StatusOK {
		t.Fatalf("GET /v1/alarms from %s: %d %s", s.URL, r.Status, r.Body)
	}
	return apptest.Decode[alarmListBody](t, r)
}

func statsOf(stats []eligibility.ServiceStats, service string) *eligibility.ServiceStats {
	for i := range stats {
		if stats[i].Service == service {
			return &stats[i]
		}
	}
	return nil
}

func quarantinedIn(el evaluator.ServiceEligibility, id uuid.UUID) bool {
	for _, v := range el.Instances {
		if v.InstanceID == id && v.QuarantineUntil != nil {
			return true
		}
	}
	return false
}

func hasQuarantine(alarms []assembler.Alarm, id uuid.UUID) bool {
	for _, a := range alarms {
		if a.Kind == evaluator.AlarmInstanceQuarantined && a.Service == "web" && strings.Contains(a.Detail, id.String()) {
			return true
		}
	}
	return false
}

// flapOnOwner feeds id adversarial probe reports on its owner, one a
// second (failing while it is in rotation, passing while it is out),
// until the owner quarantines it. Both stacks' clocks move together, so
// the replicas' signatures stay within each other's window.
func flapOnOwner(t *testing.T, own, other *stack, id uuid.UUID) {
	t.Helper()
	prober := identity.Principal{Kind: identity.KindProber, Subject: "prober-az1"}
	ctx := context.Background()
	for range 3600 {
		own.Clock.Advance(time.Second)
		other.Clock.Advance(time.Second)
		el, err := own.Evaluator.ServiceEligibility("web")
		if err != nil {
			t.Fatal(err)
		}
		outcome := "success"
		for _, v := range el.Instances {
			if v.InstanceID == id && (v.State == "eligible" || v.State == "degraded") {
				outcome = "failure"
			}
		}
		if res, err := own.Evaluator.Ingest(ctx, prober, []evaluator.Report{{InstanceID: id, Class: "probe", Outcome: outcome}}); err != nil || res.Accepted != 1 {
			t.Fatalf("ingest: %+v %v", res, err)
		}
		own.Evaluator.EvaluateNow()
		for _, q := range own.Evaluator.QuarantineAlarms() {
			if q.InstanceID == id {
				return
			}
		}
	}
	t.Fatal("not quarantined within an hour of flapping")
}

// killable is a listener whose kill closes it and every connection it
// accepted, as a process killed would: a peer's kept-alive connection
// breaks too.
type killable struct {
	net.Listener
	mu    sync.Mutex
	conns []net.Conn
	dead  bool
}

func (k *killable) Accept() (net.Conn, error) {
	c, err := k.Listener.Accept()
	if err != nil {
		return nil, err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.dead {
		c.Close()
		return nil, net.ErrClosed
	}
	k.conns = append(k.conns, c)
	return c, nil
}

func (k *killable) kill() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.dead = true
	k.Listener.Close()
	for _, c := range k.conns {
		c.Close()
	}
}
