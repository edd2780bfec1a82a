package stream

import (
	"fmt"
	"testing"
)

// next returns the frame waiting on sub's channel, or fails.
func next(t *testing.T, sub *Subscription) *Frame {
	t.Helper()
	select {
	case f := <-sub.C():
		return f
	default:
		t.Fatal("no frame waiting")
		return nil
	}
}

// A delta from a base the hub does not hold goes to subscribers as the
// full view, and catch-up vouches for it only at exactly its base.
func TestADeltaFromAnotherBaseIsNotSent(t *testing.T) {
	h := NewHub(Config{})
	h.Relay([]Update{{View: view("web", 10)}})
	sub, err := h.Subscribe([]string{"web"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	// The owner published 11 and 12; this replica heard only 12's delta
	// (from 11).
	h.Relay([]Update{{View: view("web", 12), Delta: delta("web", 11, 12)}})
	if f := next(t, sub); f.Kind != KindView || f.Version != 12 {
		t.Fatalf("a live subscriber got %s@%d, want the full view 12", f.Kind, f.Version)
	}
	for _, tc := range []struct {
		since uint64
		want  string
	}{
		{10, "[web:view@12 :synced@0]"},  // holds 10, never told of 11
		{11, "[web:delta@12 :synced@0]"}, // exactly the delta's base
	} {
		s, _ := h.Subscribe([]string{"web"}, tc.since)
		if got := fmt.Sprint(versionsOrEmpty(s.Initial)); got != tc.want {
			t.Errorf("since %d: %s, want %s", tc.since, got, tc.want)
		}
		s.Close()
	}
	// The chain continues from 12 as usual.
	h.Relay([]Update{{View: view("web", 13), Delta: delta("web", 12, 13)}})
	if f := next(t, sub); f.Kind != KindDelta || f.Version != 13 {
		t.Fatalf("a chained delta went out as %s@%d", f.Kind, f.Version)
	}
}

// A rebased delta (a new owner's first, from the view it restored) goes
// to live subscribers, who hold its base, but catch-up offers it only to a
// client at exactly that base: one above may hold a version the previous
// owner published and this replica never saw.
func TestARebasedDeltaIsVouchedOnlyAtItsBase(t *testing.T) {
	h := NewHub(Config{})
	h.Relay([]Update{{View: view("web", 10)}})
	h.Relay([]Update{{View: view("web", 11), Delta: delta("web", 10, 11)}})
	sub, _ := h.Subscribe([]string{"web"}, 11)
	defer sub.Close()
	h.Publish([]Update{{View: view("web", 100), Delta: delta("web", 11, 100), Rebased: true}})
	if f := next(t, sub); f.Kind != KindDelta || f.Version != 100 {
		t.Fatalf("a live subscriber got %s@%d, want the delta", f.Kind, f.Version)
	}
	for _, tc := range []struct {
		since uint64
		want  string
	}{
		{10, "[web:view@100 :synced@0]"},
		{11, "[web:delta@100 :synced@0]"},
		{12, "[web:view@100 :synced@0]"}, // the old owner's 12, unseen here
	} {
		s, _ := h.Subscribe([]string{"web"}, tc.since)
		if got := fmt.Sprint(versionsOrEmpty(s.Initial)); got != tc.want {
			t.Errorf("since %d: %s, want %s", tc.since, got, tc.want)
		}
		s.Close()
	}
}

// Relay drops what it holds already (the same update from two peers, a
// deposed owner's late one), and the tap carries only this replica's own
// publications.
func TestRelayAndTap(t *testing.T) {
	h := NewHub(Config{})
	tap := h.Tap(3)
	defer tap.Close()
	if n := h.Relay([]Update{{View: view("web", 5)}}); n != 1 {
		t.Fatalf("relay took %d, want 1", n)
	}
	if n := h.Relay([]Update{{View: view("web", 5)}, {View: view("web", 4)}}); n != 0 {
		t.Fatalf("relay took %d old updates", n)
	}
	if us, resync := tap.Take(); len(us) != 0 || resync {
		t.Fatalf("the tap carried a relayed update: %d, %v", len(us), resync)
	}
	h.Publish([]Update{{View: view("api", 6)}, {View: view("web", 7), Delta: delta("web", 5, 7)}})
	select {
	case <-tap.Wake():
	default:
		t.Fatal("the tap was not woken")
	}
	us, resync := tap.Take()
	if len(us) != 2 || resync || us[1].Delta == nil || us[1].Delta.FromVersion != 5 {
		t.Fatalf("tap took %+v, %v", us, resync)
	}
	// Over its limit it drops the queue and asks for a snapshot.
	for v := uint64(8); v < 12; v++ {
		h.Publish([]Update{{View: view("api", v)}})
	}
	if us, resync := tap.Take(); len(us) != 0 || !resync {
		t.Fatalf("an overflowed tap: %d updates, resync %v", len(us), resync)
	}
	if got := versions(h.Snapshot()); fmt.Sprint(got) != "[api:view@11 web:view@7]" {
		t.Fatalf("snapshot %v", got)
	}
	if h.Relayed() != 1 {
		t.Fatalf("relayed %d", h.Relayed())
	}
}

// Closing is closed by Close (once: a second Close does not panic).
func TestClosing(t *testing.T) {
	h := NewHub(Config{})
	select {
	case <-h.Closing():
		t.Fatal("closing before Close")
	default:
	}
	h.Close()
	h.Close()
	select {
	case <-h.Closing():
	default:
		t.Fatal("not closing after Close")
	}
}
