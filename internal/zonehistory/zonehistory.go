// Package zonehistory samples each zone's routing state across the
// estate (how many instances are eligible out of the guard's capacity,
// how many are unknown) every interval and keeps the last day, for the
// admin UI's per-zone sparklines; the same record keeps each prober's
// reach (targets reported on, of those assigned). It is a record of what
// muster published, never an input to a verdict.
//
// # One writer, every reader
//
// With a database (Config.Pool) the record lives in table
// history_samples, so a restart (every deploy) keeps it and every
// replica of the region draws the same points: one replica writes each
// kind of series, the one whose tenure Config.Fence claims for the
// kind's key (the owner of that key's shard, as for a reconciliation
// source), checked inside the write's transaction so a deposed writer
// waking from a pause writes nothing. The writer samples what it serves,
// and every replica serves every view, so its reading is the region's.
// Every replica reads the table. When the writer dies its shard moves
// within the lease bound (9 s) and the new owner writes from its next
// tick; a new writer waits out the interval from the last row, so a
// handover never draws two points a moment apart.
//
// Every replica also keeps its own samples in memory: while the
// database does not answer, the sparklines are drawn from them (this
// replica's view, which a restart loses) rather than not at all.
//
// Rows are not sealed: a sample can move no traffic (no verdict, guard
// or removal reads it), so a forged row can only draw a wrong line that
// the published views and the transitions contradict.
package zonehistory

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/fence"
	"github.com/musterhq/muster/internal/worker"
)

// Counts is one zone's state at one time, summed over services.
type Counts struct {
	// Eligible and Total are the guard's: instances in rotation out of
	// the zone's capacity.
	Eligible, Total int
	// Unknown counts instances muster has no verdict for yet or hears
	// nothing about (routable, health unknown).
	Unknown int
	// State is a label of the time, if any (a prober's "outage" or
	// "suspect").
	State string
}

// Fraction is Eligible / Total (1 for an empty zone: nothing is missing).
func (c Counts) Fraction() float64 {
	if c.Total == 0 {
		return 1
	}
	return float64(c.Eligible) / float64(c.Total)
}

// Sample is a zone's counts at a time.
type Sample struct {
	At time.Time
	Counts
}

// Series is one zone's samples, oldest first.
type Series struct {
	Zone    string
	Samples []Sample
}

// Kinds of series, the column kind of history_samples.
const (
	KindZone   = "zone"
	KindProber = "prober"
)

// maxRows bounds one reading of the table: a day of 30 s samples of
// 30 zones or probers.
const maxRows = 100_000

// Config configures a History.
type Config struct {
	// Read returns every zone's counts now (app: summed over the
	// published views).
	Read func() map[string]Counts
	// Every is the sampling interval: 30 s. Keep is how long samples are
	// kept: 24 h.
	Every, Keep time.Duration
	Now         func() time.Time
	// Pool, when set, keeps the record in history_samples under Kind
	// (KindZone or KindProber); without it the record is this process's
	// memory.
	Pool *pgxpool.Pool
	Kind string
	// Fence decides who writes (the owner of Key's shard: Key defaults
	// to "history:" + Kind). A nil Fence writes unfenced: a replica
	// alone.
	Fence *fence.Fence
	Key   string
	// Timeout bounds one database round (5 s).
	Timeout time.Duration
	Logger  *slog.Logger
}

// History keeps each zone's samples. Its methods are safe for concurrent
// use.
type History struct {
	cfg    Config
	log    *slog.Logger
	runner worker.Runner

	mu    sync.Mutex
	zones map[string][]Sample
	// dbDown is whether the last read of the table failed (logged once
	// per outage).
	dbDown bool
}

