package eligibility

import "encoding/binary"

// index maps instance ids to their slot in Engine.inst. Observe is bound by
// memory latency over tens of thousands of instances, so the index is kept
// small enough to stay in cache: an open-addressed table with linear
// probing whose 8-byte entries hold a 32-bit hash and the slot. A hash match
// is confirmed against the instance's own id, which sits in the first cache
// line of the instance that Observe reads next anyway. Deletion shifts
// later entries back (no tombstones), so probe runs stay short however many
// instances come and go.
type index struct {
	e    []entry
	mask uint32
	n    int
}

type entry struct {
	hash uint32
	slot int32 // slot+1; 0 marks an empty entry
}

func hashID(id InstanceID) uint32 {
	// UUIDv7 leads with a timestamp; mix both halves so ids minted in the
	// same millisecond still spread.
	h := binary.LittleEndian.Uint64(id[:8]) ^ binary.LittleEndian.Uint64(id[8:])*0x9E3779B97F4A7C15
	h = (h ^ h>>29) * 0xBF58476D1CE4E5B9
	return uint32(h ^ h>>32)
}

// get finds id, confirming a hash match against inst[slot].id.
func (x *index) get(id InstanceID, inst []instance) (int32, bool) {
	if x.n == 0 {
		return 0, false
	}
	h := hashID(id)
	for i := h & x.mask; ; i = (i + 1) & x.mask {
		en := x.e[i]
		if en.slot == 0 {
			return 0, false
		}
		if en.hash == h && inst[en.slot-1].id == id {
			return en.slot - 1, true
		}
	}
}

// set maps id to slot; inst[slot].id must already be id, and inst holds
// every instance the index refers to.
func (x *index) set(id InstanceID, slot int32, inst []instance) {
	if (x.n+1)*4 > len(x.e)*3 { // keep the load factor under 3/4
		x.grow()
	}
	h := hashID(id)
	for i := h & x.mask; ; i = (i + 1) & x.mask {
		en := &x.e[i]
		switch {
		case en.slot == 0:
			*en = entry{h, slot + 1}
			x.n++
			return
		case en.hash == h && inst[en.slot-1].id == id:
			en.slot = slot + 1
			return
		}
	}
}

// delete removes id, which inst[slot] must still hold.
func (x *index) delete(id InstanceID, inst []instance) {
	if x.n == 0 {
		return
	}
	h := hashID(id)
	i := h & x.mask
	for ; ; i = (i + 1) & x.mask {
		en := x.e[i]
		if en.slot == 0 {
			return
		}
		if en.hash == h && inst[en.slot-1].id == id {
			break
		}
	}
	// Backward shift: move later entries of the probe run into the hole
	// when their home slot allows it.
	for j := (i + 1) & x.mask; x.e[j].slot != 0; j = (j + 1) & x.mask {
		home := x.e[j].hash & x.mask
		// The entry at j may move to i if i lies cyclically in [home, j).
		if (j-home)&x.mask >= (j-i)&x.mask {
			x.e[i] = x.e[j]
			i = j
		}
	}
	x.e[i] = entry{}
	x.n--
}

// grow doubles the table; entries keep their hashes, so no id is read.
func (x *index) grow() {
	size := max(len(x.e)*2, 1024)
	old := x.e
	x.e, x.mask = make([]entry, size), uint32(size-1)
	for _, en := range old {
		if en.slot == 0 {
			continue
		}
		for i := en.hash & x.mask; ; i = (i + 1) & x.mask {
			if x.e[i].slot == 0 {
				x.e[i] = en
				break
			}
		}
	}
}
