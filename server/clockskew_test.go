package server_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/app"
	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/evaluator"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/registry"
	"github.com/musterhq/muster/internal/wait"
)

// TestOneReplicaClockOffBy30s: two replicas on one database, b's clock
// 30 s ahead of a's (and, in the second run, 30 s behind), leases on
// PostgreSQL's clock as in muster serve. The two still relay and forward
// to each other; b raises clock_skew with the figure and a does not;
// self evidence reported to either replica reaches the other (an
// instance is admitted on both by reports to a) and a hard failure
// reported to either is acted on by the other, none refused or counted
// delivered when it was not; the owner (a) publishes both withdrawals; and a
// lease renewed through b runs the TTL from PostgreSQL's clock and is not
// expired by a's reaper, whose clock has moved 31 s on; and an instance
// deregistered through b leaves a's evaluator at its next refresh.
func TestOneReplicaClockOffBy30s(t *testing.T) {
	t.Parallel()
	for _, off := range []time.Duration{30 * time.Second, -30 * time.Second} {
		t.Run(off.String(), func(t *testing.T) {
			t.Parallel()
			a := apptest.New(t, apptest.Options{Replica: "a", DatabaseClock: true})
			b := apptest.New(t, apptest.Options{Replica: "b", Pool: a.Pool, DatabaseClock: true, ClockOffset: off})
			a.Seed(t)
			for _, s := range []*stack{a, b, a, b} {
				if err := s.App.Ownership.RunOnce(t.Context()); err != nil {
					t.Fatal(err)
				}
			}
			for _, s := range []*stack{a, b} {
				s.App.Forwarder.RunOnce(t.Context())
			}

			// The skew is measured against PostgreSQL's clock; the alarm
			// names b's figure, and a has none.
			a.Clock.Set(time.Now())
			b.Clock.Set(time.Now().Add(off))
			a.Monitor.RunOnce(t.Context())
			b.Monitor.RunOnce(t.Context())
			if s := b.Monitor.ClockSkew(); s.Skew < off-time.Second || s.Skew > off+time.Second || !s.Over {
				t.Errorf("b's skew %+v, want about %s and over the threshold", s, off)
			}
			way := "ahead of"
			if off < 0 {
				way = "behind"
			}
			if al, ok := alarmOf(b.Server.Alarms(), app.AlarmClockSkew); !ok || !strings.Contains(al.Detail, "30.0") || !strings.Contains(al.Detail, way+" PostgreSQL") {
				t.Errorf("b's clock_skew alarm %+v (open %v), want 30.0 s %s", al, ok, way)
			}
			if al, ok := alarmOf(a.Server.Alarms(), app.AlarmClockSkew); ok {
				t.Errorf("a raised %+v", al)
			}
			if v := gauge(t, b, "muster_clock_skew_seconds"); v < off.Seconds()-1 || v > off.Seconds()+1 {
				t.Errorf("b's muster_clock_skew_seconds %v, want about %v", v, off.Seconds())
			}

			// The relay follows across the skew, both ways.
			wait.For(t, 10*time.Second, "a and b following each other", func() bool {
				return following(a, "b") && following(b, "a")
			})

			toA, toB := registerOnHost(t, a, 9000), registerOnHost(t, a, 9001)
			leased := registerOnHost(t, a, 9002)
			// Enough healthy instances that two withdrawals stay above
			// the zone's healthy-fraction guard.
			admit := []string{toA.ID.String(), toB.ID.String()}
			others := []registry.Registered{toA, toB}
			for port := 9003; port < 9008; port++ {
				in := registerOnHost(t, a, port)
				others = append(others, in)
				admit = append(admit, in.ID.String())
			}
			a.Admit(t, admit...)
			if err := b.Evaluator.SyncNow(t.Context()); err != nil {
				t.Fatal(err)
			}
			for _, s := range []*stack{a, b} {
				for _, id := range []uuid.UUID{toA.ID, toB.ID} {
					waitState(t, s, id, "eligible")
				}
			}

			// A hard failure reported to b reaches a, and one reported to
			// a reaches b.
			if res := postReportsWith(t, b, b.Token(t, webReq), credentialHeader(toA.Credential), selfReport(toA.ID, "hard_failure")); res.Accepted != 1 {
				t.Fatalf("report to b: %+v", res)
			}
			if res := postReportsWith(t, a, a.Token(t, webReq), credentialHeader(toB.Credential), selfReport(toB.ID, "hard_failure")); res.Accepted != 1 {
				t.Fatalf("report to a: %+v", res)
			}
			waitState(t, a, toA.ID, "ineligible")
			waitState(t, b, toB.ID, "ineligible")
			for _, p := range []struct {
				from *stack
				to   string
			}{{a, "b"}, {b, "a"}} {
				if n := labelled(t, p.from, "muster_evidence_forward_refused_total", "peer", p.to); n != 0 {
					t.Errorf("%s refused %v forwarded items", p.to, n)
				}
				if al, ok := alarmOf(p.from.Server.Alarms(), "evidence_refused"); ok {
					t.Errorf("evidence_refused raised: %+v", al)
				}
			}
			if n := labelled(t, a, "muster_samples_forwarded_total", "result", "refused") + labelled(t, b, "muster_samples_forwarded_total", "result", "refused"); n != 0 {
				t.Errorf("%v forwarded samples refused", n)
			}

			// a, the unskewed replica, takes every shard (web's among
			// them): as web's owner it publishes both withdrawals and
			// reaps its leases below.
			a.TakeOver(t)
			a.Publisher.RunOnce()
			a.Clock.Advance(2 * time.Second) // past the batching windows
			a.Publisher.RunOnce()
			v, ok := a.Publisher.View("web")
			if !ok {
				t.Fatal("the owner publishes no view of web")
			}
			for _, id := range []uuid.UUID{toA.ID, toB.ID} {
				if st := endpointState(v, id); st != "" && st != "ineligible" {
					t.Errorf("%s published as %q by the owner, want withdrawn", id, st)
				}
			}
			if st := endpointState(v, uuid.MustParse(admit[2])); st != "eligible" {
				t.Errorf("a healthy instance published as %q, want eligible (view %+v)", st, v)
			}

			// A renewal through b: the lease runs the TTL from
			// PostgreSQL's clock.
			if _, err := a.Reaper.RunOnce(t.Context()); err != nil {
				t.Fatal(err)
			}
			a.Clock.Advance(31 * time.Second) // past a's grace
			// The other instances renew through a, so only this one
			// would lapse if b's clock counted (one lapse is no mass
			// event the disbelief threshold holds).
			for _, in := range others {
				if r := a.DoWith(t, "PUT", "/v1/instances/"+in.ID.String()+"/lease", a.Token(t, webReq), "", "", credentialHeader(in.Credential)); r.Status != http.StatusOK {
					t.Fatalf("renew through a: %d %s", r.Status, r.Body)
				}
			}
			r := b.DoWith(t, "PUT", "/v1/instances/"+leased.ID.String()+"/lease", b.Token(t, webReq), "", "", credentialHeader(leased.Credential))
			if r.Status != http.StatusOK {
				t.Fatalf("renew through b: %d %s", r.Status, r.Body)
			}
			if n, err := a.Reaper.RunOnce(t.Context()); err != nil || n != 0 {
				t.Fatalf("a's reaper expired %d leases (%v), want none", n, err)
			}
			admin := identity.Principal{Kind: identity.KindOperator, Subject: "test", Role: identity.RoleAdmin}
			if in, err := a.Registry.GetInstance(context.Background(), admin, leased.ID); err != nil || in.State != registry.StateActive {
				t.Fatalf("the lease renewed through b: %+v, %v; want active", in, err)
			}

			// An instance deregistered through b (its own graceful stop)
			// leaves a's evaluator at its next incremental refresh: the
			// row's change is stamped no earlier than PostgreSQL's clock,
			// never behind what a has read.
			gone := others[3]
			if r := b.DoWith(t, "DELETE", "/v1/instances/"+gone.ID.String(), b.Token(t, webReq), "", "", credentialHeader(gone.Credential)); r.Status != http.StatusNoContent {
				t.Fatalf("deregister through b: %d %s", r.Status, r.Body)
			}
			if err := a.Evaluator.SyncNow(t.Context()); err != nil {
				t.Fatal(err)
			}
			a.Evaluator.EvaluateNow()
			r2 := a.Do(t, "GET", "/v1/services/web/eligibility", a.Token(t, adminReq), "", "")
			for _, v := range apptest.Decode[evaluator.ServiceEligibility](t, r2).Instances {
				if v.InstanceID == gone.ID {
					t.Errorf("a still evaluates %s, deregistered through b: %+v", gone.ID, v)
				}
			}

			pgNow, err := db.New(a.Pool).LeaseClockNow(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			in := apptest.Decode[registry.Instance](t, r)
			if in.LeaseExpiresAt == nil || in.LeaseExpiresAt.Sub(pgNow) > registry.DefaultLeaseTTL || in.LeaseExpiresAt.Sub(pgNow) < registry.DefaultLeaseTTL-5*time.Second {
				t.Fatalf("renewed through b to %v; PostgreSQL's clock reads %v, want the TTL from it", in.LeaseExpiresAt, pgNow)
			}
		})
	}
}

// alarmOf finds the open alarm of kind.
func alarmOf(alarms []assembler.Alarm, kind string) (assembler.Alarm, bool) {
	for _, al := range alarms {
		if al.Kind == kind {
			return al, true
		}
	}
	return assembler.Alarm{}, false
}

// following reports whether s's relay has a stream open to peer.
func following(s *stack, peer string) bool {
	for _, st := range s.App.Relay.Status() {
		if st.Peer == peer && st.Connected {
			return true
		}
	}
	return false
}

// waitState evaluates on s until id's verdict in s's own evaluator is
// state. It reads the evaluator, not GET /v1/services/web/eligibility,
// which a replica that does not own web answers from web's owner.
func waitState(t *testing.T, s *stack, id uuid.UUID, state string) {
	t.Helper()
	last := ""
	wait.For(t, 10*time.Second, "instance "+id.String()+" "+state+" at "+s.URL, func() bool {
		s.Evaluator.EvaluateNow()
		el, err := s.Evaluator.ServiceEligibility("web")
		if err != nil {
			return false
		}
		for _, v := range el.Instances {
			if v.InstanceID == id {
				last = v.State
			}
		}
		return last == state
	})
}

// endpointState is id's state in view v ("" when absent).
func endpointState(v *assembler.View, id uuid.UUID) string {
	for _, e := range v.Endpoints {
		if e.InstanceID == id {
			return e.State
		}
	}
	return ""
}

// gauge reads an unlabelled gauge from s's metrics.
func gauge(t *testing.T, s *stack, name string) float64 {
	t.Helper()
	mfs, err := s.Metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no gauge %s", name)
	return 0
}
