package wait_test

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/musterhq/muster/internal/wait"
)

// TestFor returns once the condition holds, having asked until then.
func TestFor(t *testing.T) {
	t.Parallel()
	var n atomic.Int32
	wait.For(t, 10*time.Second, "the third look", func() bool { return n.Add(1) >= 3 })
	if got := n.Load(); got != 3 {
		t.Fatalf("asked %d times, want 3", got)
	}
}

// TestForFails reports the condition that did not hold.
func TestForFails(t *testing.T) {
	t.Parallel()
	ft := &fatalT{T: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer func() { _ = recover() }()
		wait.For(ft, 20*time.Millisecond, "never", func() bool { return false })
	}()
	<-done
	if ft.msg != "never: not within 20ms" {
		t.Fatalf("failed with %q", ft.msg)
	}
}

// fatalT records Fatalf instead of ending the test.
type fatalT struct {
	*testing.T
	msg string
}

func (f *fatalT) Helper() {}
func (f *fatalT) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	panic("fatal")
}
