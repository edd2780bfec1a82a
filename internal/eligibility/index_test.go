package eligibility

import (
	"time"

	"testing"

	"pgregory.net/rapid"
)

// TestIndexMatchesMap drives the engine's id index (through AddInstance and
// RemoveInstance, which keep it and the instance slice in step) and a Go map
// with the same random operations, including removals that must shift
// probe runs back, and requires them to agree after every step.
func TestIndexMatchesMap(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		e := NewEngine(Options{})
		e.SetService("svc", DefaultContract(Capabilities{Probe: true}))
		ref := map[InstanceID]bool{}
		// Ids that differ in few bytes, so hashes collide in the low bits
		// and probe runs form.
		ids := rapid.SliceOfNDistinct(rapid.Uint16(), 1, 2000, rapid.ID).Draw(t, "ids")
		key := func(v uint16) InstanceID {
			var id InstanceID
			id[0], id[15] = byte(v), byte(v>>8)
			return id
		}
		ops := rapid.IntRange(1, 3000).Draw(t, "ops")
		for range ops {
			id := key(ids[rapid.IntRange(0, len(ids)-1).Draw(t, "i")])
			if rapid.Bool().Draw(t, "add") {
				err := e.AddInstance(id, "svc", time.Unix(1e9, 0))
				if ref[id] != (err == ErrDuplicateInstance) {
					t.Fatalf("AddInstance(%v) = %v with ref %v", id, err, ref[id])
				}
				ref[id] = true
			} else {
				e.RemoveInstance(id)
				delete(ref, id)
			}
			if e.idx.n != len(ref) || len(e.inst) != len(ref) {
				t.Fatalf("index holds %d, instances %d, map %d", e.idx.n, len(e.inst), len(ref))
			}
		}
		for _, v := range ids {
			id := key(v)
			slot, ok := e.idx.get(id, e.inst)
			if ok != ref[id] || (ok && e.inst[slot].id != id) {
				t.Fatalf("get(%v) = %d,%v; map says %v", id, slot, ok, ref[id])
			}
		}
	})
}
