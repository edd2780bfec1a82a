// Package fence binds the writes a replica makes as a service's owner to
// the tenure under which it decided to make them.
//
// Ownership (internal/ownership) tells a replica whether it owns a key
// now; a write happens later, after work, a queue or a pause. A replica
// frozen between the two (a stop-the-world pause, SIGSTOP, a VM
// migration) may wake to find that its shard moved, while its own
// memory still says it owns it: every statement it then makes as the
// owner is one the new owner makes too. So a writer takes a Token when
// it decides (Claim: the shard and the epoch of the tenure it holds at
// that moment) and checks that same token inside the write's
// transaction (Check, which runs ownership.Manager.Fence: the lease row
// must still name this replica under that epoch, and it stays locked
// FOR SHARE until the transaction ends, so a takeover waits for the
// write or the write fails). A fresh reading at write time would not
// do: a replica that lost a shard and took it back under a new epoch
// must not carry a decision made under the old one into the new.
//
// A write refused by the fence is dropped and counted
// (muster_fenced_writes_dropped_total{writer}), never retried as if the
// database were down: the new owner makes it, on its own evidence.
//
// A nil *Fence fences nothing: a replica without an ownership worker (a
// unit test's stack, a tool) acts alone.
package fence

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/ownership"
)

// ErrNotOwner is what Check returns (wrapped) when the tenure a token
// names has ended: the write must be dropped.
var ErrNotOwner = ownership.ErrNotOwner

// IsNotOwner reports whether err is a fence's refusal (and not, say, the
// database being away, which is worth a retry).
func IsNotOwner(err error) bool { return errors.Is(err, ownership.ErrNotOwner) }

// Token names the tenure under which a replica decided to write: the
// shard of the key and the epoch it held it under. The zero Token is
// unfenced: Check lets it through (a replica alone, or a write made while
// no replica owns the key; see ClaimUnlessOwned).
type Token struct {
	shard  int
	epoch  uint64
	fenced bool
}

// Fenced reports whether Check will test the token against the database.
func (t Token) Fenced() bool { return t.fenced }

// String is for logs: "shard 12 epoch 40", or "unfenced".
func (t Token) String() string {
	if !t.fenced {
		return "unfenced"
	}
	return fmt.Sprintf("shard %d epoch %d", t.shard, t.epoch)
}

// Ownership is what a Fence needs of the ownership manager
// (*ownership.Manager).
type Ownership interface {
	Owns(key string) (epoch uint64, ok bool)
	OwnedElsewhere(key string) bool
	Shards() int
	Fence(ctx context.Context, q *db.Queries, shard int, epoch uint64) error
}

// Fence hands out tokens and checks them. Its methods are safe for
// concurrent use, and on a nil *Fence (nothing is fenced).
type Fence struct {
	o       Ownership
	dropped *prometheus.CounterVec
}

// New returns a Fence over o; reg, when set, receives
// muster_fenced_writes_dropped_total.
func New(o Ownership, reg prometheus.Registerer) (*Fence, error) {
	if o == nil {
		return nil, errors.New("fence: Ownership is required")
	}
	f := &Fence{o: o, dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "muster_fenced_writes_dropped_total",
		Help: "Writes a replica decided as a service's owner and dropped because its tenure had ended by the time they reached the database (a deposed owner waking after a pause), by writer. The new owner makes them; nonzero is expected after a long pause, not otherwise.",
	}, []string{"writer"})}
	if reg != nil {
		if err := reg.Register(f.dropped); err != nil {
			return nil, fmt.Errorf("fence: register metrics: %w", err)
		}
	}
	return f, nil
}

// Claim returns the tenure under which this replica owns key now, or
// false when it does not (nor before the first reading of the leases).
// A nil Fence claims every key, unfenced.
func (f *Fence) Claim(key string) (Token, bool) {
	if f == nil {
		return Token{}, true
	}
	epoch, ok := f.o.Owns(key)
	if !ok {
		return Token{}, false
	}
	n := f.o.Shards()
	if n <= 0 {
		return Token{}, false
	}
	return Token{shard: ownership.ShardOf(key, n), epoch: epoch, fenced: true}, true
}

// ClaimUnlessOwned is Claim for what every replica observes and someone
// must write (the evaluator's windows and transitions): this replica's
// tenure when it owns key; an unfenced token when no other replica is
// known to own it (alone, a shard between owners, the leases unreadable),
// so nothing observed is lost for want of an owner; false when another
// replica owns it by the last reading of the leases.
func (f *Fence) ClaimUnlessOwned(key string) (Token, bool) {
	if f == nil {
		return Token{}, true
	}
	if t, ok := f.Claim(key); ok {
		return t, true
	}
	if f.o.OwnedElsewhere(key) {
		return Token{}, false
	}
	return Token{}, true
}

// Check runs inside the write's transaction (q from db.WithTx): it fails
// with an error IsNotOwner recognises when t's tenure has ended, and
// otherwise holds the lease row until the transaction ends. An unfenced
// token, or a nil Fence, passes.
func (f *Fence) Check(ctx context.Context, q *db.Queries, t Token) error {
	if f == nil || !t.fenced {
		return nil
	}
	return f.o.Fence(ctx, q, t.shard, t.epoch)
}

// Dropped counts n writes of writer dropped by the fence.
func (f *Fence) Dropped(writer string, n int) {
	if f == nil || n <= 0 {
		return
	}
	f.dropped.WithLabelValues(writer).Add(float64(n))
}

// CheckAll checks each distinct token of a batch once, in q's
// transaction, for a writer of many services' records (a COPY of windows
// or transitions): a record decided under a tenure that has ended passes
// unless another replica holds the shard now, as nobody else made it;
// one fencing query per tenure, not per row. It returns the tenures that
// have ended (their rows must be left out); an error that is not the
// fence's (the database away) is returned for the writer to keep its rows
// and retry. The lease rows are locked in shard order, all before the
// writer writes anything, so the owner's own renewal (an UPDATE of
// several of those rows) mostly meets them held and waits for the write
// to commit. Should the two cross while the checks run (the renewal
// holding one row and waiting for another), PostgreSQL ends one of them
// as a deadlock: a renewal that fails costs nothing (two rounds may), a
// write that fails is kept and retried.
func (f *Fence) CheckAll(ctx context.Context, q *db.Queries, tokens []Token) (ended map[Token]bool, err error) {
	distinct := map[Token]struct{}{}
	for _, t := range tokens {
		if f != nil && t.fenced {
			distinct[t] = struct{}{}
		}
	}
	sorted := slices.SortedFunc(maps.Keys(distinct), func(a, b Token) int {
		return cmp.Or(cmp.Compare(a.shard, b.shard), cmp.Compare(a.epoch, b.epoch))
	})
	ended = map[Token]bool{}
	for _, t := range sorted {
		err := f.Check(ctx, q, t)
		if h, ok := f.o.(holders); ok && IsNotOwner(err) {
			// The tenure ended. The records stand unless another
			// replica holds the shard now: the tenure lapsed through a
			// database outage, or this replica took the shard back, and
			// nobody else made them.
			other, herr := h.HeldByAnother(ctx, q, t.shard)
			switch {
			case herr != nil:
				return nil, herr
			case !other:
				err = nil
			}
		}
		switch {
		case IsNotOwner(err):
			ended[t] = true
		case err != nil:
			return nil, err
		}
	}
	return ended, nil
}

// holders is what CheckAll asks of an Ownership that can read who holds
// a shard now (*ownership.Manager does).
type holders interface {
	HeldByAnother(ctx context.Context, q *db.Queries, shard int) (bool, error)
}
