package webui_test

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/musterhq/muster/db/dbtest"
	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/wait"
	"github.com/musterhq/muster/internal/zonehistory"
)

// az1Unknown is the data-values of az1's unknown-instances sparkline on
// an overview page.
var az1Unknown = regexp.MustCompile(`(?s)<tr data-zone="az1">.*?spark-unknown.*?data-values="([^"]*)"`)

func overviewZones(t *testing.T, b *browser) (table, az1 string) {
	t.Helper()
	p := b.get("/ui/")
	table = section(p.body, "zone-trend-table")
	table, _, _ = strings.Cut(table, "</table>")
	m := az1Unknown.FindStringSubmatch(table)
	if m == nil {
		t.Fatalf("no az1 unknown sparkline on the overview: %s", table)
	}
	return table, m[1]
}

// TestOverviewSparklinesSurviveARestartAndAgree: the zone history is kept
// in PostgreSQL. Replica a samples az1 (0, 3 and 0 unknown instances)
// and stops; replica b, started on the same database (a deploy), draws
// the same three points; replica c joins and takes the shards, so it
// alone writes the next sample (b's sampling writes nothing), and b and
// c then serve the same sparklines, point for point.
func TestOverviewSparklinesSurviveARestartAndAgree(t *testing.T) {
	t.Parallel()
	url := dbtest.URL(t)
	var before string
	t.Run("replica a samples, then stops", func(t *testing.T) {
		a := apptest.New(t, apptest.Options{UI: true, DatabaseURL: url, Replica: "a"})
		report := payWithEvidence(t, a)
		sample := func() {
			t.Helper()
			if err := a.App.ZoneHistory.SampleNow(t.Context()); err != nil {
				t.Fatal(err)
			}
		}
		sample()
		for range 3 { // silence: pay's instances go unknown
			a.Clock.Advance(time.Minute)
			a.Evaluator.EvaluateNow()
			a.Publisher.RunOnce()
		}
		sample()
		for range 3 {
			report()
			a.Clock.Advance(10 * time.Second)
			a.Evaluator.EvaluateNow()
			a.Publisher.RunOnce()
		}
		sample()
		va := newBrowser(t, a)
		va.signIn("vera")
		_, before = overviewZones(t, va)
		if before != "0 3 0" {
			t.Fatalf("a draws az1's unknown instances as %q, want 0 3 0 (the test's premise)", before)
		}
	})

	b := apptest.New(t, apptest.Options{UI: true, DatabaseURL: url, Replica: "b"})
	vb := newBrowser(t, b)
	vb.signIn("vera")
	if _, got := overviewZones(t, vb); got != before {
		t.Fatalf("after the restart az1's unknown instances are drawn as %q, want the samples from before (%q)", got, before)
	}

	c := apptest.New(t, apptest.Options{UI: true, DatabaseURL: url, Replica: "c"}) // takes every shard
	vc := newBrowser(t, c)
	vc.signIn("vera")
	wait.For(t, 20*time.Second, "c owns the zone history's shard", func() bool {
		_, ok := c.App.Ownership.Owns("history:" + zonehistory.KindZone)
		return ok
	})
	// c's clock is its own; the next sample is due half an interval
	// after the last row, wherever a's clock left it.
	c.Clock.Advance(10 * time.Minute)
	c.TakeOver(t) // the publisher adopts the shards it was dealt
	c.SyncNow(t)
	c.Evaluator.EvaluateNow()
	c.Publisher.RunOnce()
	c.Clock.Advance(2 * time.Second)
	c.Publisher.RunOnce()
	if err := c.App.ZoneHistory.SampleNow(t.Context()); err != nil {
		t.Fatal(err)
	}
	b.Clock.Advance(20 * time.Minute)
	if err := b.App.ZoneHistory.SampleNow(t.Context()); err != nil { // not the writer any more
		t.Fatal(err)
	}
	tableB, gotB := overviewZones(t, vb)
	tableC, gotC := overviewZones(t, vc)
	if n := len(strings.Fields(gotC)); n != 4 || !strings.HasPrefix(gotC, before+" ") {
		t.Fatalf("c draws %q, want the 3 samples from before and its own (b, no longer the writer, must add none)", gotC)
	}
	if gotB != gotC || tableB != tableC {
		t.Fatalf("the replicas draw different sparklines:\nb: %s\nc: %s", tableB, tableC)
	}
}
