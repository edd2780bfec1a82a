package evaluator

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/db/dbtest"
	"github.com/musterhq/muster/internal/eligibility"
	"github.com/musterhq/muster/internal/fence"
	"github.com/musterhq/muster/internal/ownership"
	"github.com/musterhq/muster/internal/registry"
)

// tenures stands in for the ownership manager: this replica believes it
// owns "mine" (and the database agrees unless deposed), knows "theirs"
// is another replica's, and knows no owner of anything else.
type tenures struct{ deposed atomic.Bool }

func (o *tenures) Owns(key string) (uint64, bool) { return 3, key == "mine" }
func (o *tenures) OwnedElsewhere(key string) bool { return key == "theirs" }
func (o *tenures) Shards() int                    { return 64 }
func (o *tenures) Fence(_ context.Context, _ *db.Queries, shard int, epoch uint64) error {
	if o.deposed.Load() {
		return fmt.Errorf("fence shard %d at epoch %d: %w", shard, epoch, fence.ErrNotOwner)
	}
	return nil
}

// TestWhoWritesObservations: windows and transitions of a service are
// written by its owner under its tenure, by nobody else while another
// replica is known to own it, and unfenced while no owner is known (a
// shard between owners: nothing observed is lost for want of one). An
// owner deposed between deciding and writing writes none of its own, and
// counts them dropped; the ownerless ones in the same transaction are
// written, and nothing is kept for a retry.
func TestWhoWritesObservations(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.New(t)
	reg, err := registry.New(registry.Config{Pool: pool, Region: "local"})
	if err != nil {
		t.Fatal(err)
	}
	o := &tenures{}
	metrics := prometheus.NewRegistry()
	f, err := fence.New(o, metrics)
	if err != nil {
		t.Fatal(err)
	}
	e, err := New(Config{Registry: reg, Pool: pool, Fence: f})
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]uuid.UUID{"mine": uuid.New(), "theirs": uuid.New(), "nobody": uuid.New()}
	observe := func() {
		e.mu.Lock()
		defer e.mu.Unlock()
		for svc, id := range ids {
			e.instances[id] = instanceInfo{service: svc, win: e.instances[id].win}
			e.countSample(eligibility.Sample{Instance: eligibility.InstanceID(id), Class: eligibility.Passive, Outcome: eligibility.Failure, Reporter: 1})
		}
	}
	transitions := func() {
		var ts []eligibility.Transition
		for svc, id := range ids {
			ts = append(ts, eligibility.Transition{Instance: eligibility.InstanceID(id), Service: svc,
				From: eligibility.Eligible, To: eligibility.Ineligible, At: time.Now().UTC(), Reason: "test"})
		}
		e.publish(ts, nil)
		e.transitions.flush(ctx)
	}
	rows := func(table string) map[string]int {
		out := map[string]int{}
		for svc, id := range ids {
			var n int
			if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+table+" WHERE instance_id = $1", id).Scan(&n); err != nil {
				t.Fatal(err)
			}
			out[svc] = n
		}
		return out
	}
	check := func(when string, got, want map[string]int) {
		t.Helper()
		for svc, n := range want {
			if got[svc] != n {
				t.Errorf("%s: %v, want %v", when, got, want)
				return
			}
		}
	}

	observe()
	if err := e.FlushNow(ctx); err != nil {
		t.Fatal(err)
	}
	transitions()
	check("windows as the owner", rows("observed_windows"), map[string]int{"mine": 1, "theirs": 0, "nobody": 1})
	check("transitions as the owner", rows("transitions"), map[string]int{"mine": 1, "theirs": 0, "nobody": 1})

	o.deposed.Store(true)
	observe()
	if err := e.FlushNow(ctx); err != nil {
		t.Fatalf("a deposed owner's flush fails (it must drop, not keep for a retry): %v", err)
	}
	transitions()
	check("windows deposed", rows("observed_windows"), map[string]int{"mine": 1, "theirs": 0, "nobody": 2})
	check("transitions deposed", rows("transitions"), map[string]int{"mine": 1, "theirs": 0, "nobody": 2})
	if len(e.pendingWindows) != 0 || len(e.transitions.pending) != 0 {
		t.Fatalf("kept for a retry: %d windows, %d transitions", len(e.pendingWindows), len(e.transitions.pending))
	}
	for _, w := range []string{"observed-windows", "transitions"} {
		if got := dropped(t, metrics, w); got != 1 {
			t.Errorf("%s dropped %v, want 1", w, got)
		}
	}
}

// dropped reads muster_fenced_writes_dropped_total{writer}.
func dropped(t *testing.T, reg *prometheus.Registry, writer string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if mf.GetName() == "muster_fenced_writes_dropped_total" && l.GetName() == "writer" && l.GetValue() == writer {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// BenchmarkFlushWindows measures what fencing costs a flush: 60,000
// windows (a region's instances, one class) of services spread over the
// 64 shards, written by a replica that owns every shard, with the
// tenures checked (fenced) and without (unfenced).
//
//	go test -run '^$' -bench FlushWindows -benchtime 5x ./internal/evaluator/
func BenchmarkFlushWindows(b *testing.B) {
	for _, fenced := range []bool{false, true} {
		name := "unfenced"
		if fenced {
			name = "fenced"
		}
		b.Run(name, func(b *testing.B) {
			ctx := context.Background()
			pool := dbtest.New(b)
			reg, err := registry.New(registry.Config{Pool: pool, Region: "local"})
			if err != nil {
				b.Fatal(err)
			}
			cfg := Config{Registry: reg, Pool: pool}
			if fenced {
				m, err := ownership.New(ownership.Config{Pool: pool, ID: "bench"})
				if err != nil {
					b.Fatal(err)
				}
				if err := m.RunOnce(ctx); err != nil {
					b.Fatal(err)
				}
				if len(m.Owned()) != m.Shards() {
					b.Fatalf("own %d of %d shards", len(m.Owned()), m.Shards())
				}
				if cfg.Fence, err = fence.New(m, nil); err != nil {
					b.Fatal(err)
				}
			}
			e, err := New(cfg)
			if err != nil {
				b.Fatal(err)
			}
			ids := make([]uuid.UUID, 60_000)
			e.mu.Lock()
			for i := range ids {
				ids[i] = uuid.New()
				e.instances[ids[i]] = instanceInfo{service: fmt.Sprintf("svc-%d", i%450)}
			}
			e.mu.Unlock()
			flushes := 0
			b.ResetTimer()
			for b.Loop() {
				flushes++
				b.StopTimer()
				e.mu.Lock()
				for _, id := range ids {
					e.countSample(eligibility.Sample{Instance: eligibility.InstanceID(id), Class: eligibility.Passive, Outcome: eligibility.Success, Reporter: 1})
				}
				e.mu.Unlock()
				b.StartTimer()
				if err := e.FlushNow(ctx); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			// Every window written: none dropped by a tenure that ran
			// out (the manager is not renewing) under the benchmark.
			var n int
			if err := pool.QueryRow(ctx, "SELECT count(*) FROM observed_windows").Scan(&n); err != nil {
				b.Fatal(err)
			}
			if n != flushes*len(ids) {
				b.Fatalf("%d windows written, want %d", n, flushes*len(ids))
			}
		})
	}
}
