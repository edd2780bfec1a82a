package stream

import (
	"fmt"
	"testing"
)

// none fails if a frame waits on sub's channel.
func none(t *testing.T, sub *Subscription) {
	t.Helper()
	select {
	case f := <-sub.C():
		t.Fatalf("got %s %s@%d, want nothing", f.Service, f.Kind, f.Version)
	default:
	}
}

// epoch is version seq under owner epoch e (the high half).
func epoch(e, seq uint64) uint64 { return e<<32 | seq }

// TestASingleWatermarkCannotSpanOwners (issue 27) is the gap the
// three-replica test found: services published by two owners under
// different epochs. A client holding api at the newer epoch and web at an
// older version than the hub's cannot say so with one since: the highest
// makes web look current (the client then misses 537 and takes the next
// delta from a base it lacks), the lowest costs api a full view. held
// names each exactly.
func TestASingleWatermarkCannotSpanOwners(t *testing.T) {
	h := NewHub(Config{})
	web533, web537, web549 := epoch(5, 533), epoch(5, 537), epoch(5, 549)
	api804, api810 := epoch(6, 804), epoch(6, 810)
	h.Relay([]Update{{View: view("web", web533)}, {View: view("api", api804)}})
	h.Relay([]Update{{View: view("web", web537), Delta: delta("web", web533, web537)}})
	h.Relay([]Update{{View: view("api", api810), Delta: delta("api", api804, api810)}})
	services := []string{"api", "web"}

	// The highest: web looks current, though the client lacks 537.
	s, _ := h.Subscribe(services, api804)
	if got := fmt.Sprint(versionsOrEmpty(s.Initial)); got != fmt.Sprintf("[api:delta@%d :synced@0]", api810) {
		t.Fatalf("since the highest: %s", got)
	}
	s.Close()

	// held: each service from exactly its version.
	s, err := h.SubscribeHeld(services, 0, map[string]uint64{"web": web533, "api": api804})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	want := fmt.Sprintf("[web:delta@%d api:delta@%d :synced@0]", web537, api810)
	if got := fmt.Sprint(versionsOrEmpty(s.Initial)); got != want {
		t.Fatalf("held: %s, want %s", got, want)
	}
	h.Relay([]Update{{View: view("web", web549), Delta: delta("web", web537, web549)}})
	if f := next(t, s); f.Kind != KindDelta || f.FromVersion != web537 {
		t.Fatalf("live: %s %d→%d", f.Kind, f.FromVersion, f.Version)
	}
}

// TestSubscribeHeld (issue 27): what a client that names its version of
// each service gets.
func TestSubscribeHeld(t *testing.T) {
	h := NewHub(Config{History: 3})
	h.Relay([]Update{{View: view("web", 10)}})
	h.Relay([]Update{{View: view("web", 11), Delta: delta("web", 10, 11)}})
	h.Relay([]Update{{View: view("web", 12), Delta: delta("web", 11, 12)}})
	// A new owner's rebased first delta, from 12: its chain is foreign.
	h.Publish([]Update{{View: view("web", epoch(9, 1)), Delta: delta("web", 12, epoch(9, 1)), Rebased: true}})
	h.Publish([]Update{{View: view("web", epoch(9, 2)), Delta: delta("web", epoch(9, 1), epoch(9, 2))}})
	for _, tc := range []struct {
		held uint64
		want string
	}{
		{epoch(9, 2), "[:synced@0]"},                                                         // current
		{epoch(9, 1), fmt.Sprintf("[web:delta@%d :synced@0]", epoch(9, 2))},                  // on the chain
		{12, fmt.Sprintf("[web:delta@%d web:delta@%d :synced@0]", epoch(9, 1), epoch(9, 2))}, // exactly the foreign base
		{11, fmt.Sprintf("[web:view@%d :synced@0]", epoch(9, 2))},                            // before the kept chain
		{13, fmt.Sprintf("[web:view@%d :synced@0]", epoch(9, 2))},                            // the old owner's 13, unseen here
		{epoch(9, 3), "[:synced@0]"},                                                         // ahead of this hub
	} {
		s, err := h.SubscribeHeld([]string{"web"}, 0, map[string]uint64{"web": tc.held})
		if err != nil {
			t.Fatal(err)
		}
		if got := fmt.Sprint(versionsOrEmpty(s.Initial)); got != tc.want {
			t.Errorf("held %d: %s, want %s", tc.held, got, tc.want)
		}
		s.Close()
	}
	// A service not in held follows since.
	h.Relay([]Update{{View: view("api", 5)}})
	s, _ := h.SubscribeHeld([]string{"api", "web"}, 0, map[string]uint64{"web": epoch(9, 2)})
	if got := fmt.Sprint(versionsOrEmpty(s.Initial)); got != "[api:view@5 :synced@0]" {
		t.Errorf("api not held: %s", got)
	}
	s.Close()
}

