package resolver_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/resolver"
)

// TestWireCompat decodes muster's own view and delta JSON and applies it.
func TestWireCompat(t *testing.T) {
	ids := []uuid.UUID{uuid.MustParse("10000000-0000-0000-0000-000000000000"), uuid.MustParse("20000000-0000-0000-0000-000000000000"), uuid.MustParse("30000000-0000-0000-0000-000000000000")}
	eps := []assembler.Endpoint{
		{InstanceID: ids[0], Address: "10.0.0.1", Port: 80, Zone: "a", State: "eligible", Weight: 1, Health: "known", Capabilities: []string{"h2"}},
		{InstanceID: ids[1], Address: "10.0.0.2", Port: 80, Zone: "a", State: "degraded", Weight: 0.25, Health: "known", Capabilities: []string{}},
		{InstanceID: ids[2], Address: "10.0.0.3", Port: 80, Zone: "b", State: "unknown", Weight: 1, Health: "unknown", Quarantined: true},
	}
	zones := map[string]assembler.ZoneStatus{
		"a": {Guard: "ok", Eligible: 2, Total: 2, MinHealthyFraction: 0.5},
		"b": {Guard: "tripped", Eligible: 0, Total: 1, MinHealthyFraction: 0.5},
	}
	av := assembler.View{Service: "api", Version: 10, Endpoints: eps, Zones: zones, GeneratedAt: time.Now(), Checksum: assembler.Checksum(eps)}
	b, err := json.Marshal(av)
	if err != nil {
		t.Fatal(err)
	}
	var v resolver.View
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	c := newCache(t)
	if err := c.ApplyView(v); err != nil {
		t.Fatal(err)
	}
	if r := mustResolve(t, c, "api"); r.Routable() != 3 || !r.Tripped() {
		t.Errorf("routable %d tripped %v, want 3 and true", r.Routable(), r.Tripped())
	}

	next := []assembler.Endpoint{eps[0], eps[1]}
	next[1].Weight = 0.5
	ad := assembler.Delta{
		Service: "api", FromVersion: 10, Version: 11,
		Upserts: next[1:], Removals: []uuid.UUID{ids[2]}, RemovedZones: []string{"b"},
		Checksum: assembler.Checksum(next), Withdrawal: true, GeneratedAt: time.Now(),
	}
	if b, err = json.Marshal(ad); err != nil {
		t.Fatal(err)
	}
	var d resolver.Delta
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	if err := c.ApplyDelta(d); err != nil {
		t.Fatal(err)
	}
	if r := mustResolve(t, c, "api"); r.Version() != 11 || r.Routable() != 2 || r.Tripped() {
		t.Errorf("after delta: v%d routable %d tripped %v", r.Version(), r.Routable(), r.Tripped())
	}

	// An operator's override rides on the endpoint, outside the checksum,
	// and the resolver keeps who and why.
	over := []assembler.Endpoint{next[0], next[1]}
	over[0].State, over[0].Weight = "ineligible", 0
	over[0].Override = &assembler.Override{ID: uuid.MustParse("40000000-0000-0000-0000-000000000000"), Action: assembler.OverrideIneligible,
		Reason: "override 4…: mark_ineligible by operator:oscar until 2026-11-30T00:00:00Z: disk errors"}
	ad = assembler.Delta{Service: "api", FromVersion: 11, Version: 12, Upserts: over[:1], Checksum: assembler.Checksum(over), GeneratedAt: time.Now()}
	if b, err = json.Marshal(ad); err != nil {
		t.Fatal(err)
	}
	d = resolver.Delta{}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	if err := c.ApplyDelta(d); err != nil {
		t.Fatalf("a delta carrying an override: %v", err)
	}
	r := mustResolve(t, c, "api")
	if o := r.Endpoints()[0].Override; o == nil || o.Action != "mark_ineligible" || o.Reason != over[0].Override.Reason || r.Routable() != 1 {
		t.Errorf("override on the endpoint: %+v, routable %d", o, r.Routable())
	}
}
