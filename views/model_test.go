package views

import (
	"testing"
	"time"
)

func TestAgo(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	for _, tt := range []struct {
		t    time.Time
		want string
	}{
		{time.Time{}, "never"},
		{now, "just now"},
		{now.Add(-42 * time.Second), "42 s ago"},
		{now.Add(-3 * time.Minute), "3 min ago"},
		{now.Add(-26*time.Hour - 5*time.Minute), "26 h 5 min ago"},
		{now.Add(-72 * time.Hour), "3 days ago"},
		{now.Add(5 * time.Minute), "in 5 min"},
	} {
		if got := Ago(now, tt.t); got != tt.want {
			t.Errorf("Ago(%v) = %q, want %q", tt.t, got, tt.want)
		}
	}
	if got := Absolute(now.In(time.FixedZone("x", 3600))); got != "2026-11-29 12:00:00 UTC" {
		t.Errorf("Absolute = %q", got)
	}
}

func TestQuery(t *testing.T) {
	if got := Query("/ui/", "owner", "", "state", "unknown", "sort", "a b"); got != "/ui/?sort=a+b&state=unknown" {
		t.Errorf("Query = %q", got)
	}
	if got := Query("/ui/audit", "actor", ""); got != "/ui/audit" {
		t.Errorf("Query with nothing set = %q", got)
	}
}

func TestSince(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	for _, tt := range []struct {
		d    time.Duration
		want string
	}{
		{-time.Second, "0 s"},
		{42 * time.Second, "42 s"},
		{3*time.Minute + 12*time.Second, "3 min 12 s"},
		{2*time.Hour + 5*time.Minute + 9*time.Second, "2 h 5 min"},
	} {
		if got := Since(now, now.Add(-tt.d)); got != tt.want {
			t.Errorf("Since(%s) = %q, want %q", tt.d, got, tt.want)
		}
	}
}
