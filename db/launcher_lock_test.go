package db

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"
)

// TestClusterLockLastUserOut walks the users' lock protocol without a
// server: of two users only the last is told to stop the cluster, and a
// process starting while it stops waits until it is done.
func TestClusterLockLastUserOut(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), lockFile)
	use := func() *Cluster {
		t.Helper()
		f, err := lockShared(ctx, path)
		if err != nil {
			t.Fatal(err)
		}
		return &Cluster{lock: f}
	}
	a, b := use(), use()
	if a.lastUser() {
		t.Fatal("a is told it is the last user while b holds the cluster")
	}
	a.unlock()
	if !b.lastUser() {
		t.Fatal("b, the only user left, is not told to stop the cluster")
	}
	// b holds the lock exclusively while it stops the server: a process
	// starting now waits rather than adopting a server about to go.
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if f, err := lockShared(short, path); !errors.Is(err, context.DeadlineExceeded) {
		if f != nil {
			f.Close()
		}
		t.Fatalf("a start while the last user stops the cluster: %v, want to wait", err)
	}
	b.unlock()
	c := use()
	defer c.unlock()
	if !c.lastUser() {
		t.Fatal("a new user after the others left is not the last")
	}
}
