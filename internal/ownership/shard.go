package ownership

import "hash/fnv"

// ShardOf returns the shard, in [0, shards), that service belongs to.
//
// It is FNV-1a (64 bits) of the name, passed through a finaliser before
// the modulo: FNV-1a's low bits depend only on the low bits of each byte
// ("api-1" and "api-q" would share every shard below 64 otherwise), and
// the finaliser spreads every input bit over the low ones. The function
// is part of the protocol between replicas: two replicas that computed it
// differently would each own some services twice, so it must never
// change while any replica runs (TestShardOfIsStable pins it). shards must
// be positive.
func ShardOf(service string, shards int) int {
	if shards <= 0 {
		panic("ownership: ShardOf needs a positive shard count")
	}
	h := fnv.New64a()
	h.Write([]byte(service))
	return int(mix(h.Sum64()) % uint64(shards))
}

// mix is the splitmix64 finaliser: a bijection on 64 bits in which every
// input bit changes each output bit with probability about one half.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// score ranks replica for shard in the rendezvous order the balance uses
// to choose between candidates: a stable pseudo-random number per pair,
// so each replica prefers different shards and a shard's preferred
// replicas do not all change when one replica comes or goes.
func score(replica string, shard int) uint64 {
	h := fnv.New64a()
	h.Write([]byte(replica))
	h.Write([]byte{0, byte(shard >> 24), byte(shard >> 16), byte(shard >> 8), byte(shard)})
	return mix(h.Sum64())
}
