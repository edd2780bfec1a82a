package dbtest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/musterhq/muster/db"
)

// Cluster is a PostgreSQL cluster of one test's own, for tests that stop
// or freeze the server: doing that to the shared cluster would break every
// test running beside them. It holds one migrated database, "muster".
type Cluster struct {
	dir string
	mu  sync.Mutex
	c   *db.Cluster
}

// NewCluster starts a private cluster (from the system's binaries, even
// when MUSTER_TEST_DATABASE_URL is set) with a migrated database "muster",
// stopped and removed when t ends.
func NewCluster(t testing.TB) *Cluster {
	t.Helper()
	dir, err := os.MkdirTemp("", "muster-pg-")
	if err != nil {
		t.Fatal(err)
	}
	// The cluster may run as the postgres user, who must reach its folder.
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	pc := &Cluster{dir: dir}
	pc.Start(t)
	t.Cleanup(func() {
		pc.mu.Lock()
		defer pc.mu.Unlock()
		if pc.c != nil {
			if err := pc.c.Stop(); err != nil {
				t.Errorf("dbtest: %v", err)
			}
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := pc.c.EnsureDatabase(ctx, "muster"); err != nil {
		t.Fatalf("dbtest: %v", err)
	}
	if err := db.Migrate(pc.URL()); err != nil {
		t.Fatalf("dbtest: %v", err)
	}
	return pc
}

// URL is the connection URL of the cluster's database "muster".
func (pc *Cluster) URL() string {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	return pc.c.URL("muster")
}

// DataDir is the cluster's data folder.
func (pc *Cluster) DataDir() string { return filepath.Join(pc.dir, "pgdata") }

// Stop shuts the server down (fast mode: sessions are disconnected).
func (pc *Cluster) Stop(t testing.TB) {
	t.Helper()
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if pc.c == nil {
		return
	}
	if err := pc.c.Stop(); err != nil {
		t.Fatalf("dbtest: %v", err)
	}
	pc.c = nil
}

// Start starts the server (again), on the same socket and data.
func (pc *Cluster) Start(t testing.TB) {
	t.Helper()
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if pc.c != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := db.StartCluster(ctx, db.ClusterConfig{Dir: pc.dir, Fast: true})
	if err != nil {
		t.Fatalf("dbtest: %v", err)
	}
	pc.c = c
}

// Freeze stops every process of the cluster with SIGSTOP, as a hung host
// or a wedged kernel would: connections stay open and accept bytes, and
// nothing answers. thaw (also run when t ends) resumes them.
func (pc *Cluster) Freeze(t testing.TB) (thaw func()) {
	t.Helper()
	return Freeze(t, pc.DataDir())
}

// Freeze SIGSTOPs the postmaster of the cluster in dataDir and all its
// children (the postmaster first, so it forks no new ones meanwhile).
// thaw, also registered with t.Cleanup, sends SIGCONT to them all.
func Freeze(t testing.TB, dataDir string) (thaw func()) {
	t.Helper()
	pid, err := postmasterPID(dataDir)
	if err != nil {
		t.Fatalf("dbtest: freeze: %v", err)
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("dbtest: SIGSTOP postmaster %d: %v", pid, err)
	}
	pids := []int{pid}
	var once sync.Once
	thaw = func() {
		once.Do(func() {
			for i := len(pids) - 1; i >= 0; i-- {
				if err := syscall.Kill(pids[i], syscall.SIGCONT); err != nil && err != syscall.ESRCH {
					t.Errorf("dbtest: SIGCONT %d: %v", pids[i], err)
				}
			}
		})
	}
	t.Cleanup(thaw)
	children, err := childrenOf(pid)
	if err != nil {
		t.Fatalf("dbtest: freeze: %v", err)
	}
	for _, c := range children {
		if err := syscall.Kill(c, syscall.SIGSTOP); err != nil && err != syscall.ESRCH {
			t.Fatalf("dbtest: SIGSTOP %d: %v", c, err)
		}
		pids = append(pids, c)
	}
	return thaw
}

// postmasterPID reads the first line of postmaster.pid.
func postmasterPID(dataDir string) (int, error) {
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return 0, fmt.Errorf("read postmaster.pid: %w", err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		return 0, fmt.Errorf("postmaster.pid: %w", err)
	}
	return pid, nil
}

// childrenOf lists the processes whose parent is pid, from /proc (which
// works without the kernel's optional /proc/PID/task/TID/children).
func childrenOf(pid int) ([]int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	var out []int
	for _, e := range entries {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue // gone meanwhile
		}
		// pid (comm) state ppid ...; comm may hold spaces and parentheses.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 2 {
			continue
		}
		if ppid, _ := strconv.Atoi(f[1]); ppid == pid {
			out = append(out, n)
		}
	}
	return out, nil
}
