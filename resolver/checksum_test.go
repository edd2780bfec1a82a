package resolver_test

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/google/uuid"

	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/resolver"
)

// The vector was computed independently (a few lines of Python summing
// hashlib.sha256 digests of the netstring encodings modulo 2**256).
func TestChecksumFixedVector(t *testing.T) {
	eps := []resolver.Endpoint{
		{InstanceID: "6ba7b810-9dad-11d1-80b4-00c04fd430c8", Address: "10.0.0.2", Port: 8080, Zone: "eu-1b", State: "degraded", Weight: 0.1, Health: "unknown", Capabilities: []string{"grpc", "h2"}},
		{InstanceID: "00000000-0000-0000-0000-000000000001", Address: "10.0.0.1", Port: 443, Zone: "eu-1a", State: "eligible", Weight: 1, Health: "known", Quarantined: true},
	}
	if got, want := resolver.Checksum(eps), "bcea0b276f22ccd2d87117772bd82d1969ab65a7b98ae3af99267d36c5591ef6"; got != want {
		t.Errorf("Checksum = %s, want %s", got, want)
	}
	if got, want := resolver.Checksum(nil), "0000000000000000000000000000000000000000000000000000000000000000"; got != want {
		t.Errorf("Checksum(nil) = %s, want %s", got, want)
	}
}

func TestChecksumMatchesAssembler(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	weights := []float64{0, 1, 0.1, 1.0 / 3, 1e-9, 123456.789, math.SmallestNonzeroFloat64, 0.5}
	strs := []string{"", "a", "eu-west-1a", "ünïcode", "with,comma:colon", "10.0.0.1", "::1"}
	for trial := range 200 {
		n := r.IntN(50)
		switch trial {
		case 0:
			n = 5000
		case 1:
			n = 20_000 // hashed in parallel parts
		}
		aeps := make([]assembler.Endpoint, n)
		reps := make([]resolver.Endpoint, n)
		for i := range aeps {
			var u uuid.UUID
			for k := range u {
				u[k] = byte(r.UintN(256))
			}
			caps := make([]string, r.IntN(4))
			for k := range caps {
				caps[k] = strs[r.IntN(len(strs))]
			}
			if r.IntN(5) == 0 {
				caps = nil
			}
			a := assembler.Endpoint{
				InstanceID: u, Address: strs[r.IntN(len(strs))], Port: r.IntN(70000),
				Zone: strs[r.IntN(len(strs))], State: []string{"unknown", "eligible", "degraded", "ineligible"}[r.IntN(4)],
				Weight: weights[r.IntN(len(weights))], Health: []string{"known", "unknown"}[r.IntN(2)],
				Capabilities: caps, Quarantined: r.IntN(3) == 0,
			}
			aeps[i] = a
			reps[i] = resolver.Endpoint{
				InstanceID: a.InstanceID.String(), Address: a.Address, Port: a.Port, Zone: a.Zone, State: a.State,
				Weight: a.Weight, Health: a.Health, Capabilities: a.Capabilities, Quarantined: a.Quarantined,
			}
		}
		if got, want := resolver.Checksum(reps), assembler.Checksum(aeps); got != want {
			t.Fatalf("trial %d (%d endpoints): resolver %s, assembler %s", trial, n, got, want)
		}
	}
}

// Deltas are checked incrementally (the held sum adjusted for the touched
// endpoints); a delta whose checksum is the full recomputation of the
// resulting set must apply, including removals of absent ids, an id both
// removed and upserted, and upserts that change nothing.
func TestDeltaChecksumIncremental(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	c, err := resolver.NewCache([]string{"api"}, resolver.WithMaxShrink(1))
	if err != nil {
		t.Fatal(err)
	}
	cur := map[string]resolver.Endpoint{}
	for i := range 50 {
		cur[id(i)] = resolver.Endpoint{InstanceID: id(i), Address: "10.0.0.1", Port: 80 + i, Zone: "a", State: "eligible", Weight: 1, Health: "known"}
	}
	set := func() []resolver.Endpoint {
		out := make([]resolver.Endpoint, 0, len(cur))
		for _, e := range cur {
			out = append(out, e)
		}
		return out
	}
	v := resolver.View{Service: "api", Version: 1, Endpoints: set(), Checksum: resolver.Checksum(set()),
		Zones: map[string]resolver.Zone{"a": {Guard: resolver.GuardOK, Total: 50, Eligible: 50}}}
	if err := c.ApplyView(v); err != nil {
		t.Fatal(err)
	}
	for version := uint64(2); version < 300; version++ {
		d := resolver.Delta{Service: "api", FromVersion: version - 1, Version: version}
		for range r.IntN(6) {
			k := id(r.IntN(80)) // some absent
			d.Removals = append(d.Removals, k)
			delete(cur, k)
		}
		ups := map[string]bool{}
		for range r.IntN(6) {
			k := id(r.IntN(80))
			if ups[k] {
				continue
			}
			ups[k] = true
			e := resolver.Endpoint{InstanceID: k, Address: "10.0.0.2", Port: r.IntN(3) + 80, Zone: "a", State: "eligible", Weight: float64(r.IntN(3) + 1), Health: "known"}
			d.Upserts = append(d.Upserts, e)
			cur[k] = e
		}
		if len(cur) == 0 {
			break
		}
		d.Checksum = resolver.Checksum(set())
		if err := c.ApplyDelta(d); err != nil {
			t.Fatalf("v%d: %v", version, err)
		}
		wrong := d
		wrong.FromVersion, wrong.Version = version, version+1
		wrong.Upserts = []resolver.Endpoint{{InstanceID: id(1), Address: "x", Zone: "a", Weight: 1}}
		wrong.Removals = nil
		if err := c.ApplyDelta(wrong); !errors.Is(err, resolver.ErrChecksum) {
			t.Fatalf("v%d: a delta with a stale checksum applied: %v", version+1, err)
		}
		res, err := c.Resolve("api")
		if err != nil {
			t.Fatal(err)
		}
		if got, want := res.Checksum(), resolver.Checksum(res.Endpoints()); got != want || len(res.Endpoints()) != len(cur) {
			t.Fatalf("v%d: held checksum %s, endpoints hash to %s; %d endpoints, want %d", version, got, want, len(res.Endpoints()), len(cur))
		}
	}
}
