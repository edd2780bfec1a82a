package webui

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/musterhq/muster/internal/evaluator"
	"github.com/musterhq/muster/internal/guardlog"
	"github.com/musterhq/muster/internal/policy"
	"github.com/musterhq/muster/views"
)

// BenchmarkServiceTimeline1000Instances24h lays out and renders the
// timeline of a 1,000-instance service over 24 h: three zones, every
// instance changing state a few times, one in ten flapping (40 changes),
// guard trips and overrides. The data is built in memory (the database
// reads are not timed); the figure is server-side time per page (issue
// 30 asks for at most 100 ms), the page's size is reported beside it.
func BenchmarkServiceTimeline1000Instances24h(b *testing.B) {
	const instances = 1000
	to := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	from := to.Add(-24 * time.Hour)
	rng := rand.New(rand.NewPCG(1, 2))
	states := []string{"eligible", "degraded", "ineligible", "unknown"}
	d := timelineData{From: from, To: to, Tick: tickFor(24 * time.Hour), StateAt: map[uuid.UUID]evaluator.StateAt{}}
	for i := range instances {
		id := uuid.New()
		d.Instances = append(d.Instances, timelineInstance{ID: id, Label: fmt.Sprintf("10.%d.%d.%d:8080", i%3, i/250, i%250),
			Zone: fmt.Sprintf("az%d", i%3+1), State: "eligible"})
		d.StateAt[id] = evaluator.StateAt{State: "eligible", Before: true, At: from.Add(-time.Hour)}
		n := 4
		if i%10 == 0 {
			n = 40
		}
		at := make([]time.Time, n)
		for j := range at {
			at[j] = from.Add(time.Duration(rng.Int64N(int64(24 * time.Hour))))
		}
		slices.SortFunc(at, time.Time.Compare)
		st := "eligible"
		for j := range n {
			next := states[rng.IntN(len(states))]
			if next == st {
				next = "eligible"
				if st == "eligible" {
					next = "ineligible"
				}
			}
			d.Changes = append(d.Changes, evaluator.Change{InstanceID: id, From: st, To: next, Weight: 1,
				At: at[j], Reason: "decayed failure rate at or above removal"})
			st = next
		}
		if i%50 == 0 {
			d.Overrides = append(d.Overrides, policy.Override{InstanceID: id, Action: "mark_ineligible", Actor: "operator:oscar",
				Justification: "CHG-1234 draining a bad host", State: "active", CreatedAt: from.Add(time.Duration(i) * time.Minute)})
		}
	}
	// The log is read oldest first.
	slices.SortStableFunc(d.Changes, func(a, b evaluator.Change) int { return a.At.Compare(b.At) })
	for z := 1; z <= 3; z++ {
		for h := 0; h < 24; h += 6 {
			c := from.Add(time.Duration(h)*time.Hour + 20*time.Minute)
			d.Guards = append(d.Guards, guardlog.Episode{Zone: fmt.Sprintf("az%d", z), TrippedAt: from.Add(time.Duration(h) * time.Hour), ClearedAt: &c,
				Detail: "eligible fraction 0.20 below 0.50: publishing the full zone"})
		}
	}
	var buf bytes.Buffer
	pg := views.Page{Base: "/ui", Title: "svc timeline", Subject: "alice", Role: "admin", Now: to}
	b.ReportAllocs()
	for b.Loop() {
		tl := views.Timeline{Page: pg, Service: "svc", Span: "24h"}
		layoutTimeline(&tl, d)
		buf.Reset()
		if err := views.TimelinePage(tl).Render(b.Context(), &buf); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(buf.Len()), "page-bytes")
	b.ReportMetric(float64(b.Elapsed())/float64(b.N)/float64(time.Millisecond), "ms/page")
}
