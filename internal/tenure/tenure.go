// Package tenure records and looks up which replica may sign the views
// of a shard's services under which version epoch.
//
// A view's version is epoch<<assembler.CounterBits | counter, and the
// epoch comes from one PostgreSQL sequence, taken by a replica's
// publisher when it starts and after every gain of shards (it is not a
// shard lease's epoch: one publisher epoch covers every shard the
// replica holds). So when a publisher is handed an epoch it records,
// in one transaction, a tenure for each shard whose lease it holds then
// (shard, epoch, owner), sealed by the region's key; the lease rows are
// read FOR SHARE, so no take of them commits in between, and a tenure
// exists only for a shard its owner really held under that epoch.
//
// A replica that receives a relayed view believes it only if the view's
// (shard, epoch) is a tenure whose owner is the replica that signed the
// view (Book). A signed view outside every tenure is what a replica
// holding the key but publishing a shard it never held would send (a
// bug, or a key used by something that is not muster): it is refused.
package tenure

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/seal"
)

// sealDomain names a tenure's seal (seal.Message), so that no other
// seal can pass for one.
const sealDomain = "shard_tenures/v1"

// sealed is what a tenure's seal covers.
type sealed struct {
	Shard      int    `json:"shard"`
	Epoch      uint64 `json:"epoch"`
	Owner      string `json:"owner"`
	LeaseEpoch int64  `json:"lease_epoch"`
}

// Record records, in one transaction, a sealed tenure under epoch for
// every shard owner holds now, and prunes the tenures no view can still
// carry. It returns the shards recorded. A tenure already recorded (a
// retry under the same epoch) stays as it was.
func Record(ctx context.Context, pool *pgxpool.Pool, signer seal.Signer, owner string, epoch uint64) ([]int, error) {
	var shards []int
	err := db.WithTx(ctx, pool, func(q *db.Queries) error {
		held, err := q.ShardTenureHeld(ctx, owner)
		if err != nil {
			return fmt.Errorf("read the shards held: %w", err)
		}
		for _, h := range held {
			v := sealed{Shard: int(h.Shard), Epoch: epoch, Owner: owner, LeaseEpoch: h.Epoch}
			sig, kid, err := seal.Sign(ctx, signer, sealDomain, v)
			if err != nil {
				return err
			}
			if err := q.ShardTenureRecord(ctx, db.ShardTenureRecordParams{
				Shard: h.Shard, Epoch: int64(epoch), Owner: owner, LeaseEpoch: h.Epoch, Seal: sig, KeyID: kid,
			}); err != nil {
				return fmt.Errorf("record the tenure of shard %d under epoch %d: %w", h.Shard, epoch, err)
			}
			shards = append(shards, int(h.Shard))
		}
		if _, err := q.ShardTenurePrune(ctx); err != nil {
			return fmt.Errorf("prune tenures: %w", err)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("record tenures under epoch %d: %w", epoch, err)
	}
	return shards, nil
}

// ErrNone is returned by Book.Owner when no sealed tenure names the
// shard under the epoch: there is no row, or its seal does not verify
// (a row written outside muster).
var ErrNone = errors.New("no sealed tenure")

// Book looks tenures up, remembering each answer: a tenure never
// changes once recorded, so one found is never looked up again; one not
// found is not looked up again for NoneFor (a forger sending many views
// under one epoch costs one query per NoneFor, and a tenure recorded
// after a first look is found at the next).
type Book struct {
	pool    *pgxpool.Pool
	keys    func() seal.Keys
	timeout time.Duration
	// Now is the clock of the answers remembered as none: time.Now.
	Now func() time.Time

	mu    sync.Mutex
	known map[key]answer
	// failed is when a lookup last failed to read the database; for
	// UnreadableFor after it no lookup is tried.
	failed time.Time
}

// UnreadableFor is how long after a lookup that could not read the
// database (down, frozen, slow past the timeout) the Book answers every
// unknown tenure with ErrUnreadable at once, without trying again. The
// relay checks tenures on its read path: a database that hangs must cost
// it one timeout, not one per record, or a peer's new epoch would hold
// up every withdrawal it relays for a second each.
const UnreadableFor = 5 * time.Second

// ErrUnreadable is Owner's answer while a recent lookup could not read
// the database: the caller cannot tell, and must not take it as none.
var ErrUnreadable = errors.New("the tenures cannot be read now")

// NoneFor is how long a tenure not found is taken as none before it is
// looked up again.
const NoneFor = 10 * time.Second

type answer struct {
	owner string    // "" for none
	at    time.Time // when a none was read
}

type key struct {
	shard int
	epoch uint64
}

// maxKnown bounds the book; past it the answers are forgotten and
// looked up again as they are needed.
const maxKnown = 1 << 16

// NewBook returns a Book reading pool, believing tenures sealed by keys,
// each lookup bounded by timeout (1 s when zero).
func NewBook(pool *pgxpool.Pool, keys func() seal.Keys, timeout time.Duration) *Book {
	if timeout <= 0 {
		timeout = time.Second
	}
	return &Book{pool: pool, keys: keys, timeout: timeout, Now: time.Now, known: map[key]answer{}}
}

// Owner returns the replica that holds shard's tenure under epoch, or
// ErrNone; any other error means the database could not be read (the
// caller must not take that as "none").
func (b *Book) Owner(ctx context.Context, shard int, epoch uint64) (string, error) {
	k := key{shard, epoch}
	now := b.Now()
	b.mu.Lock()
	a, ok := b.known[k]
	b.mu.Unlock()
	switch {
	case ok && a.owner != "":
		return a.owner, nil
	case ok && now.Sub(a.at) < NoneFor:
		return "", ErrNone
	}
	b.mu.Lock()
	failed := b.failed
	b.mu.Unlock()
	if !failed.IsZero() && now.Sub(failed) < UnreadableFor {
		return "", fmt.Errorf("look up the tenure of shard %d under epoch %d: %w", shard, epoch, ErrUnreadable)
	}
	var owner string
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	row, err := db.New(b.pool).ShardTenureGet(ctx, db.ShardTenureGetParams{Shard: int32(shard), Epoch: int64(epoch)})
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		owner = ""
	case err != nil:
		b.mu.Lock()
		b.failed = b.Now()
		b.mu.Unlock()
		return "", fmt.Errorf("look up the tenure of shard %d under epoch %d: %w", shard, epoch, err)
	default:
		v := sealed{Shard: int(row.Shard), Epoch: uint64(row.Epoch), Owner: row.Owner, LeaseEpoch: row.LeaseEpoch}
		kid := row.KeyID
		if err := b.keys().Verify(sealDomain, v, row.Seal, &kid); err != nil {
			owner = ""
		} else {
			owner = row.Owner
		}
	}
	b.mu.Lock()
	if len(b.known) >= maxKnown {
		clear(b.known)
	}
	b.known[k] = answer{owner: owner, at: now}
	b.mu.Unlock()
	if owner == "" {
		return "", ErrNone
	}
	return owner, nil
}
