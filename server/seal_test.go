package server_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/evaluator"
	"github.com/musterhq/muster/internal/policy"
	"github.com/musterhq/muster/internal/registry"
)

// TestOverridesWrittenOutsideMusterRemoveNothing plays a hostile database
// administrator against the overrides table: a row inserted by hand, a
// budget-refused row set to 'active', and an admitted override's expiry
// pushed out. None of them takes an instance out of the views or spends
// the disruption budget; each is listed as unsealed and counted. The
// overrides muster admitted (within budget and co-signed) are applied,
// by a second replica holding the region's key too; a replica with
// another key trusts them only once given the first key's public half
// (a rotation).
func TestOverridesWrittenOutsideMusterRemoveNothing(t *testing.T) {
	t.Parallel()
	// Six override attempts by oscar: over the default 5 per 10 min.
	more := func(c *policy.Config) { c.OverrideLimit = policy.Limit{Max: 20, Window: 10 * time.Minute} }
	f := newOverrideFixture(t, apptest.Options{Policy: more}, map[string]int{"az1": 6})
	az1 := f.zones["az1"]
	ctx := context.Background()
	oscar, alice := f.Token(t, oscarReq), f.Token(t, adminReq)
	just := "these instances corrupt orders; see INC-77 timeline"
	refresh := func() {
		t.Helper()
		if err := f.App.InForce.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
	}
	applied := func(id string) bool {
		_, ok := f.App.InForce.For(uuid.MustParse(id), f.Clock.Now())
		return ok
	}

	// Admitted within budget: sealed and applied.
	r := f.override(t, oscar, az1[0], "mark_ineligible", just, 0)
	if r.Status != http.StatusCreated {
		t.Fatalf("within budget: %d %s", r.Status, r.Body)
	}
	admitted := apptest.Decode[policy.Override](t, r)
	var seal []byte
	var key *string
	if err := f.Pool.QueryRow(ctx, `SELECT seal, seal_key FROM overrides WHERE id = $1`, admitted.ID).Scan(&seal, &key); err != nil {
		t.Fatal(err)
	}
	if len(seal) != ed25519.SignatureSize || key == nil || *key != apptest.SealKey().KeyID() {
		t.Fatalf("the admitted override's seal: %x by %v", seal, key)
	}
	refresh()
	if !applied(az1[0]) {
		t.Fatal("the admitted override is not applied")
	}

	// 1. An override inserted by hand, in oscar's name.
	forged := uuid.Must(uuid.NewV7())
	if _, err := f.Pool.Exec(ctx, `INSERT INTO overrides (id, instance_id, service, zone, action, state, actor, justification, created_at, expires_at)
		VALUES ($1, $2, 'web', 'az1', 'mark_ineligible', 'active', 'operator:oscar', 'looks legitimate enough', $3, $4)`,
		forged, az1[1], f.Clock.Now(), f.Clock.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	refresh()
	if applied(az1[1]) {
		t.Fatal("an override inserted by hand is applied")
	}
	un := f.App.InForce.Unsealed()
	if len(un) != 1 || un[0].ID != forged || un[0].Reason != policy.ErrUnsealed.Error() || un[0].Actor != "operator:oscar" {
		t.Fatalf("unsealed after the insert: %+v", un)
	}

	// The forged row spends no headroom: of 6, 5 are in rotation (the
	// forged one counts as in), the contract requires 3, so two more
	// overrides are within budget and the third is refused.
	for _, id := range az1[2:4] {
		if r := f.override(t, oscar, id, "mark_ineligible", just, 0); r.Status != http.StatusCreated {
			t.Fatalf("within budget, the forged row not counted: %d %s", r.Status, r.Body)
		}
	}
	m := wantProblem(t, f.override(t, oscar, az1[4], "mark_ineligible", just, 0), http.StatusConflict, "budget-exceeded")
	if d, _ := m["detail"].(string); !strings.Contains(d, "would leave 2 of 6 eligible in zone az1; the contract requires 3") {
		t.Fatalf("the refusal counts the forged row: %s", d)
	}
	pending, _ := m["override_id"].(string)

	// 2. The budget-refused attempt set to 'active' by hand.
	if _, err := f.Pool.Exec(ctx, `UPDATE overrides SET state = 'active' WHERE id = $1`, pending); err != nil {
		t.Fatal(err)
	}
	// 3. The admitted override's expiry pushed out a day.
	if _, err := f.Pool.Exec(ctx, `UPDATE overrides SET expires_at = expires_at + interval '1 day' WHERE id = $1`, admitted.ID); err != nil {
		t.Fatal(err)
	}
	refresh()
	if applied(az1[4]) {
		t.Fatal("a pending override set to active by hand is applied")
	}
	// muster applied it verified: the copy it verified stays applied, to
	// its own expiry, not the one pushed out (issue 25: what a running
	// replica verified, it keeps).
	if o, ok := f.App.InForce.For(uuid.MustParse(az1[0]), f.Clock.Now()); !ok || !o.ExpiresAt.Equal(admitted.ExpiresAt) {
		t.Fatalf("an override muster applied, whose expiry was then pushed out by hand: %+v %v, want kept to %s", o, ok, admitted.ExpiresAt)
	}
	reasons := map[string]string{}
	for _, u := range f.App.InForce.Unsealed() {
		reasons[u.ID.String()] = u.Reason
	}
	want := map[string]string{forged.String(): policy.ErrUnsealed.Error(), pending: policy.ErrUnsealed.Error(), admitted.ID.String(): policy.ErrBadSeal.Error()}
	if len(reasons) != len(want) {
		t.Fatalf("unsealed: %v, want %v", reasons, want)
	}
	for id, w := range want {
		if reasons[id] != w {
			t.Errorf("unsealed %s: %q, want %q", id, reasons[id], w)
		}
	}
	if !strings.Contains(string(f.Scrape(t)), "muster_overrides_unsealed 3\n") {
		t.Error("muster_overrides_unsealed is not 3")
	}
	// Each is an open alarm, on the API (and so on the UI's banner).
	ar := f.Do(t, "GET", "/v1/alarms", alice, "", "")
	var alarms struct {
		Alarms []struct{ Kind, Service, Detail string }
	}
	if err := json.Unmarshal(ar.Body, &alarms); err != nil {
		t.Fatalf("alarms: %d %s", ar.Status, ar.Body)
	}
	open := 0
	for _, a := range alarms.Alarms {
		if a.Kind == policy.AlarmOverrideUnsealed {
			open++
			if a.Service != "web" || !strings.Contains(a.Detail, "the table was written outside muster") {
				t.Errorf("alarm %+v", a)
			}
		}
	}
	if open != 3 {
		t.Errorf("%d override_unsealed alarms, want 3: %s", open, ar.Body)
	}

	// A second replica, which never verified the admitted override, does
	// not apply its tampered row.
	fresh := apptest.New(t, apptest.Options{Pool: f.Pool})
	fresh.WaitReady(t)
	if err := fresh.App.InForce.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if _, ok := fresh.App.InForce.For(uuid.MustParse(az1[0]), fresh.Clock.Now()); ok {
		t.Fatal("a replica that never verified it applies an override whose expiry was changed by hand")
	}
	// oscar lifts it: muster's own end ends it everywhere.
	if r := f.Do(t, "DELETE", "/v1/overrides/"+admitted.ID.String(), oscar, "", ""); r.Status != http.StatusOK {
		t.Fatalf("lift: %d %s", r.Status, r.Body)
	}
	refresh()
	if applied(az1[0]) {
		t.Fatal("a lifted override is applied")
	}

	// The views: the two overrides muster admitted take az1[2] and az1[3]
	// out; nothing else is overridden.
	f.TakeOver(t)
	f.publish(t)
	v := f.view(t)
	for i, id := range az1 {
		e, ok := endpointOf(t, v, id)
		if !ok {
			t.Fatalf("az1[%d] is not in the view", i)
		}
		if out := e.Override != nil; out != (i == 2 || i == 3) {
			t.Errorf("az1[%d]: override %+v in the view", i, e.Override)
		}
	}

	// The rows changed by hand neither spend headroom nor stand in the
	// way: with az1[0] back, 4 of 6 are in and az1[5] may go; then 3 are
	// in, and az1[0] (whose tampered row is still 'active') is refused by
	// the budget, co-signed, sealed at its co-sign and applied.
	if r := f.override(t, oscar, az1[5], "mark_ineligible", just, 0); r.Status != http.StatusCreated {
		t.Fatalf("within budget, the tampered rows not counted: %d %s", r.Status, r.Body)
	}
	m = wantProblem(t, f.override(t, oscar, az1[0], "mark_ineligible", just, 0), http.StatusConflict, "budget-exceeded")
	second, _ := m["override_id"].(string)
	if r := f.JSON(t, "POST", "/v1/overrides/"+second+"/cosign", alice, `{"justification":"confirmed with oscar: corrupting orders, INC-77"}`); r.Status != http.StatusOK {
		t.Fatalf("co-sign: %d %s", r.Status, r.Body)
	}
	refresh()
	if !applied(az1[5]) || !applied(az1[0]) {
		t.Fatal("the overrides admitted after the tampering are not applied")
	}
	if o, _ := f.App.InForce.For(uuid.MustParse(az1[0]), f.Clock.Now()); o.ID.String() != second || o.Cosigner != "operator:alice" {
		t.Fatalf("az1[0]'s override in force: %+v, want the co-signed %s", o, second)
	}

	// A second replica with the region's key applies what the first
	// sealed, and nothing else.
	b := apptest.New(t, apptest.Options{Pool: f.Pool})
	b.WaitReady(t)
	if err := b.App.InForce.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	got := b.App.InForce.All(b.Clock.Now())
	if len(got) != 4 {
		t.Fatalf("the second replica applies %d overrides, want 4: %v", len(got), got)
	}
	for _, id := range []string{az1[0], az1[2], az1[3], az1[5]} {
		if _, ok := got[uuid.MustParse(id)]; !ok {
			t.Errorf("the second replica does not apply the override of %s", id)
		}
	}

	// A replica with another key trusts none of them, until given the
	// old key's public half.
	_, other, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	rotated := audit.NewKeySigner(other)
	for _, tc := range []struct {
		name  string
		keys  policy.SealKeys
		count int
	}{
		{"another key only", nil, 0},
		{"another key and the old one's public half", policy.SealKeys{apptest.SealKey().KeyID(): apptest.SealKey().Public()}, 4},
	} {
		c := apptest.New(t, apptest.Options{Pool: f.Pool, Policy: func(pc *policy.Config) { pc.Sealer, pc.SealKeys = rotated, tc.keys }})
		c.WaitReady(t)
		if err := c.App.InForce.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
		if n := len(c.App.InForce.All(c.Clock.Now())); n != tc.count {
			t.Errorf("%s: %d overrides applied, want %d", tc.name, n, tc.count)
		}
		if tc.count == 0 {
			for _, u := range c.App.InForce.Unsealed() {
				if !strings.HasPrefix(u.Reason, policy.ErrUnknownKey.Error()) && u.Reason != policy.ErrUnsealed.Error() && u.Reason != policy.ErrBadSeal.Error() {
					t.Errorf("%s: unsealed %s: %q", tc.name, u.ID, u.Reason)
				}
			}
		}
	}
}

// TestInstancesWrittenOutsideMusterMoveNoTraffic plays a hostile database
// administrator against the instances table: an instance set to
// 'deregistered' by hand keeps its traffic (on the running replica and on
// one rebuilt from the table), an instance inserted by hand gets none, and
// one re-pointed at another address by hand keeps its old address, while
// the replica runs and after a rebuild too (issue 25: the identity muster
// sealed is kept beside the row). Each is an instance_unsealed alarm. A deregistration through muster is sealed and
// honoured.
func TestInstancesWrittenOutsideMusterMoveNoTraffic(t *testing.T) {
	t.Parallel()
	f := newOverrideFixture(t, apptest.Options{}, map[string]int{"az1": 4})
	f.waitReady(t)
	az1 := f.zones["az1"]
	ctx := context.Background()
	alice := f.Token(t, adminReq)
	addressOf := func(v assembler.View, id string) string {
		t.Helper()
		e, ok := endpointOf(t, v, id)
		if !ok {
			return ""
		}
		return e.Address
	}
	unsealedAlarms := func(s *apptest.Stack) map[string]string {
		t.Helper()
		r := s.Do(t, "GET", "/v1/alarms", s.Token(t, adminReq), "", "")
		var body struct {
			Alarms []struct{ Kind, Detail string }
		}
		if err := json.Unmarshal(r.Body, &body); err != nil {
			t.Fatalf("alarms: %d %s", r.Status, r.Body)
		}
		out := map[string]string{}
		for _, a := range body.Alarms {
			if a.Kind == evaluator.AlarmInstanceUnsealed {
				out[strings.Fields(a.Detail)[1]] = a.Detail
			}
		}
		return out
	}

	// 1. az1[0] ended by hand; 2. an instance inserted by hand at an
	// address of the attacker's; 3. az1[1] re-pointed there by hand.
	now := f.Clock.Now()
	forged := uuid.Must(uuid.NewV7())
	for _, q := range []struct {
		sql  string
		args []any
	}{
		{`UPDATE instances SET state = 'deregistered', ended_at = $2, updated_at = $2 WHERE id = $1`, []any{az1[0], now}},
		{`INSERT INTO instances (id, service, address, port, zone, region, source, lease_expires_at, registered_by, created_at, updated_at)
		  VALUES ($1, 'web', '203.0.113.66', 8080, 'az1', 'local', 'registered', $2, 'workload:web', $3, $3)`, []any{forged, now.Add(time.Hour), now}},
		{`UPDATE instances SET address = '203.0.113.7', updated_at = $2 WHERE id = $1`, []any{az1[1], now}},
	} {
		if _, err := f.Pool.Exec(ctx, q.sql, q.args...); err != nil {
			t.Fatal(err)
		}
	}
	// The prober vouches for the forged instance too: were it taken in,
	// it would be routed to.
	f.SyncNow(t)
	r := f.JSON(t, "POST", "/v1/reports", f.Token(t, proberReq), fmt.Sprintf(`{"reports":[{"instance_id":%q,"class":"probe","outcome":"success"}]}`, forged))
	if r.Status != http.StatusOK {
		t.Fatalf("reports: %d %s", r.Status, r.Body)
	}
	f.Evaluator.EvaluateNow()
	f.publish(t)
	v := f.view(t)
	if addressOf(v, az1[0]) == "" {
		t.Error("the instance ended by hand left the view")
	}
	if addressOf(v, forged.String()) != "" {
		t.Error("the instance inserted by hand is in the view")
	}
	if a := addressOf(v, az1[1]); a != "10.1.0.2" {
		t.Errorf("the instance re-pointed by hand is at %q in the view, want its registered 10.1.0.2", a)
	}
	got := unsealedAlarms(f.Stack)
	if len(got) != 2 || !strings.Contains(got[az1[0]], "it keeps its traffic") || !strings.Contains(got[forged.String()], "it gets no traffic") {
		t.Fatalf("instance_unsealed alarms on the running replica: %v", got)
	}
	if !strings.Contains(string(f.Scrape(t)), "muster_instances_unsealed 2\n") {
		t.Error("muster_instances_unsealed is not 2")
	}

	// A replica rebuilt from the table: az1[0] in, the forged one out, and
	// az1[1] in at the address muster sealed, not the row's.
	b := &ofix{Stack: apptest.New(t, apptest.Options{Pool: f.Pool}), zones: f.zones}
	b.waitReady(t)
	b.publish(t)
	bv := b.view(t)
	if addressOf(bv, az1[0]) == "" || addressOf(bv, forged.String()) != "" || addressOf(bv, az1[1]) != "10.1.0.2" || addressOf(bv, az1[2]) == "" {
		t.Fatalf("the rebuilt replica's view: %+v", bv.Endpoints)
	}
	got = unsealedAlarms(b.Stack)
	if len(got) != 3 || !strings.Contains(got[az1[1]], "re-pointed outside muster") || !strings.Contains(got[az1[1]], "203.0.113.7") {
		t.Fatalf("instance_unsealed alarms on the rebuilt replica: %v (%d unsealed)", got, b.Evaluator.UnsealedInstances())
	}
	// Re-pointed along with its sealed identity: nothing verifies, so it
	// gets no traffic (the hand that wrote both removed it, not muster).
	if _, err := f.Pool.Exec(ctx, `UPDATE instances SET sealed_identity = jsonb_set(sealed_identity, '{address}', '"203.0.113.7"') WHERE id = $1`, az1[1]); err != nil {
		t.Fatal(err)
	}
	c := &ofix{Stack: apptest.New(t, apptest.Options{Pool: f.Pool}), zones: f.zones}
	c.waitReady(t)
	c.publish(t)
	if a := addressOf(c.view(t), az1[1]); a != "" {
		t.Fatalf("an instance whose sealed identity was re-pointed too is routed at %q", a)
	}

	// A deregistration through muster is sealed, and honoured.
	f.TakeOver(t)
	if r := f.deregister(t, alice, az1[3], "host fails its ECC checks, CHG-7"); r.Status != http.StatusOK {
		t.Fatalf("deregister: %d %s", r.Status, r.Body)
	}
	f.publish(t)
	if addressOf(f.view(t), az1[3]) != "" {
		t.Error("an instance muster deregistered is still in the view")
	}
	if got := unsealedAlarms(f.Stack); len(got) != 2 {
		t.Fatalf("alarms after a deregistration through muster: %v", got)
	}
}

// TestInstancesFromBeforeTheSealsAreAdopted: instances registered by a
// muster without a key are adopted, once, by the first muster with one,
// which routes to them and audits the adoption; a row inserted by hand
// after that is not adopted.
func TestInstancesFromBeforeTheSealsAreAdopted(t *testing.T) {
	t.Parallel()
	unsealed := func(c *policy.Config) { c.Sealer = nil }
	f := newOverrideFixture(t, apptest.Options{Policy: unsealed}, map[string]int{"az1": 3})
	f.waitReady(t)
	ctx := context.Background()
	var n int
	if err := f.Pool.QueryRow(ctx, `SELECT count(*) FROM instances WHERE seal IS NULL`).Scan(&n); err != nil || n != 3 {
		t.Fatalf("unsealed rows before the key: %d %v", n, err)
	}
	b := &ofix{Stack: apptest.New(t, apptest.Options{Pool: f.Pool}), zones: f.zones}
	b.waitReady(t)
	b.publish(t)
	if v := b.view(t); len(v.Endpoints) != 3 {
		t.Fatalf("the adopting replica routes to %d instances, want 3", len(v.Endpoints))
	}
	evs, err := audit.List(ctx, db.New(f.Pool), audit.Filter{Action: "registry.seal_adopt", Target: "instances", Limit: 10})
	if err != nil || len(evs) != 1 || !strings.Contains(evs[0].Reason, "sealed 3 instance rows") {
		t.Fatalf("adoption audit: %+v %v", evs, err)
	}
	// Once only: a third replica adopts nothing, and a row inserted by
	// hand now is not adopted.
	if _, err := f.Pool.Exec(ctx, `INSERT INTO instances (id, service, address, port, zone, region, source, lease_expires_at, registered_by, created_at, updated_at)
		VALUES ($1, 'web', '203.0.113.66', 8080, 'az1', 'local', 'registered', $2, 'workload:web', $3, $3)`,
		uuid.Must(uuid.NewV7()), f.Clock.Now().Add(time.Hour), f.Clock.Now()); err != nil {
		t.Fatal(err)
	}
	c := &ofix{Stack: apptest.New(t, apptest.Options{Pool: f.Pool}), zones: f.zones}
	c.waitReady(t)
	c.publish(t)
	if v := c.view(t); len(v.Endpoints) != 3 {
		t.Fatalf("a later replica routes to %d instances, want 3", len(v.Endpoints))
	}
	if evs, _ := audit.List(ctx, db.New(f.Pool), audit.Filter{Action: "registry.seal_adopt", Target: "instances", Limit: 10}); len(evs) != 1 {
		t.Fatalf("%d adoptions, want 1", len(evs))
	}

	// The record of the adoption deleted by hand, to have the forged row
	// adopted at the next start: refused, and audited.
	if _, err := f.Pool.Exec(ctx, `DELETE FROM seal_adoptions`); err != nil {
		t.Fatal(err)
	}
	d := &ofix{Stack: apptest.New(t, apptest.Options{Pool: f.Pool}), zones: f.zones}
	d.waitReady(t)
	d.publish(t)
	if v := d.view(t); len(v.Endpoints) != 3 {
		t.Fatalf("after the record was deleted, a replica routes to %d instances, want 3", len(v.Endpoints))
	}
	evs, err = audit.List(ctx, db.New(f.Pool), audit.Filter{Action: "registry.seal_adopt", Target: "instances", Limit: 10})
	if err != nil || len(evs) != 2 || evs[0].Outcome != audit.Refused {
		t.Fatalf("adoption audit after the record was deleted: %+v %v", evs, err)
	}
	if d.Evaluator.UnsealedInstances() != 1 {
		t.Fatalf("%d unsealed instances, want the forged one", d.Evaluator.UnsealedInstances())
	}
}

// TestContractsWrittenOutsideMusterAreNotApplied: a health contract
// rewritten by hand (the minimum healthy fraction lowered to 0.01) is not
// applied: the running replica keeps the contract muster wrote, a rebuilt
// one applies the platform defaults, both raise contract_unsealed; the
// next contract written through muster is sealed and applied.
func TestContractsWrittenOutsideMusterAreNotApplied(t *testing.T) {
	t.Parallel()
	f := newOverrideFixture(t, apptest.Options{}, map[string]int{"az1": 4})
	f.waitReady(t)
	ctx := context.Background()
	minFraction := func(s *apptest.Stack) float64 {
		t.Helper()
		if err := s.Evaluator.SyncNow(ctx); err != nil {
			t.Fatal(err)
		}
		in, ok := s.Evaluator.Snapshot("web")
		if !ok {
			t.Fatal("no snapshot of web")
		}
		return in.MinHealthyFraction
	}
	contractAlarm := func(s *apptest.Stack) string {
		t.Helper()
		for _, a := range s.App.Evaluator.SealAlarms() {
			if a.Kind == evaluator.AlarmContractUnsealed && a.Service == "web" {
				return a.Detail
			}
		}
		return ""
	}
	f.setMinFraction(t, 0.75)
	if got := minFraction(f.Stack); got != 0.75 {
		t.Fatalf("the contract muster wrote: min healthy fraction %v", got)
	}

	if _, err := f.Pool.Exec(ctx, `UPDATE health_contracts
		SET document = jsonb_set(document, '{min_healthy_fraction}', '0.01'), version = version + 1 WHERE service = 'web'`); err != nil {
		t.Fatal(err)
	}
	if got := minFraction(f.Stack); got != 0.75 {
		t.Errorf("after the contract was rewritten by hand, the running replica applies %v, want 0.75", got)
	}
	if d := contractAlarm(f.Stack); !strings.Contains(d, "stays applied") {
		t.Errorf("contract_unsealed on the running replica: %q", d)
	}
	if !strings.Contains(string(f.Scrape(t)), "muster_contracts_unsealed 1\n") {
		t.Error("muster_contracts_unsealed is not 1")
	}
	b := apptest.New(t, apptest.Options{Pool: f.Pool})
	b.WaitReady(t)
	if got := minFraction(b); got != 0.5 {
		t.Errorf("a rebuilt replica applies %v, want the platform default 0.5", got)
	}
	if d := contractAlarm(b); !strings.Contains(d, "the platform defaults are applied") {
		t.Errorf("contract_unsealed on the rebuilt replica: %q", d)
	}

	f.setMinFraction(t, 0.6)
	for _, s := range []*apptest.Stack{f.Stack, b} {
		if got := minFraction(s); got != 0.6 {
			t.Errorf("the next contract muster wrote: %v, want 0.6", got)
		}
		if d := contractAlarm(s); d != "" {
			t.Errorf("contract_unsealed after muster wrote the contract again: %q", d)
		}
	}
}

// TestANewDatabaseWrittenBeforeTheRebuildIsAdopted: on a new database, a
// service and an instance written before the evaluator's first rebuild
// (which adopts the rows from before the seals) are sealed after the
// adoption, which each write sees through first: the rebuild's adoption
// then finds its record and refuses nothing. Before, it found sealed rows
// and no record, took them for a record deleted by hand, logged an error
// and audited a refused adoption on every new database.
func TestANewDatabaseWrittenBeforeTheRebuildIsAdopted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := apptest.New(t, apptest.Options{NoStart: true})
	admin := s.Token(t, adminReq)
	if r := s.JSON(t, "PUT", "/v1/services/web", admin, `{"owner":"payments","capabilities":["probe"]}`); r.Status != http.StatusCreated {
		t.Fatalf("create web: %d %s", r.Status, r.Body)
	}
	if _, err := s.Registry.RegisterWithCredential(ctx, webWorkload, netip.MustParseAddr("10.0.0.1"), "web",
		registry.Registration{Address: "10.0.0.1", Port: 8080, Zone: "az1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Registry.AdoptUnsealed(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Registry.AdoptAuthzUnsealed(ctx); err != nil {
		t.Fatal(err)
	}
	evs, err := audit.List(ctx, db.New(s.Pool), audit.Filter{Action: "registry.seal_adopt", Limit: 10})
	if err != nil || len(evs) != 0 {
		t.Fatalf("seal adoption audits on a new database: %+v %v; want none (nothing was adopted, nothing refused)", evs, err)
	}
	var records int
	if err := s.Pool.QueryRow(ctx, `SELECT count(*) FROM seal_adoptions`).Scan(&records); err != nil || records != 2 {
		t.Fatalf("%d records of adoptions, %v; want 2 (instances, services and grants)", records, err)
	}
}
