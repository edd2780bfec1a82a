package eligibility

import (
	"testing"

	"pgregory.net/rapid"
)

// TestIndexMatchesMap drives the open-addressed index and a Go map with the
// same random operations, including deletes that must shift probe runs back,
// and requires them to agree after every step.
func TestIndexMatchesMap(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var x index
		ref := map[InstanceID]int32{}
		// Few distinct ids, many of them colliding in their low bytes, so
		// probe runs and backward shifts are exercised.
		ids := rapid.SliceOfNDistinct(rapid.Uint16(), 1, 3000, rapid.ID).Draw(t, "ids")
		key := func(v uint16) InstanceID {
			var id InstanceID
			id[0], id[15] = byte(v), byte(v>>8)
			return id
		}
		ops := rapid.IntRange(1, 5000).Draw(t, "ops")
		for range ops {
			id := key(ids[rapid.IntRange(0, len(ids)-1).Draw(t, "i")])
			switch rapid.IntRange(0, 2).Draw(t, "op") {
			case 0, 1:
				v := rapid.Int32Range(0, 1<<20).Draw(t, "v")
				x.set(id, v)
				ref[id] = v
			case 2:
				x.delete(id)
				delete(ref, id)
			}
			if x.n != len(ref) {
				t.Fatalf("index holds %d, map %d", x.n, len(ref))
			}
		}
		for _, v := range ids {
			id := key(v)
			got, ok := x.get(id)
			want, wok := ref[id]
			if ok != wok || got != want {
				t.Fatalf("get(%v) = %d,%v; map says %d,%v", id, got, ok, want, wok)
			}
		}
	})
}
