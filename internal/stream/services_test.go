package stream

import (
	"slices"
	"testing"
)

// TestServicesAndCountedSubscribers: Services lists the services with a
// view, not those only asked for; a subscriber counted from outside
// (xDS) is in Subscribers and the peak until released, once.
func TestServicesAndCountedSubscribers(t *testing.T) {
	h := NewHub(Config{})
	sub, err := h.Subscribe([]string{"db"}, 0) // asked for, no view
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	h.Publish([]Update{{View: view("web", 1)}, {View: view("api", 2)}})
	if got := h.Services(); !slices.Equal(got, []string{"api", "web"}) {
		t.Fatalf("Services() = %v, want [api web]", got)
	}
	done := h.CountSubscriber()
	if now, peak := h.Subscribers(); now != 2 || peak != 2 {
		t.Fatalf("with a counted subscriber: %d open, peak %d; want 2, 2", now, peak)
	}
	done()
	done()
	if now, peak := h.Subscribers(); now != 1 || peak != 2 {
		t.Fatalf("released (twice): %d open, peak %d; want 1, 2", now, peak)
	}
}
