package db

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/musterhq/muster/internal/worker"
)

// MonitorConfig configures a Monitor.
type MonitorConfig struct {
	// Pool is pinged. Give the monitor a pool of its own (one connection):
	// on the shared pool a burst of slow requests holding every connection
	// would read as an outage.
	Pool *pgxpool.Pool
	// Interval between pings: 1 s.
	Interval time.Duration
	// Timeout bounds one ping: 1 s.
	Timeout time.Duration
	// DownAfter is how many pings in a row must time out before a database
	// that answers nothing is declared down: 2, so one slow ping on a busy
	// server is not an outage. A refused or broken connection is an outage
	// at once.
	DownAfter int
	// Now defaults to time.Now.
	Now func() time.Time
	// Clock is this replica's clock, the one its components stamp and
	// judge time by (Now by default): every ping reads PostgreSQL's clock
	// too, and the difference is this replica's skew (ClockSkew).
	Clock func() time.Time
	// SkewAlarm is the skew, either way, above which ClockSkew says the
	// alarm clock_skew is open: 2 s by default (DefaultSkewAlarm).
	SkewAlarm time.Duration
	Logger    *slog.Logger
	// Registerer receives muster_database_up and
	// muster_clock_skew_seconds; nil registers nowhere.
	Registerer prometheus.Registerer
}

// Validate checks the configuration and fills defaults.
func (c *MonitorConfig) Validate() error {
	if c.Pool == nil {
		return errors.New("db monitor: Pool is required")
	}
	if c.Interval == 0 {
		c.Interval = time.Second
	}
	if c.Timeout == 0 {
		c.Timeout = time.Second
	}
	if c.DownAfter == 0 {
		c.DownAfter = 2
	}
	if c.Interval < 0 || c.Timeout < 0 || c.DownAfter < 0 {
		return fmt.Errorf("db monitor: Interval %s, Timeout %s and DownAfter %d must not be negative", c.Interval, c.Timeout, c.DownAfter)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Clock == nil {
		c.Clock = c.Now
	}
	if c.SkewAlarm == 0 {
		c.SkewAlarm = DefaultSkewAlarm
	}
	if c.SkewAlarm < 0 {
		return fmt.Errorf("db monitor: SkewAlarm %s must not be negative", c.SkewAlarm)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Monitor is the worker that watches whether PostgreSQL answers. It pings
// every Interval with a short deadline; requests that need the database
// fail fast while it is down (server), and other workers read when it came
// back (UpSince) to tell the database's absence from their subjects'.
//
// It starts up: it is built right after the pool's first successful ping.
type Monitor struct {
	cfg    MonitorConfig
	log    *slog.Logger
	runner worker.Runner
	poke   chan struct{}

	mu        sync.Mutex
	up        bool
	upSince   time.Time
	downSince time.Time
	lastErr   error
	timeouts  int // pings in a row that timed out
	skew      ClockSkew
}

// DefaultSkewAlarm is MonitorConfig.SkewAlarm's default.
const DefaultSkewAlarm = 2 * time.Second

// ClockSkew is this replica's clock measured against PostgreSQL's, the
// clock every replica of the region shares: lease times are the
// database's, so the skew between two replicas is the difference of
// theirs.
type ClockSkew struct {
	// Skew is this replica's clock minus PostgreSQL's at the midpoint of
	// the round trip: positive when this replica's clock is ahead.
	Skew time.Duration
	// RoundTrip is the ping's round trip: Skew is known within half of it.
	RoundTrip time.Duration
	// At is when it was measured (this replica's clock); zero: never.
	At time.Time
	// Over: |Skew| exceeds MonitorConfig.SkewAlarm (the clock_skew
	// alarm is open); Since is the first measurement of this run over it.
	Over  bool
	Since time.Time
	// Threshold is MonitorConfig.SkewAlarm.
	Threshold time.Duration
}

// NewMonitor returns a stopped Monitor that considers the database up
// since now.
func NewMonitor(cfg MonitorConfig) (*Monitor, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	m := &Monitor{cfg: cfg, log: cfg.Logger.With("worker", "db-monitor"), poke: make(chan struct{}, 1),
		up: true, upSince: cfg.Now()}
	if cfg.Registerer != nil {
		g := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "muster_database_up", Help: "1 while PostgreSQL answers this replica's pings, 0 while it does not (alarm database_unreachable).",
		}, func() float64 {
			if m.Up() {
				return 1
			}
			return 0
		})
		skew := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "muster_clock_skew_seconds",
			Help: "This replica's clock minus PostgreSQL's, measured at every ping at the midpoint of its round trip (alarm clock_skew above the threshold, 2 s by default).",
		}, func() float64 { return m.ClockSkew().Skew.Seconds() })
		for _, c := range []prometheus.Collector{g, skew} {
			if err := cfg.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("db monitor: register metrics: %w", err)
			}
		}
	}
	return m, nil
}