// New returns a History; nothing is sampled until Start or SampleNow.
func New(cfg Config) (*History, error) {
	if cfg.Read == nil {
		return nil, errors.New("zonehistory: Read is required")
	}
	if cfg.Pool != nil && cfg.Kind != KindZone && cfg.Kind != KindProber {
		return nil, fmt.Errorf("zonehistory: kind %q is neither %q nor %q", cfg.Kind, KindZone, KindProber)
	}
	if cfg.Every <= 0 {
		cfg.Every = 30 * time.Second
	}
	if cfg.Keep <= 0 {
		cfg.Keep = 24 * time.Hour
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Key == "" {
		cfg.Key = "history:" + cfg.Kind
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 5 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &History{cfg: cfg, log: cfg.Logger.With("worker", "history", "kind", cfg.Kind), zones: map[string][]Sample{}}, nil
}

// Start samples now and every interval until Stop.
func (h *History) Start(ctx context.Context) error {
	return h.runner.Start(ctx, func(ctx context.Context) {
		tick := func(ctx context.Context) {
			if err := h.SampleNow(ctx); err != nil {
				h.log.Warn("history sample not written; the next tick tries again", "err", err)
			}
		}
		tick(ctx)
		worker.Every(ctx, h.cfg.Every, tick)
	})
}

// Stop stops sampling and waits.
func (h *History) Stop() { h.runner.Stop() }

// SampleNow records every zone's counts now in memory and drops samples
// older than Keep (a zone that no longer appears keeps its samples until
// they age out); with a database, the writer of the kind also writes
// them to the table (unless the last row is under half an interval old)
// and deletes its rows older than Keep. An error is the table's: the
// memory holds the sample whatever happens.
func (h *History) SampleNow(ctx context.Context) error {
	// Microseconds: what PostgreSQL keeps, so memory and table agree.
	now := h.cfg.Now().Truncate(time.Microsecond)
	counts := h.cfg.Read()
	h.remember(now, counts)
	if h.cfg.Pool == nil {
		return nil
	}
	token, ok := h.cfg.Fence.Claim(h.cfg.Key)
	if !ok {
		return nil // another replica writes this kind
	}
	ctx, cancel := context.WithTimeout(ctx, h.cfg.Timeout)
	defer cancel()
	err := db.WithTx(ctx, h.cfg.Pool, func(q *db.Queries) error {
		if err := h.cfg.Fence.Check(ctx, q, token); err != nil {
			return err
		}
		last, err := q.HistorySampleLatest(ctx, h.cfg.Kind)
		if err != nil {
			return fmt.Errorf("read the last sample: %w", err)
		}
		if now.Sub(last) < h.cfg.Every/2 {
			return nil
		}
		for zone, c := range counts {
			if err := q.HistorySampleInsert(ctx, db.HistorySampleInsertParams{Kind: h.cfg.Kind, Series: zone, At: now,
				Eligible: int32(c.Eligible), Total: int32(c.Total), Unknown: int32(c.Unknown), State: c.State}); err != nil {
				return fmt.Errorf("insert %s: %w", zone, err)
			}
		}
		if _, err := q.HistorySampleDeleteBefore(ctx, db.HistorySampleDeleteBeforeParams{Kind: h.cfg.Kind, Before: now.Add(-h.cfg.Keep)}); err != nil {
			return fmt.Errorf("delete old samples: %w", err)
		}
		return nil
	})
	if fence.IsNotOwner(err) {
		h.cfg.Fence.Dropped("history", 1)
		return nil
	}
	if err != nil {
		return fmt.Errorf("write %s history: %w", h.cfg.Kind, err)
	}
	return nil
}

func (h *History) remember(now time.Time, counts map[string]Counts) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for zone, c := range counts {
		h.zones[zone] = append(h.zones[zone], Sample{At: now, Counts: c})
	}
	cut := now.Add(-h.cfg.Keep)
	for zone, ss := range h.zones {
		i := 0
		for i < len(ss) && ss[i].At.Before(cut) {
			i++
		}
		if i == len(ss) {
			delete(h.zones, zone)
			continue
		}
		if i > 0 {
			h.zones[zone] = slices.Clone(ss[i:])
		}
	}
}

// Since returns each zone's samples at or after since, zones by name:
// the table's, which every replica reads alike, or while the database
// does not answer this replica's memory.
func (h *History) Since(ctx context.Context, since time.Time) []Series {
	if h.cfg.Pool != nil {
		out, err := h.read(ctx, since)
		h.mu.Lock()
		switch {
		case err != nil && !h.dbDown:
			h.log.Warn("history unreadable; drawing this replica's own samples until the database answers", "err", err)
		case err == nil && h.dbDown:
			h.log.Info("history readable again")
		}
		h.dbDown = err != nil
		h.mu.Unlock()
		if err == nil {
			return out
		}
	}
	return h.memorySince(since)
}

func (h *History) read(ctx context.Context, since time.Time) ([]Series, error) {
	ctx, cancel := context.WithTimeout(ctx, h.cfg.Timeout)
	defer cancel()
	rows, err := db.New(h.cfg.Pool).HistorySampleListSince(ctx, db.HistorySampleListSinceParams{Kind: h.cfg.Kind, Since: since, Lim: maxRows})
	if err != nil {
		return nil, fmt.Errorf("read %s history: %w", h.cfg.Kind, err)
	}
	by := map[string][]Sample{}
	for _, r := range rows {
		by[r.Series] = append(by[r.Series], Sample{At: r.At, Counts: Counts{Eligible: int(r.Eligible), Total: int(r.Total), Unknown: int(r.Unknown), State: r.State}})
	}
	return sorted(by), nil
}

func (h *History) memorySince(since time.Time) []Series {
	h.mu.Lock()
	defer h.mu.Unlock()
	by := map[string][]Sample{}
	for zone, ss := range h.zones {
		i, _ := slices.BinarySearchFunc(ss, since, func(s Sample, t time.Time) int { return s.At.Compare(t) })
		if i < len(ss) {
			by[zone] = slices.Clone(ss[i:])
		}
	}
	return sorted(by)
}

func sorted(by map[string][]Sample) []Series {
	out := make([]Series, 0, len(by))
	for zone, ss := range by {
		out = append(out, Series{Zone: zone, Samples: ss})
	}
	slices.SortFunc(out, func(a, b Series) int {
		switch {
		case a.Zone < b.Zone:
			return -1
		case a.Zone > b.Zone:
			return 1
		}
		return 0
	})
	return out
}
