package assembler_test

import (
	"errors"
	"testing"
	"time"

	"github.com/musterhq/muster/internal/assembler"
)

// Versions: epoch in the high bits, counter below; strictly increasing;
// the next epoch is asked for past half and taken when the counter has no
// room left; without one, Next fails and hands out nothing.
func TestEpochVersions(t *testing.T) {
	t.Parallel()
	const epoch = 7
	v, err := assembler.NewVersions(epoch)
	if err != nil {
		t.Fatal(err)
	}
	if got := v.Floor(); got != epoch<<32 {
		t.Fatalf("Floor = %d, want %d", got, uint64(epoch)<<32)
	}
	first, err := v.Next(3)
	if err != nil || first != epoch<<32 {
		t.Fatalf("Next(3) = %d, %v; want %d", first, err, uint64(epoch)<<32)
	}
	if next, _ := v.Next(1); next != first+3 {
		t.Fatalf("Next(1) = %d after %d..%d", next, first, first+2)
	}
	if v.WantEpoch() {
		t.Fatal("WantEpoch at the start of an epoch")
	}
	// Use up just over half: the next epoch is wanted.
	last, err := v.Next(1 << 31)
	if err != nil {
		t.Fatal(err)
	}
	if !v.WantEpoch() {
		t.Fatal("WantEpoch false past half the counter")
	}
	// The rest of the epoch, to the last version.
	rest := int(1<<32 - (last - epoch<<32) - 1<<31)
	end, err := v.Next(rest)
	if err != nil || end+uint64(rest)-1 != epoch<<32|(1<<32-1) {
		t.Fatalf("Next(%d) = %d, %v: does not end the epoch", rest, end, err)
	}
	if _, err := v.Next(1); !errors.Is(err, assembler.ErrEpochUsedUp) {
		t.Fatalf("Next past the epoch with none held: %v", err)
	}
	if err := v.AddEpoch(epoch); err == nil {
		t.Fatal("AddEpoch accepted the current epoch")
	}
	if err := v.AddEpoch(assembler.MaxEpoch + 1); err == nil {
		t.Fatal("AddEpoch accepted an epoch past MaxEpoch")
	}
	if err := v.AddEpoch(9); err != nil {
		t.Fatal(err)
	}
	if v.WantEpoch() {
		t.Fatal("WantEpoch with an epoch held")
	}
	got, err := v.Next(2)
	if err != nil || got != 9<<32 {
		t.Fatalf("Next after the epoch ran out = %d, %v; want %d", got, err, uint64(9)<<32)
	}
	if v.Floor() != 9<<32 {
		t.Fatalf("Floor after moving = %d", v.Floor())
	}
	for _, n := range []int{0, -1} {
		if _, err := v.Next(n); err == nil {
			t.Fatalf("Next(%d) accepted", n)
		}
	}
	for _, e := range []uint64{0, assembler.MaxEpoch + 1} {
		if _, err := assembler.NewVersions(e); err == nil {
			t.Fatalf("NewVersions(%d) accepted", e)
		}
	}
	// The largest version there can be is exact in a float64 (JSON).
	top, err := assembler.NewVersions(assembler.MaxEpoch)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := top.Next(1<<32 - 1); err != nil {
		t.Fatal(err)
	}
	largest, _ := top.Next(1)
	if largest >= 1<<53 || uint64(float64(largest)) != largest {
		t.Fatalf("largest version %d is not exact as a float64", largest)
	}
}

// The assembler publishes through Versions like any source: across an
// epoch change, versions and deltas stay continuous per service.
func TestDrainAcrossEpochs(t *testing.T) {
	t.Parallel()
	v, err := assembler.NewVersions(1)
	if err != nil {
		t.Fatal(err)
	}
	// Leave room for exactly one more version in epoch 1.
	if _, err := v.Next(1<<32 - 1); err != nil {
		t.Fatal(err)
	}
	a := assembler.New(assembler.Options{})
	ins := zoned(0, elig, 4, "a")
	a.Update(svc("web", 0.5, ins), t0)
	p := settle(t, a, t0, v)
	if len(p) != 1 || p[0].View.Version != 1<<32|(1<<32-1) {
		t.Fatalf("first version %+v", p)
	}
	a.Update(svc("web", 0.5, set(ins, inelg, 1)), t0.Add(time.Hour))
	if _, err := a.Drain(t0.Add(2*time.Hour), v); !errors.Is(err, assembler.ErrEpochUsedUp) {
		t.Fatalf("Drain with the epoch used up: %v", err)
	}
	if err := v.AddEpoch(2); err != nil {
		t.Fatal(err)
	}
	p = drainAt(t, a, t0.Add(2*time.Hour), v)
	if len(p) != 1 || p[0].View.Version != 2<<32 || p[0].Delta.FromVersion != 1<<32|(1<<32-1) || len(p[0].Delta.Removals) != 1 {
		t.Fatalf("after the epoch change: %+v", p[0].Delta)
	}
}
