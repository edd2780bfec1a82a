package policy

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/db/dbtest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// TestTakeSlidesItsWindow: the limit counts attempts in the last Window,
// refuses the next one with the wait until the oldest leaves, does not
// count refusals, and keeps keys apart.
func TestTakeSlidesItsWindow(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	lim := Limit{Max: 3, Window: 10 * time.Second}
	t0 := time.Date(2026, 5, 4, 12, 0, 0, 0, time.UTC)
	take1 := func(at time.Time, actor, scope string) Decision {
		t.Helper()
		var d Decision
		if err := db.WithTx(ctx, pool, func(q *db.Queries) error {
			var err error
			d, err = take(ctx, q, at, actor, scope, lim)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return d
	}
	for i := range 3 {
		d := take1(t0.Add(time.Duration(i)*time.Second), "operator:oscar", "override:web")
		if !d.Allowed || d.Remaining != 2-i {
			t.Fatalf("attempt %d: %+v", i+1, d)
		}
	}
	// Refused, repeatedly, without pushing the reset away.
	for range 3 {
		d := take1(t0.Add(3*time.Second), "operator:oscar", "override:web")
		if d.Allowed || d.Remaining != 0 || d.Reset != 7*time.Second || d.ResetSeconds() != 7 {
			t.Fatalf("fourth attempt: %+v", d)
		}
	}
	// Other actors and scopes have their own quota.
	if d := take1(t0.Add(3*time.Second), "operator:paula", "override:web"); !d.Allowed {
		t.Fatalf("another actor: %+v", d)
	}
	if d := take1(t0.Add(3*time.Second), "operator:oscar", "override:api"); !d.Allowed {
		t.Fatalf("another scope: %+v", d)
	}
	// Ten seconds after the first attempt it has left the window.
	if d := take1(t0.Add(10*time.Second-time.Microsecond), "operator:oscar", "override:web"); d.Allowed {
		t.Fatalf("just inside the window: %+v", d)
	}
	if d := take1(t0.Add(10*time.Second), "operator:oscar", "override:web"); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("after the first attempt left the window: %+v", d)
	}
}

// TestTakeIsSerialisedAcrossConnections: concurrent attempts on separate
// pools (as separate replicas would make) pass exactly Max times.
func TestTakeIsSerialisedAcrossConnections(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	lim := Limit{Max: 5, Window: time.Minute}
	now := time.Now().UTC().Truncate(time.Microsecond)
	var (
		mu      sync.Mutex
		allowed int
		wg      sync.WaitGroup
	)
	for i := range 20 {
		wg.Go(func() {
			var d Decision
			err := db.WithTx(ctx, pool, func(q *db.Queries) error {
				var err error
				d, err = take(ctx, q, now.Add(time.Duration(i)*time.Millisecond), "tool:script", "policy:contracts", lim)
				return err
			})
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if d.Allowed {
				allowed++
			}
		})
	}
	wg.Wait()
	if allowed != 5 {
		t.Fatalf("%d of 20 concurrent attempts allowed, want 5", allowed)
	}
}

func TestLimitPolicyHeader(t *testing.T) {
	if got := (Limit{Max: 5, Window: 10 * time.Minute}).Policy(); got != "5;w=600" {
		t.Errorf("Policy() = %q", got)
	}
	if err := (Limit{Max: 0, Window: time.Minute}).Validate(); err == nil {
		t.Error("a limit of 0 validated")
	}
}
