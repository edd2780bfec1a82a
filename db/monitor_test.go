package db_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/db/dbtest"
	"github.com/musterhq/muster/internal/wait"
)

// TestMonitorFollowsTheDatabase: stopping PostgreSQL flips the monitor
// down (at once: the connection is refused), starting it again flips it
// up with a later UpSince; freezing it (SIGSTOP) reads as down too, after
// DownAfter pings time out.
func TestMonitorFollowsTheDatabase(t *testing.T) {
	t.Parallel()
	pc := dbtest.NewCluster(t)
	ctx := context.Background()
	pool, err := db.OpenPool(ctx, db.PoolConfig{URL: pc.URL(), MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	reg := prometheus.NewRegistry()
	m, err := db.NewMonitor(db.MonitorConfig{Pool: pool, Interval: 50 * time.Millisecond, Timeout: 300 * time.Millisecond, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	gauge := func() float64 {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatalf("gather: %v", err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "muster_database_up" {
				return mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		t.Fatalf("no muster_database_up in %v", mfs)
		return 0
	}
	if !m.Up() || gauge() != 1 {
		t.Fatal("a new monitor is not up")
	}
	firstUp := m.UpSince()
	if err := m.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Stop)

	pc.Stop(t)
	wait.For(t, 5*time.Second, "down after a stop", func() bool { return !m.Up() })
	if gauge() != 0 || m.Err() == nil || m.DownSince().Before(firstUp) {
		t.Fatalf("down: gauge %v, err %v, down since %s", gauge(), m.Err(), m.DownSince())
	}
	pc.Start(t)
	wait.For(t, 10*time.Second, "up after a restart", m.Up)
	if !m.UpSince().After(m.DownSince()) || gauge() != 1 || m.Err() != nil {
		t.Fatalf("up again: up since %s, down since %s, gauge %v, err %v", m.UpSince(), m.DownSince(), gauge(), m.Err())
	}

	upAgain := m.UpSince()
	thaw := pc.Freeze(t)
	frozenAt := time.Now()
	wait.For(t, 5*time.Second, "down while frozen", func() bool { return !m.Up() })
	t.Logf("frozen server detected as down after %s", time.Since(frozenAt).Round(time.Millisecond))
	thaw()
	wait.For(t, 10*time.Second, "up after a thaw", m.Up)
	if !m.UpSince().After(upAgain) {
		t.Fatalf("UpSince did not move after the thaw: %s", m.UpSince())
	}
}

// TestQueriesEndOnAFrozenServer: with every PostgreSQL process stopped, a
// query under a context deadline returns when the deadline passes, one
// without any returns after the I/O backstop, both reported as
// unavailable; after the thaw the pool works again.
func TestQueriesEndOnAFrozenServer(t *testing.T) {
	t.Parallel()
	pc := dbtest.NewCluster(t)
	ctx := context.Background()
	pool, err := db.OpenPool(ctx, db.PoolConfig{URL: pc.URL(), IOTimeout: time.Second, MaxConns: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	// A connection idle longer than the backstop is still good.
	if _, err := pool.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond) // idle past the backstop on purpose
	if _, err := pool.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatalf("after idling past the backstop: %v", err)
	}

	held, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	thaw := pc.Freeze(t)
	start := time.Now()
	_, err = held.Exec(ctx, "SELECT 1")
	held.Release()
	if took := time.Since(start); err == nil || took > 4*time.Second || !db.IsUnavailable(err) {
		t.Fatalf("query without a deadline on a frozen server: %v after %s", err, took)
	} else {
		t.Logf("backstop: %v after %s", err, took.Round(time.Millisecond))
	}
	qctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	start = time.Now()
	_, err = pool.Exec(qctx, "SELECT 1")
	cancel()
	if took := time.Since(start); err == nil || took > time.Second || !db.IsUnavailable(err) {
		t.Fatalf("query under a 300 ms deadline on a frozen server: %v after %s", err, took)
	} else {
		t.Logf("deadline: %v after %s", err, took.Round(time.Millisecond))
	}
	thaw()
	wait.For(t, 15*time.Second, "queries after the thaw", func() bool {
		qctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		_, err := pool.Exec(qctx, "SELECT 1")
		return err == nil
	})
}

// TestMonitorMeasuresClockSkew: each ping reads PostgreSQL's clock; a
// replica whose clock is 10 s ahead (or behind) measures about that, over
// the threshold, in muster_clock_skew_seconds too; one on the wall clock
// measures about nothing, under it. Nothing is measured before a ping.
func TestMonitorMeasuresClockSkew(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := db.OpenPool(ctx, db.PoolConfig{URL: dbtest.URL(t), MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	for _, off := range []time.Duration{10 * time.Second, -10 * time.Second, 0} {
		reg := prometheus.NewRegistry()
		m, err := db.NewMonitor(db.MonitorConfig{Pool: pool, Registerer: reg, Clock: func() time.Time { return time.Now().Add(off) }})
		if err != nil {
			t.Fatal(err)
		}
		if s := m.ClockSkew(); !s.At.IsZero() || s.Over {
			t.Fatalf("before a ping: %+v", s)
		}
		m.RunOnce(ctx)
		s := m.ClockSkew()
		if d := s.Skew - off; d > time.Second || d < -time.Second || s.At.IsZero() || s.Threshold != db.DefaultSkewAlarm {
			t.Fatalf("offset %s: measured %+v", off, s)
		}
		if want := off != 0; s.Over != want || (want && s.Since.IsZero()) {
			t.Errorf("offset %s: over %v since %v, want over %v", off, s.Over, s.Since, want)
		}
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, mf := range mfs {
			if strings.HasPrefix(mf.GetName(), "muster_clock_skew_seconds") {
				found = true
				if v := mf.GetMetric()[0].GetGauge().GetValue(); v-off.Seconds() > 1 || v-off.Seconds() < -1 {
					t.Errorf("offset %s: gauge %v", off, v)
				}
			}
		}
		if !found {
			t.Errorf("no muster_clock_skew_seconds")
		}
	}
}
