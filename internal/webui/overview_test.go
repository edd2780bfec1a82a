package webui

import (
	"slices"
	"testing"
	"time"

	"github.com/musterhq/muster/views"
)

func TestSummariseAndSort(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	rows := []views.Service{
		{Name: "a", Owner: "z", Counts: views.Counts{Eligible: 3}, HasView: true, ViewAt: t0.Add(2 * time.Second)},
		{Name: "b", Owner: "y", Counts: views.Counts{Eligible: 1, Unknown: 2, Ineligible: 1}, ViewAt: t0},
		{Name: "c", Owner: "x", Counts: views.Counts{Ineligible: 5}, Zones: []views.Zone{{Name: "az1", Guard: "tripped"}}, ViewAt: t0.Add(time.Second)},
		{Name: "d", Owner: "x", Alarms: 1, Counts: views.Counts{Degraded: 1}},
		{Name: "e", Owner: "w"},
	}
	want := map[string]string{"a": "healthy", "b": "unknown", "c": "tripped", "d": "alarm", "e": "empty"}
	for i := range rows {
		rows[i].State = summarise(rows[i])
		if rows[i].State != want[rows[i].Name] {
			t.Errorf("summarise(%s) = %s, want %s", rows[i].Name, rows[i].State, want[rows[i].Name])
		}
	}
	// A filter finds every service with the condition, not only those
	// where it is the most pressing.
	if !matchesState(rows[1], "ineligible") || !matchesState(rows[2], "ineligible") || matchesState(rows[0], "ineligible") {
		t.Error("matchesState(ineligible) misses or invents a service")
	}
	names := func() []string {
		var out []string
		for _, r := range rows {
			out = append(out, r.Name)
		}
		return out
	}
	for by, want := range map[string][]string{
		"":           {"a", "b", "c", "d", "e"},
		"owner":      {"e", "c", "d", "b", "a"},
		"unknown":    {"b", "a", "c", "d", "e"},
		"ineligible": {"c", "b", "a", "d", "e"},
		"age":        {"d", "e", "b", "c", "a"},
	} {
		sortServices(rows, by)
		if got := names(); !slices.Equal(got, want) {
			t.Errorf("sort %q = %v, want %v", by, got, want)
		}
	}
}
