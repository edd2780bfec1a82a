package stream

import (
	"slices"
	"testing"
)

// TestServicesListsThoseWithAView: a service only subscribed to (no view
// yet) is not listed; published ones are, sorted.
func TestServicesListsThoseWithAView(t *testing.T) {
	h := NewHub(Config{})
	sub, err := h.Subscribe([]string{"waiting"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	h.Publish([]Update{{View: &Frame{Kind: KindView, Service: "web", Version: 2}}, {View: &Frame{Kind: KindView, Service: "api", Version: 3}}})
	if got := h.Services(); !slices.Equal(got, []string{"api", "web"}) {
		t.Fatalf("Services() = %v, want [api web]", got)
	}
}
