package zonehistory

import (
	"testing"
	"time"

	"github.com/musterhq/muster/db/dbtest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// TestTableIsTheRecord: with a database, what the writer samples is what
// every History of the kind reads (another replica's, one started after
// it), a sample within half an interval of the last row is not written,
// rows older than Keep are deleted, and while the database does not
// answer a History draws its own memory.
func TestTableIsTheRecord(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	now := time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	writer, err := New(Config{Read: func() map[string]Counts { return map[string]Counts{"az1": {Eligible: 2, Total: 3}} },
		Pool: pool, Kind: KindZone, Now: clock, Keep: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	for _, step := range []time.Duration{0, 30 * time.Second, 10 * time.Second, 30 * time.Second} {
		now = now.Add(step)
		if err := writer.SampleNow(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	// Another replica's History, its own reading different: it draws the
	// table's points, not its own.
	reader, err := New(Config{Read: func() map[string]Counts { return map[string]Counts{"az9": {}} }, Pool: pool, Kind: KindZone, Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	got := reader.Since(t.Context(), time.Time{})
	if len(got) != 1 || got[0].Zone != "az1" || len(got[0].Samples) != 3 {
		t.Fatalf("the reader draws %+v, want az1's 3 samples (the one 10 s after the last not written)", got)
	}
	if prober := (&History{cfg: Config{Pool: pool, Kind: KindProber, Timeout: time.Second}, log: writer.log}).Since(t.Context(), time.Time{}); len(prober) != 0 {
		t.Fatalf("the prober kind reads the zones' rows: %+v", prober)
	}

	now = now.Add(20 * time.Minute)
	if err := writer.SampleNow(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := reader.Since(t.Context(), time.Time{}); len(got) != 1 || len(got[0].Samples) != 1 {
		t.Fatalf("after Keep: %+v, want the newest sample alone", got)
	}

	if err := reader.SampleNow(t.Context()); err != nil {
		t.Fatal(err)
	}
	pool.Close()
	if got := reader.Since(t.Context(), time.Time{}); len(got) != 1 || got[0].Zone != "az9" {
		t.Fatalf("without the database the reader draws %+v, want its own sample of az9", got)
	}
}