// Start pings until ctx ends or Stop is called.
func (m *Monitor) Start(ctx context.Context) error { return m.runner.Start(ctx, m.loop) }

// Stop ends the loop and waits. Safe to call twice or before Start.
func (m *Monitor) Stop() { m.runner.Stop() }

func (m *Monitor) loop(ctx context.Context) {
	t := time.NewTicker(m.cfg.Interval)
	defer t.Stop()
	for {
		m.runOnce(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-m.poke:
		}
	}
}

// RunOnce pings once and records the outcome (the loop calls it every
// Interval; tests call it to step).
func (m *Monitor) RunOnce(ctx context.Context) { m.runOnce(ctx) }

// runOnce pings once, reading PostgreSQL's clock, and records the
// outcome and this replica's skew.
func (m *Monitor) runOnce(ctx context.Context) {
	pctx, cancel := context.WithTimeout(ctx, m.cfg.Timeout)
	start := time.Now()
	local := m.cfg.Clock()
	dbNow, err := New(m.cfg.Pool).LeaseClockNow(pctx)
	rtt := time.Since(start)
	cancel()
	if ctx.Err() != nil {
		return // stopping: the ping's failure says nothing of the database
	}
	if err != nil {
		m.failed(err, IsTimeout(err))
		return
	}
	m.measured(local.Add(rtt/2).Sub(dbNow), rtt, local)
	m.mu.Lock()
	m.timeouts = 0
	if !m.up {
		m.up, m.upSince, m.lastErr = true, m.cfg.Now(), nil
		m.log.Info("database reachable again", "down_for", m.upSince.Sub(m.downSince).Round(time.Millisecond))
	}
	m.mu.Unlock()
}

// failed records a failed attempt to reach the database. A timeout counts
// towards DownAfter; anything else is down at once.
func (m *Monitor) failed(err error, timeout bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lastErr = err
	if timeout {
		m.timeouts++
		if m.timeouts < m.cfg.DownAfter {
			return
		}
	}
	if m.up {
		m.up, m.downSince = false, m.cfg.Now()
		m.log.Warn("database unreachable; writes answer 503 and views are served from memory until it answers again", "err", err)
	}
}

// measured records one reading of the skew, logging when it crosses the
// threshold either way.
func (m *Monitor) measured(skew, rtt time.Duration, at time.Time) {
	m.mu.Lock()
	was := m.skew
	over := skew > m.cfg.SkewAlarm || skew < -m.cfg.SkewAlarm
	since := was.Since
	if over && !was.Over {
		since = at
	}
	m.skew = ClockSkew{Skew: skew, RoundTrip: rtt, At: at, Over: over, Since: since, Threshold: m.cfg.SkewAlarm}
	m.mu.Unlock()
	switch {
	case over && !was.Over:
		m.log.Warn("this replica's clock is off PostgreSQL's (clock_skew); leases and forwarded evidence do not depend on it",
			"skew", skew.Round(time.Millisecond), "round_trip", rtt.Round(time.Microsecond), "threshold", m.cfg.SkewAlarm)
	case !over && was.Over:
		m.log.Info("this replica's clock is back within the threshold of PostgreSQL's", "skew", skew.Round(time.Millisecond))
	}
}

// ClockSkew is the last measurement of this replica's clock against
// PostgreSQL's (At is zero before the first).
func (m *Monitor) ClockSkew() ClockSkew {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.skew
}

// Unavailable reports whether err means PostgreSQL could not be reached
// or did not answer in time (IsUnavailable), for callers that may not
// import this package's classification themselves.
func (m *Monitor) Unavailable(err error) bool { return IsUnavailable(err) }

// Observe is told of an error a request met on the database. One that says
// the database is unreachable (refused, broken) marks it down at once; one
// that ran out of time asks for a ping now instead, since a single slow
// query does not make an outage. Other errors are ignored.
func (m *Monitor) Observe(err error) {
	switch {
	case err == nil || !IsUnavailable(err) || errors.Is(err, context.Canceled):
	case IsTimeout(err):
		select {
		case m.poke <- struct{}{}:
		default:
		}
	default:
		m.failed(err, false)
	}
}

// Up reports whether the database answered the last ping.
func (m *Monitor) Up() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.up
}

// UpSince is when the database last became reachable: while Up, the start
// of the current reachable period (the monitor's creation at first).
// Workers that must not count the database's absence against anyone (the
// lease reaper's grace) measure from it.
func (m *Monitor) UpSince() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.upSince
}

// DownSince is when the database last became unreachable: while not Up,
// the start of the current outage; zero if it never was.
func (m *Monitor) DownSince() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.downSince
}

// Err is the last failure seen while the database is down; nil while up.
func (m *Monitor) Err() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.up {
		return nil
	}
	return m.lastErr
}
