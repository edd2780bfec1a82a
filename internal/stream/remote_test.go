package stream

import (
	"slices"
	"testing"
)

// TestRemoteSeries (issue 29): a peer region's view reaches subscribers
// of its remote series through PublishRemote, in the peer's version
// order (a lower or equal version is dropped, as the same view from a
// second follower would be), and is not a local service: Services,
// Snapshot and Views leave it out, so no publisher restores it, no relay
// sends it to a peer and readiness does not count it; the taps see
// nothing of it. A frame under a local name is ignored.
func TestRemoteSeries(t *testing.T) {
	h := NewHub(Config{})
	tap := h.Tap(0)
	series := RemoteSeries("billing", "b")
	sub, err := h.Subscribe([]string{series}, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	if n := h.PublishRemote([]*Frame{view(series, 7), view("web", 1)}); n != 1 {
		t.Fatalf("PublishRemote took %d frames, want 1 (a local name is ignored)", n)
	}
	if n := h.PublishRemote([]*Frame{view(series, 7), view(series, 5)}); n != 0 {
		t.Fatalf("PublishRemote took %d frames at or below the version held", n)
	}
	select {
	case f := <-sub.C():
		if f.Service != series || f.Version != 7 {
			t.Fatalf("the subscriber got %+v", f)
		}
	default:
		t.Fatal("the subscriber got nothing")
	}
	if f, ok := h.View(series); !ok || f.Version != 7 {
		t.Fatalf("View(%s) = %+v, %v", series, f, ok)
	}
	if got := h.Services(); len(got) != 0 {
		t.Fatalf("Services() = %v, want none (a remote series is no local service)", got)
	}
	if got := h.Snapshot(); len(got) != 0 || h.Views() != 0 {
		t.Fatalf("Snapshot() = %d frames, Views() = %d; want 0, 0", len(got), h.Views())
	}
	if got := h.RemoteSeries(); !slices.Equal(got, []string{series}) {
		t.Fatalf("RemoteSeries() = %v", got)
	}
	if ups, _ := tap.Take(); len(ups) != 0 {
		t.Fatalf("the tap got %d updates of a remote series", len(ups))
	}
	if s, r, ok := SplitRemote(series); !ok || s != "billing" || r != "b" {
		t.Fatalf("SplitRemote(%q) = %q, %q, %v", series, s, r, ok)
	}
	for _, name := range []string{"billing", "@b", "billing@"} {
		if _, _, ok := SplitRemote(name); ok {
			t.Errorf("SplitRemote(%q) is a series", name)
		}
	}
}
