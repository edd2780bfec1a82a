package resolver_test

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/musterhq/muster/resolver"
)

// targetsOf lists "address share" for each target.
func targetsOf(s *resolver.Snapshot) string {
	var out []string
	for _, t := range s.Targets() {
		out = append(out, t.Address+" "+strconv.FormatFloat(t.Share, 'g', -1, 64))
	}
	return strings.Join(out, ", ")
}

// TestTargetsAreWhatPickChoosesFrom: the routable set with zone traffic
// weights multiplied in; ineligible, quarantined and zero-weight
// endpoints out, health unknown in, a tripped zone's every endpoint in,
// a drained zone out unless every routable endpoint is drained.
func TestTargetsAreWhatPickChoosesFrom(t *testing.T) {
	eps := []resolver.Endpoint{ep(0, "a", 1), ep(1, "a", 0.5), ep(2, "a", 1), ep(3, "b", 1), ep(4, "b", 0), ep(5, "b", 1)}
	eps[2].State = resolver.StateIneligible
	eps[5].Quarantined = true
	eps[1].Health = resolver.HealthUnknown
	v := viewOf("api", 7, eps)
	s, err := resolver.SnapshotOf(v, t0)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := targetsOf(s), "10.0.0.0 1, 10.0.0.1 0.5, 10.0.0.3 1"; got != want {
		t.Fatalf("targets %q, want %q", got, want)
	}

	// Zone b's guard tripped: its every positive-weight endpoint routes.
	tripped := viewOf("api", 8, eps)
	zb := tripped.Zones["b"]
	zb.Guard = resolver.GuardTripped
	tripped.Zones["b"] = zb
	if s, err = resolver.SnapshotOf(tripped, t0); err != nil {
		t.Fatal(err)
	}
	if got, want := targetsOf(s), "10.0.0.0 1, 10.0.0.1 0.5, 10.0.0.3 1, 10.0.0.5 1"; got != want {
		t.Fatalf("tripped zone b: targets %q, want %q", got, want)
	}

	// Zone a returning at 0.25, zone b drained: b is out, a's shares scale.
	shifted := withTraffic(withTraffic(viewOf("api", 9, eps), "a", 0.25), "b", 0)
	if s, err = resolver.SnapshotOf(shifted, t0); err != nil {
		t.Fatal(err)
	}
	if got, want := targetsOf(s), "10.0.0.0 0.25, 10.0.0.1 0.125"; got != want {
		t.Fatalf("a at 0.25, b drained: targets %q, want %q", got, want)
	}

	// Every zone drained: traffic weights are ignored, nothing stops.
	drained := withTraffic(withTraffic(viewOf("api", 10, eps), "a", 0), "b", 0)
	if s, err = resolver.SnapshotOf(drained, t0); err != nil {
		t.Fatal(err)
	}
	if got, want := targetsOf(s), "10.0.0.0 1, 10.0.0.1 0.5, 10.0.0.3 1"; got != want {
		t.Fatalf("every zone drained: targets %q, want %q", got, want)
	}
}

// TestSnapshotOfRefusesABadView: a wrong checksum or a duplicate id is
// refused with the resolver's errors.
func TestSnapshotOfRefusesABadView(t *testing.T) {
	v := view("api", 3, 4)
	v.Checksum = strings.Repeat("0", len(v.Checksum))
	if _, err := resolver.SnapshotOf(v, t0); !errors.Is(err, resolver.ErrChecksum) {
		t.Fatalf("bad checksum: %v, want ErrChecksum", err)
	}
	dup := view("api", 3, 4)
	dup.Endpoints[1].InstanceID = dup.Endpoints[0].InstanceID
	dup.Checksum = resolver.Checksum(dup.Endpoints)
	if _, err := resolver.SnapshotOf(dup, t0); !errors.Is(err, resolver.ErrInvalid) {
		t.Fatalf("duplicate id: %v, want ErrInvalid", err)
	}
}
