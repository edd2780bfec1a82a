package stream

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/ownership"
	"github.com/musterhq/muster/internal/worker"
)

// CensusConfig configures a Census.
type CensusConfig struct {
	Pool *pgxpool.Pool
	// Replica names this replica in table stream_population. Keep it
	// stable across restarts (a host name, a StatefulSet pod name), so a
	// restarted replica finds its own previous peak rather than adding a
	// second row next to it.
	Replica string
	// Hub is counted; Admission is told the population.
	Hub       *Hub
	Admission *Admission
	// Interval between reports: the admission window (10 s) by default.
	Interval time.Duration
	// Horizon is how long a replica's report counts towards the expected
	// population: 15 min by default.
	Horizon time.Duration
	// Live is how recent a report must be for its replica to count as
	// live (sharing the admission budget): 3 intervals by default.
	Live time.Duration
	// Timeout bounds each database round trip: 2 s by default. Nothing
	// waits on the census but its own loop, and Start's first pass.
	Timeout time.Duration
	// Retention is how long rows of replicas that stopped reporting are
	// kept before the census prunes them: 24 h by default.
	Retention time.Duration
	// ReplicaTTL is how recent a replica's heartbeat in table replicas
	// must be for its subscribers to count: the shard lease TTL
	// (ownership.DefaultTTL by default), so the census and the ownership
	// balance agree on which replicas are alive. A replica that died
	// stops counting within it, though its peak is younger than Horizon:
	// its clients reconnect through the live replicas and count there.
	ReplicaTTL time.Duration
	// Members, when set, lists the replicas whose row in table replicas
	// the ownership manager believed at its last reading (its seal
	// verified): only they count, besides this replica. A row written
	// by hand, with a population row beside it, would otherwise size the
	// region's admission. nil: every replica with a heartbeat counts.
	Members func() []string
	Now     func() time.Time
	Logger  *slog.Logger
}

