package assembler_test

import (
	"reflect"
	"testing"
	"time"

	"github.com/musterhq/muster/internal/assembler"
)

// Every field a view's endpoint carries reaches clients when it changes
// (issue 14): for each field of assembler.Endpoint a change of its input
// publishes a delta whose upsert shows the new value. The list is
// checked against the struct by reflection, so a field added later
// without a case here fails the test instead of going stale in views.
func TestEveryEndpointFieldChangeIsPublished(t *testing.T) {
	t.Parallel()
	// Zone a is tripped (its one instance is out of rotation), so
	// quarantined and lease-expired instances are published there; zone
	// b has one instance in rotation.
	base := func() assembler.ServiceInput {
		out := inst(1, "a", inelg)
		out.Weight = 0
		return svc("web", 0.5, []assembler.InstanceInput{out, inst(2, "b", elig)})
	}
	type change struct {
		target int // which instance (1 or 2) changes
		mutate func(s *assembler.ServiceInput, x *assembler.InstanceInput)
	}
	cases := map[string]change{
		"InstanceID": {}, // identity: a different id is a different endpoint
		"Address":    {2, func(_ *assembler.ServiceInput, x *assembler.InstanceInput) { x.Address = "10.9.9.9" }},
		"Port":       {2, func(_ *assembler.ServiceInput, x *assembler.InstanceInput) { x.Port = 9999 }},
		"Zone":       {2, func(_ *assembler.ServiceInput, x *assembler.InstanceInput) { x.Zone = "c" }},
		"State":      {2, func(_ *assembler.ServiceInput, x *assembler.InstanceInput) { x.State = degr }},
		"Weight":     {2, func(_ *assembler.ServiceInput, x *assembler.InstanceInput) { x.Weight = 0.5 }},
		"Health":     {2, func(_ *assembler.ServiceInput, x *assembler.InstanceInput) { x.HealthKnown = false }},
		"Capabilities": {2, func(s *assembler.ServiceInput, _ *assembler.InstanceInput) {
			s.Capabilities = []string{"probe", "readiness", "self"}
		}},
		"Quarantined": {1, func(_ *assembler.ServiceInput, x *assembler.InstanceInput) { x.Quarantined = true }},
		"Override": {2, func(_ *assembler.ServiceInput, x *assembler.InstanceInput) {
			x.Override = &assembler.Override{Action: assembler.OverrideEligible, Reason: "known wrong"}
		}},
		"LeaseExpired": {1, func(_ *assembler.ServiceInput, x *assembler.InstanceInput) { x.LeaseExpired = true }},
	}
	typ := reflect.TypeFor[assembler.Endpoint]()
	for i := range typ.NumField() {
		name := typ.Field(i).Name
		c, ok := cases[name]
		if !ok {
			t.Errorf("assembler.Endpoint.%s has no case here: say how a change of it reaches the view", name)
			continue
		}
		if c.mutate == nil {
			continue
		}
		t.Run(name, func(t *testing.T) {
			a := assembler.New(assembler.Options{})
			vs := &versions{}
			in := base()
			a.Update(in, t0)
			settle(t, a, t0, vs)
			before := byID(mustView(t, a, "web"))[id(c.target)]

			in = base()
			c.mutate(&in, &in.Instances[c.target-1])
			now := t0.Add(time.Hour)
			a.Update(in, now)
			pubs := settle(t, a, now, vs)
			if len(pubs) != 1 || pubs[0].Delta == nil {
				t.Fatalf("a change of %s published %d versions, want one delta", name, len(pubs))
			}
			var after *assembler.Endpoint
			for i := range pubs[0].Delta.Upserts {
				if pubs[0].Delta.Upserts[i].InstanceID == id(c.target) {
					after = &pubs[0].Delta.Upserts[i]
				}
			}
			if after == nil {
				t.Fatalf("the delta for a change of %s does not upsert instance %d: %+v", name, c.target, pubs[0].Delta)
			}
			if reflect.DeepEqual(reflect.ValueOf(before).FieldByName(name).Interface(), reflect.ValueOf(*after).FieldByName(name).Interface()) {
				t.Fatalf("the delta for a change of %s carries the old value %v", name, reflect.ValueOf(before).FieldByName(name).Interface())
			}
		})
	}
}
