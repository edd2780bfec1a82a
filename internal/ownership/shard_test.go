package ownership_test

import (
	"fmt"
	"testing"

	"github.com/musterhq/muster/internal/ownership"
)

// TestShardOfIsStable pins the hash (FNV-1a 64, the splitmix64
// finaliser, modulo; the values were checked against an independent
// implementation). It is part of the protocol between replicas: a change
// while any replica runs gives services two owners, so if this fails,
// the change needs every replica stopped first.
func TestShardOfIsStable(t *testing.T) {
	t.Parallel()
	for service, want := range map[string]int{
		"": 27, "api": 15, "api-1": 13, "api-q": 12, "payments": 31, "checkout.eu-west-1": 14,
	} {
		if got := ownership.ShardOf(service, 64); got != want {
			t.Errorf("ShardOf(%q, 64) = %d, want %d", service, got, want)
		}
	}
}

// TestShardOfSpreads: 6,400 service names land on every one of 64
// shards, none with more than twice its share. Names that differ only in
// bytes with the same low bits (FNV-1a alone would send "api-1" and
// "api-q" to one shard below 64) are spread too.
func TestShardOfSpreads(t *testing.T) {
	t.Parallel()
	const shards, names = 64, 6400
	count := make([]int, shards)
	for i := range names {
		s := ownership.ShardOf(fmt.Sprintf("svc-%d", i), shards)
		if s < 0 || s >= shards {
			t.Fatalf("shard %d out of range", s)
		}
		count[s]++
	}
	for s, n := range count {
		if n == 0 || n > 2*names/shards {
			t.Errorf("shard %d holds %d of %d names", s, n, names)
		}
	}
	// Four names whose last bytes agree in their low 6 bits.
	seen := map[int]bool{}
	for _, c := range []byte{0x01, 0x41, 0x81, 0xc1} {
		seen[ownership.ShardOf("api-"+string([]byte{c}), shards)] = true
	}
	if len(seen) < 2 {
		t.Errorf("names differing only in the high bits of one byte all share one shard")
	}
}

// TestShardOfWithoutAllocations: the evidence routes' hash is ShardOf's.
func TestShardOfWithoutAllocations(t *testing.T) {
	for i := range 10000 {
		svc := fmt.Sprintf("svc-%d-%x", i, i*7919)
		if got, want := ownership.ShardOfFast(svc, 64), ownership.ShardOf(svc, 64); got != want {
			t.Fatalf("%s: %d, ShardOf says %d", svc, got, want)
		}
	}
	if n := testing.AllocsPerRun(100, func() { ownership.ShardOfFast("payments-api", 64) }); n != 0 {
		t.Errorf("%v allocations per call, want 0", n)
	}
}
