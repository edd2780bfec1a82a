package stream

import (
	"fmt"
	"testing"
)

// drain returns the frames queued on a subscription now.
func drain(sub *Subscription) []*Frame {
	var out []*Frame
	for {
		select {
		case f := <-sub.C():
			out = append(out, f)
		default:
			return out
		}
	}
}

// TestNoSyncedBeforeAView: a subscriber that arrives while the hub has no
// view of its service (the evaluator is rebuilding) gets no synced; the
// first publication brings the view, then synced.
func TestNoSyncedBeforeAView(t *testing.T) {
	h := NewHub(Config{})
	sub, err := h.Subscribe([]string{"web"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(sub.Initial) != 0 || len(drain(sub)) != 0 {
		t.Fatalf("before any view: initial %v", versions(sub.Initial))
	}
	h.Publish([]Update{{View: view("web", 7)}})
	if got := fmt.Sprint(versions(drain(sub))); got != "[web:view@7 :synced@0]" {
		t.Fatalf("after the first view: %s, want the view then synced", got)
	}
	h.Publish([]Update{{View: view("web", 8), Delta: delta("web", 7, 8)}})
	if got := fmt.Sprint(versions(drain(sub))); got != "[web:delta@8]" {
		t.Fatalf("then: %s, want the delta alone (synced once)", got)
	}
}

// TestSyncedWaitsForEveryService: with one of two services published, the
// subscriber gets that view at once and synced only after the other's.
func TestSyncedWaitsForEveryService(t *testing.T) {
	h := NewHub(Config{})
	h.Publish([]Update{{View: view("api", 3)}})
	sub, _ := h.Subscribe([]string{"api", "web"}, 0)
	if got := fmt.Sprint(versions(sub.Initial)); got != "[api:view@3]" {
		t.Fatalf("initial %s, want api's view and no synced", got)
	}
	h.Publish([]Update{{View: view("api", 4), Delta: delta("api", 3, 4)}})
	h.Publish([]Update{{View: view("web", 5)}})
	if got := fmt.Sprint(versions(drain(sub))); got != "[api:delta@4 web:view@5 :synced@0]" {
		t.Fatalf("live: %s", got)
	}
}

// TestResumeCurrentIsSyncedAtOnce: a client whose since covers every view
// is current: synced alone, straight away.
func TestResumeCurrentIsSyncedAtOnce(t *testing.T) {
	h := NewHub(Config{})
	h.Publish([]Update{{View: view("web", 10)}, {View: view("api", 11)}})
	sub, _ := h.Subscribe([]string{"web", "api"}, 11)
	if got := fmt.Sprint(versions(sub.Initial)); got != "[:synced@0]" {
		t.Fatalf("initial %s, want synced alone", got)
	}
	// Current by since is not enough for a service with no view: the
	// client keeps what it has and waits.
	sub2, _ := h.Subscribe([]string{"web", "db"}, 11)
	if len(sub2.Initial) != 0 {
		t.Fatalf("initial %s, want nothing until db has a view", versions(sub2.Initial))
	}
}

// TestFirstPublicationIsAView: after a restart the publisher's first
// version of a service may carry a delta from a version the previous
// process published. Subscribers (who came in with nothing) get the full
// view; the delta stays in the history for a client resuming at exactly
// its from_version; later publications go out as deltas.
func TestFirstPublicationIsAView(t *testing.T) {
	h := NewHub(Config{})
	sub, _ := h.Subscribe([]string{"web"}, 0)
	h.Publish([]Update{{View: view("web", 1001), Delta: delta("web", 900, 1001)}})
	if got := fmt.Sprint(versions(drain(sub))); got != "[web:view@1001 :synced@0]" {
		t.Fatalf("first publication reached the subscriber as %s, want the full view", got)
	}
	h.Publish([]Update{{View: view("web", 1002), Delta: delta("web", 1001, 1002)}})
	if got := fmt.Sprint(versions(drain(sub))); got != "[web:delta@1002]" {
		t.Fatalf("second publication: %s, want a delta", got)
	}
	resumed, _ := h.Subscribe([]string{"web"}, 900)
	if got := fmt.Sprint(versions(resumed.Initial)); got != "[web:delta@1001 web:delta@1002 :synced@0]" {
		t.Fatalf("resume at 900: %s", got)
	}
	fresh, _ := h.Subscribe([]string{"web"}, 0)
	if got := fmt.Sprint(versions(fresh.Initial)); got != "[web:view@1002 :synced@0]" {
		t.Fatalf("a new subscriber: %s", got)
	}
}

// TestSyncedSurvivesAnOverflow: a subscriber whose queue overflowed while
// it waited gets the views and then the synced it missed with its resync.
func TestSyncedSurvivesAnOverflow(t *testing.T) {
	h := NewHub(Config{QueueLen: 2})
	h.Publish([]Update{{View: view("api", 1)}})
	sub, _ := h.Subscribe([]string{"api", "web"}, 0)
	for v := uint64(2); v <= 5; v++ {
		h.Publish([]Update{{View: view("api", v), Delta: delta("api", v-1, v)}})
	}
	h.Publish([]Update{{View: view("web", 6)}}) // its view and synced are dropped with the queue
	if n := len(sub.C()); n != 0 {
		t.Fatalf("an overflowed queue keeps %d frames", n)
	}
	if got := fmt.Sprint(versions(sub.TakeResync())); got != "[api:view@5 web:view@6 :synced@0]" {
		t.Fatalf("resync: %s", got)
	}
	h.Publish([]Update{{View: view("web", 7), Delta: delta("web", 6, 7)}})
	if got := fmt.Sprint(versions(drain(sub))); got != "[web:delta@7]" {
		t.Fatalf("after the resync: %s", got)
	}
}
