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

// TestFollowersAreNotClients: muster's own surfaces follow the views
// (Follow) without counting as subscribers, so the census and admission
// size the population by clients alone; they still receive what is
// published.
func TestFollowersAreNotClients(t *testing.T) {
	h := NewHub(Config{})
	f, err := h.Follow([]string{"web"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	c, err := h.Subscribe([]string{"web"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if now, peak := h.Subscribers(); now != 1 || peak != 1 {
		t.Fatalf("a follower and a client: %d open, peak %d; want 1, 1", now, peak)
	}
	h.Publish([]Update{{View: view("web", 1)}})
	for _, s := range []*Subscription{f, c} {
		select {
		case fr := <-s.C():
			if fr.Service != "web" || fr.Version != 1 {
				t.Fatalf("got %+v", fr)
			}
		default:
			t.Fatal("a subscription got nothing of the publication")
		}
	}
	f.Close()
	c.Close()
	if now, _ := h.Subscribers(); now != 0 {
		t.Fatalf("after both closed: %d open", now)
	}
}
