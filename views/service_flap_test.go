package views

import (
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestFlapHistoryKeepsTimeApartFromReason: a history line reads
// "eligible → ineligible 3 min ago (… UTC): failure rate …", not with the
// time run into the reason as it once did.
func TestFlapHistoryKeepsTimeApartFromReason(t *testing.T) {
	at := time.Date(2026, 12, 2, 5, 28, 59, 0, time.UTC)
	sp := ServicePage{Page: Page{Base: "/ui", Now: at.Add(3 * time.Minute)}, Name: "recommendations",
		Flaps: []Flap{{InstanceID: "i-1", At: at, Reason: "quarantined", History: []FlapStep{
			{From: "eligible", To: "ineligible", At: at, Reason: "failure rate at or above removal"}}}}}
	var b strings.Builder
	if err := ServicePageView(sp).Render(t.Context(), &b); err != nil {
		t.Fatal(err)
	}
	i := strings.Index(b.String(), `<ol class="history">`)
	if i < 0 {
		t.Fatal("no history list")
	}
	text := regexp.MustCompile(`<[^>]*>`).ReplaceAllString(b.String()[i:], "")
	if want := "(2026-12-02 05:28:59 UTC): failure rate at or above removal"; !strings.Contains(text, want) {
		t.Errorf("history reads %q, want it to contain %q", text[:min(len(text), 200)], want)
	}
}
