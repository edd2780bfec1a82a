package audit_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/audit"
)

func export(t *testing.T, a *anchored, since, until time.Time) (*bytes.Buffer, audit.ExportReport) {
	t.Helper()
	ctx := context.Background()
	cps, err := audit.LoadCheckpoints(ctx, a.sink, a.keys)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	rep, err := audit.Export(ctx, db.New(a.pool), cps, a.sink, since, until, &buf)
	if err != nil {
		t.Fatal(err)
	}
	return &buf, rep
}

func TestExportVerifiesOffline(t *testing.T) {
	t.Parallel()
	a := newAnchored(t)
	a.append(t, a.pool, 4) // rows 1-4 at t0+1s..4s
	a.checkpoint(t)        // checkpoint 1: seq 4
	a.append(t, a.pool, 4) // rows 5-8
	a.checkpoint(t)        // checkpoint 2: seq 8
	a.append(t, a.pool, 4) // rows 9-12
	a.checkpoint(t)        // checkpoint 3: seq 12
	a.append(t, a.pool, 2) // rows 13-14, not anchored yet

	// Rows 2 to 6 by time; the export runs on to checkpoint 2 (seq 8) so
	// its newest row is anchored.
	since := t0.Add(2 * time.Second)
	until := t0.Add(time.Minute + 6*time.Second + time.Millisecond)
	buf, rep := export(t, a, since, until)
	if rep.FirstSeq != 2 || rep.LastSeq != 8 || rep.Checkpoints != 2 || rep.AnchoredSeq != 8 || rep.Unanchored != 0 {
		t.Fatalf("export report %+v", rep)
	}
	got, err := audit.VerifyExport(bytes.NewReader(buf.Bytes()), a.keys)
	if err != nil {
		t.Fatalf("verify export: %v", err)
	}
	if got != rep {
		t.Fatalf("verified %+v, exported %+v", got, rep)
	}

	// The unanchored tail is exported and said to be so.
	buf2, rep2 := export(t, a, t0.Add(3*time.Hour), t0.Add(4*time.Hour))
	if rep2.FirstSeq != 0 {
		t.Fatalf("an empty range: %+v", rep2)
	}
	if _, err := audit.VerifyExport(buf2, a.keys); err != nil {
		t.Fatalf("empty export: %v", err)
	}
	_, rep3 := export(t, a, t0, t0.Add(time.Hour))
	if rep3.FirstSeq != 1 || rep3.LastSeq != 14 || rep3.Unanchored != 2 {
		t.Fatalf("whole-chain export %+v", rep3)
	}

	// Any change to a row, a checkpoint or the line order is found.
	for _, tc := range []struct {
		name, old, new, kind string
	}{
		{"row content", `"target":"svc-4"`, `"target":"svc-x"`, "content"},
		{"checkpoint", `\"seq\":8`, `\"seq\":7`, "signature"},
	} {
		b := bytes.Replace(buf.Bytes(), []byte(tc.old), []byte(tc.new), 1)
		if bytes.Equal(b, buf.Bytes()) {
			t.Fatalf("%s: %s not in the export", tc.name, tc.old)
		}
		_, err := audit.VerifyExport(bytes.NewReader(b), a.keys)
		var be *audit.BrokenError
		if !errors.As(err, &be) || be.Kind != tc.kind {
			t.Errorf("%s: %v, want %s", tc.name, err, tc.kind)
		}
	}
	// A row dropped from the middle.
	lines := strings.Split(buf.String(), "\n")
	dropped := strings.Join(append(append([]string{}, lines[:3]...), lines[4:]...), "\n")
	if _, err := audit.VerifyExport(strings.NewReader(dropped), a.keys); err == nil {
		t.Error("an export with a row dropped verified")
	}
	// Rewritten and re-chained rows no longer match the checkpoint.
	superuser(t, a.pool, append([]string{"UPDATE audit_events SET reason = 'x' WHERE seq = 5"}, rechain(5, 14)...)...)
	ctx := context.Background()
	cps, _ := audit.LoadCheckpoints(ctx, a.sink, a.keys)
	var rewritten bytes.Buffer
	if _, err := audit.Export(ctx, db.New(a.pool), cps, a.sink, since, until, &rewritten); err != nil {
		t.Fatal(err)
	}
	_, err = audit.VerifyExport(&rewritten, a.keys)
	var be *audit.BrokenError
	if !errors.As(err, &be) || be.Kind != "rewritten" || be.Seq != 8 || be.Checkpoint != audit.CheckpointName(2) {
		t.Fatalf("rewritten export: %v", err)
	}
}

// FuzzVerifyExport: whatever an export file holds, VerifyExport returns
// an error or a report, never panics, and never accepts a changed row.
func FuzzVerifyExport(f *testing.F) {
	f.Add([]byte(`{"type":"header","v":1,"first_seq":1,"last_seq":1}` + "\n" + `{"type":"row","row":{"seq":1,"at":"2026-01-01T00:00:00Z","actor_kind":"a","actor":"a","action":"a","target_kind":"a","target":"a","outcome":"accepted","reason":"","before":null,"after":"{}","prev_hash":"00","hash":"00"}}`))
	f.Add([]byte(`{"type":"header","v":1}` + "\n" + `{"type":"checkpoint","name":"0000000000000001.json","file":"{\"payload\":{\"v\":1},\"signature\":\"\"}"}`))
	f.Add([]byte("{}\n\n\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		_, _ = audit.VerifyExport(bytes.NewReader(data), audit.Keys{})
	})
}

// FuzzDecodeCheckpoint: a checkpoint file from a sink is outside input.
func FuzzDecodeCheckpoint(f *testing.F) {
	f.Add([]byte(`{"payload":{"v":1,"n":1,"seq":0,"head":"","at":"2026-01-01T00:00:00Z","prev":"","key_id":"x"},"signature":"AA=="}`))
	f.Add([]byte(`{"payload":1}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		if _, err := audit.DecodeCheckpoint(data, audit.Keys{}); err == nil {
			t.Fatal("a checkpoint verified without a trusted key")
		}
	})
}
