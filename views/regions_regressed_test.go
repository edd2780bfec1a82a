package views

import (
	"strings"
	"testing"
	"time"
)

// TestRegionsPageShowsRegressedServices: a peer whose versions went
// backwards is shown with each regressed service and its figures.
func TestRegionsPageShowsRegressedServices(t *testing.T) {
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	rp := Regions{Page: Page{Base: "/ui", Now: now}, Region: "a", Peers: []PeerRegionRow{
		{Region: "b", Connected: true, Synced: true, LastContact: now, Regressed: []string{"billing (held v50, took v40)"}},
		{Region: "c", Connected: true, Synced: true, LastContact: now},
	}}
	var b strings.Builder
	if err := RegionsPage(rp).Render(t.Context(), &b); err != nil {
		t.Fatal(err)
	}
	page := b.String()
	if n := strings.Count(page, `class="regressed"`); n != 1 || !strings.Contains(page, "billing (held v50, took v40)") {
		t.Fatalf("regressed shown %d times, want once with billing's figures:\n%s", n, page)
	}
}
