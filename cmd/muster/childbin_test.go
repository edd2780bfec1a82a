package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// The real-process tests (muster SIGKILLed, three replicas of a region,
// a rolling restart) run muster as the release builds it: `go build
// -trimpath` with cgo off, without the race detector. The race detector
// still runs over this test binary and over every package's in-process
// tests; what it would add in the children is a 5-10x CPU cost on
// processes whose point is timing (leases, withdrawal budgets, 20,000
// instances), on a 2-core CI machine where that cost alone took
// cmd/muster past its timeout. MUSTER_TEST_CHILD_RACE=1 builds the
// children with -race instead, for a deeper, slower run.

// pkgDir is this package's folder (go test starts the binary there),
// read before any test changes the working directory.
var pkgDir, _ = os.Getwd()

var child struct {
	once sync.Once
	dir  string
	exe  string
	err  error
}

// childRace reports whether the children are built with the race
// detector (MUSTER_TEST_CHILD_RACE=1).
func childRace() bool { return os.Getenv("MUSTER_TEST_CHILD_RACE") == "1" }

// musterBinary returns the muster binary built from this tree, building
// it on first use (once per test binary; the build cache makes a
// rebuild a link).
func musterBinary(t testing.TB) string {
	t.Helper()
	child.once.Do(func() {
		goTool, err := exec.LookPath("go")
		if err != nil {
			child.err = fmt.Errorf("no go command to build muster for the real-process tests: %w", err)
			return
		}
		if child.dir, err = os.MkdirTemp("", "muster-child-"); err != nil {
			child.err = err
			return
		}
		child.exe = filepath.Join(child.dir, "muster")
		args := []string{"build", "-trimpath", "-buildvcs=false", "-o", child.exe}
		env := append(os.Environ(), "GOTOOLCHAIN=local", "GOFLAGS=-buildvcs=false")
		if childRace() {
			args = append(args, "-race")
		} else {
			// As the image builds it (internal/image), so the two share
			// the build cache's compiled packages.
			env = append(env, "CGO_ENABLED=0")
		}
		cmd := exec.Command(goTool, append(args, ".")...)
		cmd.Dir, cmd.Env = pkgDir, env
		began := time.Now()
		if out, err := cmd.CombinedOutput(); err != nil {
			child.err = fmt.Errorf("go build muster for the real-process tests: %v\n%s", err, out)
			return
		}
		fmt.Fprintf(os.Stderr, "built muster for the real-process tests in %s (race detector: %v)\n", time.Since(began).Round(100*time.Millisecond), childRace())
	})
	if child.err != nil {
		t.Fatal(child.err)
	}
	return child.exe
}

// removeMusterBinary removes what musterBinary built; TestMain calls it
// after the tests.
func removeMusterBinary() {
	if child.dir != "" {
		os.RemoveAll(child.dir)
	}
}
