package server_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/evaluator"
	"github.com/musterhq/muster/internal/policy"
)

// alarmsOf returns the open alarms of kind on s, by their detail.
func alarmsOf(t *testing.T, s *apptest.Stack, kind string) []string {
	t.Helper()
	r := s.Do(t, "GET", "/v1/alarms", s.Token(t, adminReq), "", "")
	var body struct {
		Alarms []struct{ Kind, Detail string }
	}
	if err := json.Unmarshal(r.Body, &body); err != nil {
		t.Fatalf("alarms: %d %s", r.Status, r.Body)
	}
	var out []string
	for _, a := range body.Alarms {
		if a.Kind == kind {
			out = append(out, a.Detail)
		}
	}
	return out
}

// TestLiftedOverridesWrittenBackChangeNothing plays a hostile database
// administrator who writes lifted overrides back to 'active' with their
// old seals (issue 25, no replay): the overrides are not applied, on the
// running replica nor on one started afterwards on the same database,
// they spend no disruption budget (so together they cannot exceed it),
// and each is counted, listed and raised as an override_replayed alarm.
func TestLiftedOverridesWrittenBackChangeNothing(t *testing.T) {
	t.Parallel()
	f := newOverrideFixture(t, apptest.Options{}, map[string]int{"az1": 4})
	az1 := f.zones["az1"]
	ctx := context.Background()
	oscar := f.Token(t, oscarReq)
	just := "these instances corrupt orders; see INC-78 timeline"
	refresh := func(s *apptest.Stack) {
		t.Helper()
		if err := s.App.InForce.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
	}

	// Two overrides within budget (2 of 4 out; the contract requires 2),
	// both lifted.
	var ids []string
	for _, in := range az1[:2] {
		r := f.override(t, oscar, in, "mark_ineligible", just, 0)
		if r.Status != http.StatusCreated {
			t.Fatalf("override %s: %d %s", in, r.Status, r.Body)
		}
		ids = append(ids, apptest.Decode[policy.Override](t, r).ID.String())
	}
	refresh(f.Stack)
	if n := len(f.App.InForce.All(f.Clock.Now())); n != 2 {
		t.Fatalf("%d overrides applied, want 2", n)
	}
	for _, id := range ids {
		if r := f.Do(t, "DELETE", "/v1/overrides/"+id, oscar, "", ""); r.Status != http.StatusOK {
			t.Fatalf("lift %s: %d %s", id, r.Status, r.Body)
		}
	}
	refresh(f.Stack)

	// Written back: the rows as they were before the lift, seals untouched.
	for _, id := range ids {
		if _, err := f.Pool.Exec(ctx, `UPDATE overrides SET state = 'active', lifted_at = NULL, lifted_by = NULL, ended_at = NULL WHERE id = $1`, id); err != nil {
			t.Fatal(err)
		}
	}
	refresh(f.Stack)
	if got := f.App.InForce.All(f.Clock.Now()); len(got) != 0 {
		t.Fatalf("lifted overrides written back are applied: %v", got)
	}
	rp := f.App.InForce.Replayed()
	if len(rp) != 2 || !strings.Contains(rp[0].Reason, "muster ended it (lifted at") {
		t.Fatalf("replayed: %+v", rp)
	}
	if un := f.App.InForce.Unsealed(); len(un) != 0 {
		t.Fatalf("the replayed rows' seals verify, yet unsealed lists %+v", un)
	}
	if !strings.Contains(string(f.Scrape(t)), "muster_overrides_replayed 2\n") {
		t.Error("muster_overrides_replayed is not 2")
	}
	if a := alarmsOf(t, f.Stack, policy.AlarmOverrideReplayed); len(a) != 2 || !strings.Contains(a[0], "written back outside muster") {
		t.Fatalf("override_replayed alarms: %v", a)
	}
	f.publish(t)
	for i, id := range az1 {
		if e, ok := endpointOf(t, f.view(t), id); !ok || e.Override != nil {
			t.Errorf("az1[%d] in the view: %v %+v", i, ok, e.Override)
		}
	}

	// They spend no budget: two more overrides are within it (they would
	// leave 1 of 4 in were the written-back rows counted).
	for _, in := range az1[2:] {
		if r := f.override(t, oscar, in, "mark_ineligible", just, 0); r.Status != http.StatusCreated {
			t.Fatalf("override %s with the replayed rows not counted: %d %s", in, r.Status, r.Body)
		}
	}

	// A replica started afterwards on the same database applies the two
	// overrides muster put in force, and not the replayed ones.
	b := apptest.New(t, apptest.Options{Pool: f.Pool})
	b.WaitReady(t)
	refresh(b)
	got := b.App.InForce.All(b.Clock.Now())
	if len(got) != 2 {
		t.Fatalf("the new replica applies %d overrides, want 2: %v", len(got), got)
	}
	for _, in := range az1[:2] {
		if _, ok := got[uuid.MustParse(in)]; ok {
			t.Errorf("the new replica applies the replayed override of %s", in)
		}
	}
	if n := len(b.App.InForce.Replayed()); n != 2 {
		t.Errorf("the new replica lists %d replayed overrides, want 2", n)
	}
	verifyAudit(t, f.Stack)
}

