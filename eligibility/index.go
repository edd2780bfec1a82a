package eligibility

import "encoding/binary"

// index maps instance ids to their slot in Engine.inst. It is an
// open-addressed table with linear probing and the keys stored inline, so a
// lookup costs one cache miss where Go's map costs two (control word, then
// slot): Observe is bound by memory latency, and the lookup is a third of it.
// Deletion shifts later entries back (no tombstones), so probe sequences
// stay short however many instances come and go.
type index struct {
	e    []entry
	mask uint64
	n    int
}

// entry keeps the key beside its value: one cache line answers a probe.
type entry struct {
	id   InstanceID
	slot int32 // slot+1; 0 marks an empty entry
}

func (x *index) hash(id InstanceID) uint64 {
	// UUIDv7 leads with a timestamp; mix both halves so ids minted in the
	// same millisecond still spread.
	h := binary.LittleEndian.Uint64(id[:8]) ^ binary.LittleEndian.Uint64(id[8:])*0x9E3779B97F4A7C15
	return (h ^ h>>29) * 0xBF58476D1CE4E5B9
}

func (x *index) get(id InstanceID) (int32, bool) {
	if x.n == 0 {
		return 0, false
	}
	for i := x.hash(id) & x.mask; ; i = (i + 1) & x.mask {
		en := &x.e[i]
		if en.slot == 0 {
			return 0, false
		}
		if en.id == id {
			return en.slot - 1, true
		}
	}
}

func (x *index) set(id InstanceID, slot int32) {
	if (x.n+1)*4 > len(x.e)*3 { // keep the load factor under 3/4
		x.grow()
	}
	for i := x.hash(id) & x.mask; ; i = (i + 1) & x.mask {
		switch {
		case x.e[i].slot == 0:
			x.e[i] = entry{id, slot + 1}
			x.n++
			return
		case x.e[i].id == id:
			x.e[i].slot = slot + 1
			return
		}
	}
}

func (x *index) delete(id InstanceID) {
	if x.n == 0 {
		return
	}
	i := x.hash(id) & x.mask
	for ; ; i = (i + 1) & x.mask {
		if x.e[i].slot == 0 {
			return
		}
		if x.e[i].id == id {
			break
		}
	}
	// Backward-shift: move later entries of the probe run into the hole
	// when their home slot allows it.
	for j := (i + 1) & x.mask; x.e[j].slot != 0; j = (j + 1) & x.mask {
		home := x.hash(x.e[j].id) & x.mask
		// The entry at j may move to i if i lies cyclically in [home, j).
		if (j-home)&x.mask >= (j-i)&x.mask {
			x.e[i] = x.e[j]
			i = j
		}
	}
	x.e[i] = entry{}
	x.n--
}

func (x *index) grow() {
	size := max(len(x.e)*2, 1024)
	old := *x
	*x = index{e: make([]entry, size), mask: uint64(size - 1)}
	for _, en := range old.e {
		if en.slot != 0 {
			x.set(en.id, en.slot-1)
		}
	}
}
