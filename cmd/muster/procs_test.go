package main

import (
	"context"
	"os"
	"os/exec"
	"slices"
	"testing"
	"time"

	"github.com/musterhq/muster/db"
)

// regionDirs returns n fresh dev data folders, each muster's own
// PostgreSQL stopped when the test ends (after its processes: cleanups
// run last-registered first, so call this before newProcs).
func regionDirs(t *testing.T, n int) []string {
	t.Helper()
	dirs := make([]string, n)
	for i := range dirs {
		dirs[i] = devDir(t)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for _, d := range dirs {
			_ = db.StopDir(ctx, d)
		}
	})
	return dirs
}

// procs are the muster processes a test started; those still running
// are stopped (SIGINT, then waited for) when the test ends.
type procs struct {
	t       *testing.T
	running []*exec.Cmd
}

func newProcs(t *testing.T) *procs {
	p := &procs{t: t}
	t.Cleanup(func() {
		for _, c := range slices.Clone(p.running) {
			p.stop(c)
		}
	})
	return p
}

// start runs muster dev on dir at addr with env (startProcess).
func (p *procs) start(dir, addr string, env ...string) *exec.Cmd {
	p.t.Helper()
	c := startProcess(p.t, dir, addr, env...)
	p.running = append(p.running, c)
	return c
}

// stop stops c as an operator would (SIGINT) and waits for it.
func (p *procs) stop(c *exec.Cmd) {
	p.t.Helper()
	_ = c.Process.Signal(os.Interrupt)
	_ = c.Wait()
	p.running = slices.DeleteFunc(p.running, func(x *exec.Cmd) bool { return x == c })
}