// TestEndedInstanceWrittenBackIsNotRouted plays a hostile database
// administrator who sets an instance muster deregistered back to
// 'active', with its old identity seal and a long lease (issue 25, no
// replay): it gets no traffic, neither on the running replica nor on one rebuilt from the table, and it is
// counted and raised as an instance_replayed alarm. A record of an end
// appended by hand (to end a live instance) is not believed.
func TestEndedInstanceWrittenBackIsNotRouted(t *testing.T) {
	t.Parallel()
	f := newOverrideFixture(t, apptest.Options{}, map[string]int{"az1": 4})
	az1 := f.zones["az1"]
	ctx := context.Background()
	alice := f.Token(t, adminReq)

	if r := f.deregister(t, alice, az1[0], "host fails its ECC checks, CHG-8"); r.Status != http.StatusOK {
		t.Fatalf("deregister: %d %s", r.Status, r.Body)
	}
	f.publish(t)
	if _, ok := endpointOf(t, f.view(t), az1[0]); ok {
		t.Fatal("the deregistered instance is in the view")
	}

	// Written back as it was while active (no end, no end seal), with a
	// lease a day long, so that the reaper leaves it alone.
	if _, err := f.Pool.Exec(ctx, `UPDATE instances SET state = 'active', ended_at = NULL, end_seal = NULL, end_seal_key = NULL,
		lease_expires_at = $2::timestamptz + interval '1 day', updated_at = $2 WHERE id = $1`, az1[0], f.Clock.Now()); err != nil {
		t.Fatal(err)
	}
	// A hand-made record of an end of a live instance, to take it out.
	if _, err := f.Pool.Exec(ctx, `INSERT INTO audit_events (seq, at, actor_kind, actor, action, target_kind, target, outcome, reason, after, prev_hash, hash)
		SELECT seq + 1, at, 'system', 'system:ends', 'end.record', 'instance', $1::text, 'accepted', '',
		       jsonb_build_object('kind', 'instance', 'id', $1::text, 'state', 'deregistered', 'ended_at', 0), hash, ''::bytea
		FROM audit_events ORDER BY seq DESC LIMIT 1`, az1[1]); err != nil {
		t.Fatal(err)
	}
	f.publish(t)
	f.probe(t, "success", az1[1:]...)
	f.publish(t)
	if _, ok := endpointOf(t, f.view(t), az1[0]); ok {
		t.Fatal("the instance written back to active is routed")
	}
	if n := f.Evaluator.ReplayedInstances(); n != 1 {
		t.Errorf("%d replayed instances, want 1", n)
	}
	if !strings.Contains(string(f.Scrape(t)), "muster_instances_replayed 1\n") {
		t.Error("muster_instances_replayed is not 1")
	}
	if a := alarmsOf(t, f.Stack, evaluator.AlarmInstanceReplayed); len(a) != 1 || !strings.Contains(a[0], az1[0]) || !strings.Contains(a[0], "muster ended it (deregistered") {
		t.Fatalf("instance_replayed alarms: %v", a)
	}

	// A replica rebuilt from the table does not route it either.
	b := &ofix{Stack: apptest.New(t, apptest.Options{Pool: f.Pool}), zones: f.zones}
	b.waitReady(t)
	b.probe(t, "success", az1[1:]...)
	b.publish(t)
	bv := b.view(t)
	if _, ok := endpointOf(t, bv, az1[0]); ok {
		t.Fatal("the rebuilt replica routes the instance written back to active")
	}
	for _, id := range az1[1:] {
		if _, ok := endpointOf(t, bv, id); !ok {
			t.Errorf("the rebuilt replica does not route %s", id)
		}
	}
	if a := alarmsOf(t, b.Stack, evaluator.AlarmInstanceReplayed); len(a) != 1 {
		t.Fatalf("instance_replayed alarms on the rebuilt replica: %v", a)
	}

	// Ended again by hand, with an end muster did not seal (which alone
	// reads as active, so that a forged end keeps an instance's traffic):
	// muster's record of its end still keeps it out, here and rebuilt.
	if _, err := f.Pool.Exec(ctx, `UPDATE instances SET state = 'deregistered', ended_at = $2, updated_at = $2 WHERE id = $1`,
		az1[0], f.Clock.Now().Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	f.publish(t)
	c := &ofix{Stack: apptest.New(t, apptest.Options{Pool: f.Pool}), zones: f.zones}
	c.waitReady(t)
	c.publish(t)
	for _, s := range []*ofix{f, c} {
		if _, ok := endpointOf(t, s.view(t), az1[0]); ok {
			t.Fatal("the instance ended again by hand, its end not muster's, is routed")
		}
	}
	verifyAudit(t, f.Stack)
}

// TestAStaleReadOfAnEndedInstanceIsNotAReplay (issue 27): an evaluator
// that read an instance's row as active a moment before another replica
// ended it (a re-registration replacing it, under churn) finds a record of
// the end when it asks; the row reads ended by then, so it is a stale
// read, not a row written back: Replayed returns it only while the row
// still reads active.
func TestAStaleReadOfAnEndedInstanceIsNotAReplay(t *testing.T) {
	t.Parallel()
	f := newOverrideFixture(t, apptest.Options{}, map[string]int{"az1": 4})
	az1 := f.zones["az1"]
	ctx := context.Background()
	if r := f.deregister(t, f.Token(t, adminReq), az1[0], "replaced by a new registration, CHG-9"); r.Status != http.StatusOK {
		t.Fatalf("deregister: %d %s", r.Status, r.Body)
	}
	id := uuid.MustParse(az1[0])
	if ends, _, err := f.Registry.Replayed(ctx, []uuid.UUID{id}); err != nil || len(ends) != 0 {
		t.Fatalf("an ended row with a record of its end: %v %v, want no replay", ends, err)
	}
	if _, err := f.Pool.Exec(ctx, `UPDATE instances SET state = 'active', ended_at = NULL, end_seal = NULL, end_seal_key = NULL WHERE id = $1`, az1[0]); err != nil {
		t.Fatal(err)
	}
	if ends, _, err := f.Registry.Replayed(ctx, []uuid.UUID{id}); err != nil || len(ends) != 1 {
		t.Fatalf("the row written back to active: %v %v, want it replayed", ends, err)
	}
}