// Validate checks the configuration and fills defaults.
func (c *CensusConfig) Validate() error {
	switch {
	case c.Pool == nil:
		return errors.New("census: Pool is required")
	case c.Replica == "":
		return errors.New("census: Replica is required")
	case c.Hub == nil || c.Admission == nil:
		return errors.New("census: Hub and Admission are required")
	}
	if c.Interval == 0 {
		c.Interval = c.Admission.Window()
	}
	if c.Horizon == 0 {
		c.Horizon = 15 * time.Minute
	}
	if c.Live == 0 {
		c.Live = 3 * c.Interval
	}
	if c.Timeout == 0 {
		c.Timeout = 2 * time.Second
	}
	if c.Retention == 0 {
		c.Retention = 24 * time.Hour
	}
	if c.ReplicaTTL == 0 {
		c.ReplicaTTL = ownership.DefaultTTL
	}
	if c.ReplicaTTL < 0 {
		return fmt.Errorf("census: ReplicaTTL must not be negative (got %s)", c.ReplicaTTL)
	}
	if c.Interval < 0 || c.Horizon < c.Interval || c.Live < c.Interval || c.Timeout < 0 || c.Retention < c.Horizon {
		return fmt.Errorf("census: want 0 < Interval <= Live and Horizon <= Retention (got %s, %s, %s, %s)", c.Interval, c.Live, c.Horizon, c.Retention)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Census is the worker that persists this replica's subscriber count and
// reads the region's expected population back into admission (ADR-13):
// every Interval it writes (replica, subscribers) to stream_population,
// where the row keeps the replica's recent peak, and reads the sum of the
// peaks of every live replica seen within Horizon (live: its heartbeat in
// table replicas is within ReplicaTTL, or it is this replica). A restarted
// process so sizes admission by the clients about to come back, which it
// has not seen, and a dead replica's clients, who come back through the
// live ones, are not counted twice.
//
// The database is not on any request's path: when it is away the last
// reading stays in force (for Horizon), and until a first reading
// succeeds admission is sized by this process's own peak, which the
// census says once in its log.
type Census struct {
	cfg    CensusConfig
	log    *slog.Logger
	runner worker.Runner

	mu      sync.Mutex
	started bool
	stopped bool
	failing bool // the last pass failed (log the change, not every tick)
}

// NewCensus returns a stopped Census.
func NewCensus(cfg CensusConfig) (*Census, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Census{cfg: cfg, log: cfg.Logger.With("worker", "census", "replica", cfg.Replica)}, nil
}

// Start makes a first pass before it returns (bounded by Timeout per
// round trip), so the first admissions after a restart are already sized
// by the population, then reports every Interval until ctx ends or Stop
// is called.
func (c *Census) Start(ctx context.Context) error {
	c.mu.Lock()
	c.started = true
	c.mu.Unlock()
	if err := c.runOnce(ctx); err != nil {
		c.noteFailure(err, true)
	} else {
		st := c.cfg.Admission.Stats()
		c.log.Info("census: admission sized by the expected population", "expected", st.Population.Expected,
			"replicas", st.Population.Replicas, "live", st.Population.Live, "budget", st.Budget, "window", c.cfg.Admission.Window())
	}
	return c.runner.Start(ctx, c.loop)
}

// Stop ends the loop, then writes this replica's count a last time (call
// it before the hub drains its subscribers). Safe to call twice or before
// Start.
func (c *Census) Stop() {
	c.runner.Stop()
	c.mu.Lock()
	last := c.started && !c.stopped
	c.stopped = true
	c.mu.Unlock()
	if last {
		if err := c.write(context.Background(), c.cfg.Now()); err != nil {
			c.log.Warn("census: last report failed", "err", err)
		}
	}
}

func (c *Census) loop(ctx context.Context) {
	worker.Every(ctx, c.cfg.Interval, func(ctx context.Context) {
		if err := c.runOnce(ctx); err != nil && ctx.Err() == nil {
			c.noteFailure(err, false)
		}
	})
}

// runOnce reports this replica's count, reads the region's expected
// population and hands it to admission.
func (c *Census) runOnce(ctx context.Context) error {
	now := c.cfg.Now()
	if err := c.write(ctx, now); err != nil {
		return err
	}
	p, err := c.read(ctx, now)
	if err != nil {
		return err
	}
	c.cfg.Admission.SetPopulation(p, now)
	c.mu.Lock()
	was := c.failing
	c.failing = false
	c.mu.Unlock()
	if was {
		c.log.Info("census: population known again", "expected", p.Expected, "replicas", p.Replicas, "live", p.Live)
	}
	return nil
}

func (c *Census) write(ctx context.Context, now time.Time) error {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	n, _ := c.cfg.Hub.Subscribers()
	q := db.New(c.cfg.Pool)
	err := q.StreamPopulationPut(ctx, db.StreamPopulationPutParams{
		Replica: c.cfg.Replica, Subscribers: int32(n), At: now, PeakSince: now.Add(-c.cfg.Horizon),
	})
	if err != nil {
		return fmt.Errorf("report %d subscribers of replica %s: %w", n, c.cfg.Replica, err)
	}
	if _, err := q.StreamPopulationPrune(ctx, now.Add(-c.cfg.Retention)); err != nil {
		return fmt.Errorf("prune stream population: %w", err)
	}
	return nil
}

func (c *Census) read(ctx context.Context, now time.Time) (Population, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	q := PopulationQuery{Self: c.cfg.Replica, At: now, Horizon: c.cfg.Horizon, Live: c.cfg.Live, ReplicaTTL: c.cfg.ReplicaTTL}
	if c.cfg.Members != nil {
		q.OnlyMembers, q.Members = true, append([]string{}, c.cfg.Members()...)
	}
	return ReadPopulation(ctx, c.cfg.Pool, q)
}

// noteFailure logs a failed pass when the census starts failing (or at
// start), not on every tick of an outage.
func (c *Census) noteFailure(err error, atStart bool) {
	c.mu.Lock()
	was := c.failing
	c.failing = true
	c.mu.Unlock()
	if was && !atStart {
		return
	}
	st := c.cfg.Admission.Stats()
	if st.PopulationKnown {
		c.log.Warn("census: cannot reach PostgreSQL; admission keeps the last population read",
			"expected", st.Population.Expected, "budget", st.Budget, "err", err)
		return
	}
	c.log.Warn("census: expected population unknown (PostgreSQL unreachable); admission is sized by this process's own peak until it answers",
		"peak", st.Peak, "budget", st.Budget, "err", err)
}

// PopulationQuery says whose population ReadPopulation reads.
type PopulationQuery struct {
	// Self is the replica asking: it counts as live whatever its
	// heartbeat (a restarted replica reads before its first one).
	Self string
	// At is the reading's time; reports within Horizon before it count,
	// and those within Live say which replicas share the budget.
	At            time.Time
	Horizon, Live time.Duration
	// ReplicaTTL: only replicas whose heartbeat in table replicas is
	// this recent (the database's clock) count, besides Self.
	ReplicaTTL time.Duration
	// OnlyMembers counts, besides Self, only the replicas in Members
	// (CensusConfig.Members).
	OnlyMembers bool
	Members     []string
}

// ReadPopulation reads the region's expected population: the sum over
// live replicas that reported within q.Horizon of their recent peak, and
// how many of them reported within q.Live.
func ReadPopulation(ctx context.Context, pool *pgxpool.Pool, q PopulationQuery) (Population, error) {
	row, err := db.New(pool).StreamPopulationExpected(ctx, db.StreamPopulationExpectedParams{
		Since: q.At.Add(-q.Horizon), LiveSince: q.At.Add(-q.Live), Self: q.Self, TtlMs: q.ReplicaTTL.Milliseconds(),
		OnlyMembers: q.OnlyMembers, Members: q.Members,
	})
	if err != nil {
		return Population{}, fmt.Errorf("read expected stream population: %w", err)
	}
	return Population{Expected: int(row.Expected), Replicas: int(row.Replicas), Live: int(row.Live)}, nil
}

// ForgetReplica deletes a replica's reports, so a benchmark that reuses a
// replica name starts without the peak of an earlier run.
func ForgetReplica(ctx context.Context, pool *pgxpool.Pool, replica string) error {
	if _, err := db.New(pool).StreamPopulationForget(ctx, replica); err != nil {
		return fmt.Errorf("forget stream population of %s: %w", replica, err)
	}
	return nil
}
