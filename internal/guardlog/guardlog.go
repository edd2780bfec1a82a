// Package guardlog keeps the history of fraction-guard trips (ADR-08) in
// PostgreSQL, table guard_events: the publisher of every replica reports
// the trips and clears it sees, and the admin UI reads a service's
// episodes back.
//
// Several replicas see the same trip at about the same moment, so the
// writes are idempotent (migration 000007): a zone has at most one open
// episode, a clear closes only that one, and a trip that began before the
// zone's last recorded clear is the same episode seen late by a slower
// replica and is dropped. What is not recorded: the clear of an episode
// that was open when the last replica holding it stopped; readers compare
// open episodes with the live guard status (see Episode.Open).
package guardlog

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/worker"
)

// Event is a zone's guard tripping (Tripped) or clearing.
type Event struct {
	Service, Zone string
	Tripped       bool
	At            time.Time
	// Detail says why the guard tripped, with the numbers (trips only).
	Detail string
}

// Episode is one recorded trip of a zone's guard.
type Episode struct {
	Service, Zone string
	TrippedAt     time.Time
	Detail        string
	// ClearedAt is when the guard cleared; nil while the episode is open
	// as far as the log knows.
	ClearedAt *time.Time
}

// Log writes guard events in the background and lists episodes.
type Log struct {
	pool   *pgxpool.Pool
	log    *slog.Logger
	mu     sync.Mutex
	queue  []Event
	wake   chan struct{}
	runner worker.Runner
}

// New returns a stopped Log; Record queues until Start.
func New(pool *pgxpool.Pool, logger *slog.Logger) *Log {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Log{pool: pool, log: logger.With("component", "guardlog"), wake: make(chan struct{}, 1)}
}

// flushTimeout bounds one background flush: a database that stops
// answering must not park the writer; the events stay queued.
const flushTimeout = 5 * time.Second

// maxQueue bounds what is kept while the database is unreachable; the
// oldest events are dropped first.
const maxQueue = 10000

// Record queues events for writing, in order; it never blocks on the
// database (the publisher calls it from its loop).
func (l *Log) Record(events []Event) {
	if len(events) == 0 {
		return
	}
	l.mu.Lock()
	l.queue = append(l.queue, events...)
	if n := len(l.queue) - maxQueue; n > 0 {
		l.log.Warn("guard event queue full; dropping the oldest", "dropped", n)
		l.queue = l.queue[n:]
	}
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// Start writes queued events until ctx ends or Stop is called.
func (l *Log) Start(ctx context.Context) error {
	return l.runner.Start(ctx, func(ctx context.Context) {
		retry := time.NewTicker(5 * time.Second)
		defer retry.Stop()
		for {
			select {
			case <-ctx.Done():
				fctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_ = l.Flush(fctx)
				cancel()
				return
			case <-l.wake:
			case <-retry.C:
			}
			fctx, cancel := context.WithTimeout(ctx, flushTimeout)
			err := l.Flush(fctx)
			cancel()
			if err != nil && ctx.Err() == nil {
				l.log.Warn("write guard events; keeping them for the next try", "err", err)
			}
		}
	})
}

// Stop ends the writer after a last flush.
func (l *Log) Stop() { l.runner.Stop() }

// Flush writes the queued events now, in one transaction; on failure they
// stay queued.
func (l *Log) Flush(ctx context.Context) error {
	l.mu.Lock()
	batch := l.queue
	l.queue = nil
	l.mu.Unlock()
	if len(batch) == 0 {
		return nil
	}
	err := db.WithTx(ctx, l.pool, func(q *db.Queries) error {
		for _, e := range batch {
			var err error
			if e.Tripped {
				_, err = q.GuardEventTrip(ctx, db.GuardEventTripParams{Service: e.Service, Zone: e.Zone, TrippedAt: e.At, TripDetail: e.Detail})
			} else {
				_, err = q.GuardEventClear(ctx, db.GuardEventClearParams{Service: e.Service, Zone: e.Zone, ClearedAt: e.At})
			}
			if err != nil {
				return fmt.Errorf("guard event %s/%s: %w", e.Service, e.Zone, err)
			}
		}
		return nil
	})
	if err != nil {
		l.mu.Lock()
		l.queue = append(batch, l.queue...)
		l.mu.Unlock()
	}
	return err
}

// List returns a service's episodes, newest first, at most limit.
func (l *Log) List(ctx context.Context, service string, limit int) ([]Episode, error) {
	rows, err := db.New(l.pool).GuardEventList(ctx, db.GuardEventListParams{Service: service, Lim: int32(limit)})
	if err != nil {
		return nil, fmt.Errorf("list guard events of %s: %w", service, err)
	}
	out := make([]Episode, len(rows))
	for i, r := range rows {
		out[i] = Episode{Service: r.Service, Zone: r.Zone, TrippedAt: r.TrippedAt, Detail: r.TripDetail, ClearedAt: r.ClearedAt}
	}
	return out, nil
}
