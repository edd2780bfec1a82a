package assembler

import (
	"errors"
	"fmt"
)

// CounterBits is how many low bits of a version the local counter holds;
// the epoch is in the bits above (see "Versions and deltas" in the package
// documentation).
const CounterBits = 32

// MaxEpoch is the largest epoch Versions accepts: it keeps every version
// below 2^53, so a JSON reader in any language (a float64 in JavaScript)
// reads it exactly.
const MaxEpoch = 1<<(53-CounterBits) - 1

// ErrEpochUsedUp is returned by Versions.Next when the current epoch has no
// room for the versions asked for and no next epoch has been handed in.
var ErrEpochUsedUp = errors.New("assembler: the version epoch is used up and no next epoch is held")

// Versions is the VersionSource muster publishes with: version =
// epoch<<CounterBits | counter, where the epoch is taken from the database
// once (at start, when ownership is acquired, when the counter runs out)
// and the counter is local. Next never does I/O and never reads a clock.
// It is not safe for concurrent use; the caller serialises (the publisher
// calls it under its lock, from Drain).
type Versions struct {
	epoch, counter uint64
	next           uint64 // the next epoch, taken ahead; 0 if none
}

// NewVersions returns a source whose first version is epoch<<CounterBits.
// epoch must be in [1, MaxEpoch] and above every epoch whose versions a
// client may hold.
func NewVersions(epoch uint64) (*Versions, error) {
	if err := checkEpoch(epoch); err != nil {
		return nil, err
	}
	return &Versions{epoch: epoch}, nil
}

func checkEpoch(e uint64) error {
	if e < 1 || e > MaxEpoch {
		return fmt.Errorf("assembler: version epoch %d outside [1, %d]", e, MaxEpoch)
	}
	return nil
}

// Next returns the first of n consecutive fresh versions. When the current
// epoch has no room for n it moves to the next epoch handed to AddEpoch
// (skipping what was left: versions need to increase, not to be dense); if
// there is none it returns ErrEpochUsedUp and hands out nothing.
func (v *Versions) Next(n int) (uint64, error) {
	if n < 1 || uint64(n) > 1<<CounterBits {
		return 0, fmt.Errorf("assembler: %d versions asked for at once", n)
	}
	if v.counter+uint64(n) > 1<<CounterBits {
		if v.next == 0 {
			return 0, fmt.Errorf("take %d versions in epoch %d: %w", n, v.epoch, ErrEpochUsedUp)
		}
		v.epoch, v.counter, v.next = v.next, 0, 0
	}
	first := v.epoch<<CounterBits | v.counter
	v.counter += uint64(n)
	return first, nil
}

// WantEpoch reports whether the caller should take the next epoch now (off
// the publishing path) and hand it to AddEpoch: more than half of the
// current epoch is used and none is held.
func (v *Versions) WantEpoch() bool { return v.next == 0 && v.counter > 1<<(CounterBits-1) }

// AddEpoch hands in the epoch to continue with once the current one is used
// up. It must be above the current epoch; a second one replaces the first
// only if it is higher (either is fresh, the higher one is safer).
func (v *Versions) AddEpoch(epoch uint64) error {
	if err := checkEpoch(epoch); err != nil {
		return err
	}
	if epoch <= v.epoch {
		return fmt.Errorf("assembler: next version epoch %d is not above the current %d", epoch, v.epoch)
	}
	v.next = max(v.next, epoch)
	return nil
}

// Floor returns the lowest version the current epoch hands out: every
// version a client may hold from an earlier epoch is below it.
func (v *Versions) Floor() uint64 { return v.epoch << CounterBits }
