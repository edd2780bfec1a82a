package reconcile_test

import (
	"path/filepath"
	"testing"

	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/reconcile"
)

// TestOneReplicaAppliesASource (issue 27): two replicas on one database
// reconcile the same source; only the one owning the source's shard
// writes the registry, and the other says it is not applying. When
// ownership moves, so does the applying. Before, every replica applied
// every source, each counting its own believed absences, so a region of R
// replicas could end R times the disbelief threshold in one window.
func TestOneReplicaAppliesASource(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "fleet.json")
	writeAtomic(t, path, snapshotJSON(3, 0))
	stack := func(opts apptest.Options) (*apptest.Stack, *reconcile.Worker) {
		src, err := reconcile.NewSnapshotSource(reconcile.SnapshotConfig{Name: "fleet", File: path})
		if err != nil {
			t.Fatal(err)
		}
		opts.Reconcile = reconcile.Config{Sources: []reconcile.Source{src}}
		st := apptest.New(t, opts)
		w, ok := st.Reconcile.Worker("snapshot/fleet")
		if !ok {
			t.Fatal("no worker for snapshot/fleet")
		}
		return st, w
	}
	a, wa := stack(apptest.Options{})
	a.Seed(t)
	b, wb := stack(apptest.Options{Pool: a.Pool}) // the newest: it owns every shard
	live := func() int {
		t.Helper()
		ins, err := a.Registry.ReconciledInstances(t.Context(), "snapshot/fleet")
		if err != nil {
			t.Fatal(err)
		}
		return len(ins)
	}

	if err := wa.RunOnce(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n := live(); n != 0 || wa.Status().Applying {
		t.Fatalf("the replica not owning the source: %d instances written, applying %v; want none, false", n, wa.Status().Applying)
	}
	if err := wb.RunOnce(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n := live(); n != 3 || !wb.Status().Applying {
		t.Fatalf("the owner: %d instances written, applying %v; want 3, true", n, wb.Status().Applying)
	}

	// The source's shard moves to a: a applies the next reading, b no
	// longer does.
	a.TakeOver(t)
	if err := b.App.Ownership.RunOnce(t.Context()); err != nil {
		t.Fatal(err)
	}
	writeAtomic(t, path, snapshotJSON(4, 0))
	if err := wb.RunOnce(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n := live(); n != 3 || wb.Status().Applying {
		t.Fatalf("b after losing the source: %d instances, applying %v; want 3, false", n, wb.Status().Applying)
	}
	if err := wa.RunOnce(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n := live(); n != 4 || !wa.Status().Applying {
		t.Fatalf("a after gaining the source: %d instances, applying %v; want 4, true", n, wa.Status().Applying)
	}
}
