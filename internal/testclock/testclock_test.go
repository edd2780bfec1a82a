package testclock

import (
	"testing"
	"time"
)

func TestClockMovesOnlyWhenMoved(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	c := New(t0)
	if !c.Now().Equal(t0) {
		t.Fatalf("new clock reads %v", c.Now())
	}
	c.Advance(90 * time.Second)
	if got := c.Now(); !got.Equal(t0.Add(90 * time.Second)) {
		t.Fatalf("after Advance: %v", got)
	}
	c.Set(t0)
	if !c.Now().Equal(t0) {
		t.Fatalf("after Set: %v", c.Now())
	}
}
