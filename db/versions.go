package db

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// VersionBlockSize is the view_versions sequence's increment: one nextval
// reserves this many versions.
const VersionBlockSize = 1000

// VersionBlocks hands out view versions from the region-wide view_versions
// sequence, reserving a block at a time, so versions only ever increase:
// across restarts, and between servers sharing the database (each holds its
// own block above everything handed out before it).
type VersionBlocks struct {
	pool *pgxpool.Pool

	mu        sync.Mutex
	next, end uint64 // [next, end) is what is left of the current block
}

// NewVersionBlocks returns an allocator over pool.
func NewVersionBlocks(pool *pgxpool.Pool) *VersionBlocks { return &VersionBlocks{pool: pool} }

// Next returns the first of n consecutive fresh versions (n at most
// VersionBlockSize). What is left of a block too small for n is skipped:
// versions need to increase, not to be dense.
func (v *VersionBlocks) Next(n int) (uint64, error) {
	if n < 1 || n > VersionBlockSize {
		return 0, fmt.Errorf("reserve %d view versions: want 1 to %d", n, VersionBlockSize)
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.end-v.next < uint64(n) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		first, err := New(v.pool).ViewVersionBlock(ctx)
		if err != nil {
			return 0, fmt.Errorf("reserve a block of view versions: %w", err)
		}
		v.next, v.end = uint64(first), uint64(first)+VersionBlockSize
	}
	first := v.next
	v.next += uint64(n)
	return first, nil
}