// TestAClientAheadOfTheHubGetsNothingOlder (issue 27): a client that moves
// to a replica whose relay lags behind what it holds is sent nothing at
// or below its version, not the views it has already passed (a regression
// to it) nor the deltas leading there; the first frame above it is a
// delta only from exactly its version, else the view. Once past, the
// subscription is an ordinary one.
func TestAClientAheadOfTheHubGetsNothingOlder(t *testing.T) {
	h := NewHub(Config{QueueLen: 1})
	h.Relay([]Update{{View: view("web", 10)}})
	s, err := h.SubscribeHeld([]string{"web"}, 0, map[string]uint64{"web": 12})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got := fmt.Sprint(versionsOrEmpty(s.Initial)); got != "[:synced@0]" {
		t.Fatalf("initial %s", got)
	}
	h.Relay([]Update{{View: view("web", 11), Delta: delta("web", 10, 11)}})
	h.Relay([]Update{{View: view("web", 12), Delta: delta("web", 11, 12)}})
	none(t, s)
	h.Relay([]Update{{View: view("web", 13), Delta: delta("web", 12, 13)}})
	if f := next(t, s); f.Kind != KindDelta || f.FromVersion != 12 {
		t.Fatalf("got %s %d→%d, want the delta from 12", f.Kind, f.FromVersion, f.Version)
	}

	// Ahead on a chain the hub never sees: the view above, never a delta
	// from another base.
	s2, _ := h.SubscribeHeld([]string{"web"}, 0, map[string]uint64{"web": 14})
	defer s2.Close()
	h.Relay([]Update{{View: view("web", 14), Delta: delta("web", 13, 14)}})
	none(t, s2)
	h.Publish([]Update{{View: view("web", epoch(3, 1)), Delta: delta("web", 14, epoch(3, 1)), Rebased: true}})
	if f := next(t, s2); f.Kind != KindDelta || f.FromVersion != 14 {
		t.Fatalf("from exactly its version: %s %d→%d", f.Kind, f.FromVersion, f.Version)
	}
	s3, _ := h.SubscribeHeld([]string{"web"}, 0, map[string]uint64{"web": epoch(3, 2)})
	defer s3.Close()
	h.Publish([]Update{{View: view("web", epoch(4, 1)), Delta: delta("web", epoch(3, 1), epoch(4, 1)), Rebased: true}})
	if f := next(t, s3); f.Kind != KindView || f.Version != epoch(4, 1) {
		t.Fatalf("from another base: %s %d→%d, want the view", f.Kind, f.FromVersion, f.Version)
	}

	// An overflow's resync sends no view at or below the version held.
	s4, _ := h.SubscribeHeld([]string{"web"}, 0, map[string]uint64{"web": epoch(5, 1)})
	defer s4.Close()
	s4.mu.Lock()
	s4.resync = true
	s4.mu.Unlock()
	if got := fmt.Sprint(versionsOrEmpty(s4.TakeResync())); got != "[]" {
		t.Fatalf("resync sent %s to a client ahead", got)
	}
}

// TestAHeldServiceWaitsForTheHubsFirstView (issue 27): a client that
// holds a view of a service the hub has none of yet (a replica just
// started) is not synced until the hub has one, and is sent nothing at or
// below what it holds.
func TestAHeldServiceWaitsForTheHubsFirstView(t *testing.T) {
	h := NewHub(Config{})
	s, err := h.SubscribeHeld([]string{"web"}, 0, map[string]uint64{"web": 7})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got := fmt.Sprint(versionsOrEmpty(s.Initial)); got != "[]" {
		t.Fatalf("initial %s, want nothing before the hub has a view", got)
	}
	h.Relay([]Update{{View: view("web", 6)}})
	if f := next(t, s); f != syncedFrame {
		t.Fatalf("got %s@%d, want synced alone (the client holds 7)", f.Kind, f.Version)
	}
	h.Relay([]Update{{View: view("web", 8), Delta: delta("web", 6, 8)}})
	if f := next(t, s); f.Kind != KindView || f.Version != 8 {
		t.Fatalf("got %s@%d, want the view 8", f.Kind, f.Version)
	}
	none(t, s)
}
