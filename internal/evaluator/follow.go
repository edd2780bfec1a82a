package evaluator

import (
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/google/uuid"

	"github.com/musterhq/muster/db"
)

// Each replica evaluates the services it owns (Config.Evaluates): their
// evidence is forwarded to it alone. It keeps its state of every other
// service warm from the observed windows their owners write every
// FlushEvery: every FollowEvery it reads the windows other replicas
// wrote since its last read and applies them as the rebuild at start
// does, as the instances' history. So a replica dealt a service (its
// owner died, or the balance moved it) decides on windows at most a
// flush and a follow behind, with the evidence the receiving replicas
// replay to it on top (internal/forward), instead of starting from what
// it knew at its start; and a read about any service on any replica is
// answered from the same windows.
//
// Rows are read by the time they were written on the database's clock
// (the writers' clocks may disagree by any amount), and applied at that
// time carried over to this replica's clock, up to that clock less
// Config.FollowMargin: a row is visible when its transaction commits but
// stamped when it began, and a window write is one COPY of at most
// windowChunk rows within DBTimeout. A write slower than that is missed
// here (a window is evidence, lossy by contract: ADR-02); one read twice,
// at the rebuild's edge, weighs its samples a little more and never
// drains.

// DefaultFollowMargin is how far behind the database's now a follower
// reads: a window write is one COPY of at most windowChunk rows within
// DBTimeout (3 s).
const DefaultFollowMargin = 5 * time.Second

// followPage bounds the rows one query returns.
const followPage = 20_000

// followCursor is where the last read ended: the write time, instance
// and class of the last row applied.
type followCursor struct {
	at    time.Time
	id    uuid.UUID
	class int16
}

// startFollowing sets where following begins: the database's settled
// time before the rebuild's replay, so what the replay could not see
// yet is read by the first follow.
func (e *Evaluator) startFollowing(ctx context.Context) error {
	if e.cfg.FollowEvery <= 0 {
		return nil
	}
	at, err := db.New(e.cfg.Pool).ObservedWindowsSettled(ctx, e.cfg.FollowMargin.Seconds())
	if err != nil {
		return fmt.Errorf("read the database's clock: %w", err)
	}
	e.followMu.Lock()
	e.follow = followCursor{at: at, class: math.MinInt16}
	e.followMu.Unlock()
	return nil
}

// followTimeout bounds one follow: a region's worth of windows written
// while this replica could not read them comes in pages within it.
const followTimeout = 10 * time.Second

// followLoop follows every FollowEvery until ctx ends, in a loop of its
// own: a slow read must not hold up flushes or registry refreshes.
func (e *Evaluator) followLoop(ctx context.Context) {
	t := time.NewTicker(e.cfg.FollowEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !e.cfg.DatabaseUp() {
			continue // the next one reads what this one would have
		}
		fctx, cancel := context.WithTimeout(ctx, followTimeout)
		if _, err := e.followWindows(fctx); err != nil && ctx.Err() == nil {
			e.log.Warn("follow the windows other replicas write", "err", err)
		}
		cancel()
	}
}

// followWindows reads the windows other replicas wrote since the last
// read and applies those of the services this replica does not evaluate.
// It returns how many it applied.
func (e *Evaluator) followWindows(ctx context.Context) (int, error) {
	e.followMu.Lock()
	defer e.followMu.Unlock()
	q := db.New(e.cfg.Pool)
	upto, err := q.ObservedWindowsSettled(ctx, e.cfg.FollowMargin.Seconds())
	if err != nil {
		return 0, fmt.Errorf("read the database's clock: %w", err)
	}
	if e.follow.at.IsZero() {
		e.follow = followCursor{at: upto, class: math.MinInt16}
	}
	// A window is placed at its write time on this replica's clock, not
	// at its end on the writer's: replicas' clocks may be far apart, and
	// a window stamped ahead of this clock would keep an instance from
	// falling silent here, one stamped behind would make it silent early.
	// The database's now was read just above; its offset from this
	// clock carries the write time over.
	now := e.cfg.Now()
	offset := now.Sub(upto.Add(e.cfg.FollowMargin))
	params := db.ObservedWindowsWrittenParams{Upto: upto, Reader: e.cfg.Replica, Lim: followPage}
	applied := 0
	for {
		params.AfterAt, params.AfterID, params.AfterClass = e.follow.at, e.follow.id, e.follow.class
		rows, err := q.ObservedWindowsWritten(ctx, params)
		if err != nil {
			return applied, fmt.Errorf("read observed windows written by other replicas: %w", err)
		}
		// In pieces, so that reports wait at most one piece for the lock.
		for piece := range slices.Chunk(rows, 2_000) {
			e.mu.Lock()
			for _, w := range piece {
				in, ok := e.instances[w.InstanceID]
				if !ok || (e.cfg.Evaluates != nil && e.cfg.Evaluates(in.service)) {
					continue // unknown here, or its evidence comes here live
				}
				e.replayWindow(db.ObservedWindowsSinceRow{InstanceID: w.InstanceID, Class: w.Class, WindowEnd: localTime(w.WrittenAt, offset, now),
					Successes: w.Successes, Failures: w.Failures, HardFailures: w.HardFailures, Unobservable: w.Unobservable,
					Reporters: w.Reporters}, e.replayer)
				applied++
			}
			e.mu.Unlock()
		}
		if n := len(rows); n > 0 {
			last := rows[n-1]
			e.follow = followCursor{at: last.WrittenAt, id: last.InstanceID, class: last.Class}
		}
		if len(rows) < followPage {
			break
		}
	}
	// Everything written up to upto is read.
	e.follow = followCursor{at: upto, id: uuid.Max, class: math.MaxInt16}
	e.metrics.windowsFollowed.Add(float64(applied))
	return applied, nil
}

// localTime is a database time at on this replica's clock (offset from
// the database's), never after now.
func localTime(at time.Time, offset time.Duration, now time.Time) time.Time {
	if t := at.Add(offset); t.Before(now) {
		return t
	}
	return now
}
