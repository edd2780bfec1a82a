package resolver_test

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/google/uuid"

	"github.com/musterhq/muster/assembler"
	"github.com/musterhq/muster/resolver"
)

// The vector was computed with assembler.Checksum.
func TestChecksumFixedVector(t *testing.T) {
	eps := []resolver.Endpoint{
		{InstanceID: "6ba7b810-9dad-11d1-80b4-00c04fd430c8", Address: "10.0.0.2", Port: 8080, Zone: "eu-1b", State: "degraded", Weight: 0.1, Health: "unknown", Capabilities: []string{"grpc", "h2"}},
		{InstanceID: "00000000-0000-0000-0000-000000000001", Address: "10.0.0.1", Port: 443, Zone: "eu-1a", State: "eligible", Weight: 1, Health: "known", Quarantined: true},
	}
	if got, want := resolver.Checksum(eps), "be12ce4078443db78b75182a2af65431fa49ca91ae3557d679b7aa4211572903"; got != want {
		t.Errorf("Checksum = %s, want %s", got, want)
	}
	if got, want := resolver.Checksum(nil), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"; got != want {
		t.Errorf("Checksum(nil) = %s, want %s", got, want)
	}
}

func TestChecksumMatchesAssembler(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	weights := []float64{0, 1, 0.1, 1.0 / 3, 1e-9, 123456.789, math.SmallestNonzeroFloat64, 0.5}
	strs := []string{"", "a", "eu-west-1a", "ünïcode", "with,comma:colon", "10.0.0.1", "::1"}
	for trial := range 200 {
		n := r.IntN(50)
		if trial == 0 {
			n = 5000 // crosses the 32 KiB flush boundary
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
