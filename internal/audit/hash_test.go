package audit_test

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/db/dbtest"
	"github.com/musterhq/muster/internal/audit"
)

// TestGoDigestAgreesWithTheInsertPath keeps the two definitions of a row's
// hash in step: the audit_events_seal trigger (SQL, audit_event_digest)
// that seals a row at insert, and Row.Digest (Go), which verification
// uses. Any input on which they differ would make verify fail on an
// honest chain.
func TestGoDigestAgreesWithTheInsertPath(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.New(t)
	var ctrl strings.Builder
	for c := range 0x20 {
		if c != 0 {
			ctrl.WriteByte(byte(c))
		}
	}
	ctrl.WriteString("\x7f \"quoted\" back\\slash / é ü 日本 🦀 \u2028\u2029")
	odd := ctrl.String()
	entries := []audit.Entry{
		{ActorKind: "operator", Actor: "operator:oscar", Action: "contract.update", TargetKind: "service", Target: "web", Outcome: audit.Accepted},
		{ActorKind: odd, Actor: odd, Action: odd, TargetKind: odd, Target: odd, Outcome: audit.Refused, Reason: odd,
			Before: map[string]any{"s": odd, "k\n": []any{1, 2.5, -3e-7, 1e300, true, nil, map[string]any{}}, "z": []any{}},
			After:  json.RawMessage(`{"b":1,"a":{"long key":[1.0,1.50,100e-2,12345678901234567890123]},"\u00e9":"\ud83e\udd80"}`)},
		{ActorKind: "", Actor: "", Action: "", TargetKind: "", Target: "", Outcome: audit.Accepted, Before: "just a string", After: 42},
		{ActorKind: "system", Actor: "system", Action: "x", TargetKind: "instance", Target: "t", Outcome: audit.Accepted, Before: []any{}, After: json.RawMessage(`null`)},
	}
	times := []time.Time{
		time.Date(2026, 11, 29, 12, 0, 0, 123456789, time.UTC),
		time.Date(1969, 12, 31, 23, 59, 59, 999999000, time.UTC),
		time.Date(2100, 1, 1, 0, 0, 0, 1000, time.FixedZone("x", 5*3600+1800)),
		time.Unix(0, 0),
	}
	for i, e := range entries {
		for j, at := range times {
			ev, err := audit.AppendAlone(ctx, pool, at, e)
			if err != nil {
				t.Fatalf("entry %d time %d: %v", i, j, err)
			}
			_ = ev
		}
	}
	q := db.New(pool)
	rep, err := audit.Verify(ctx, q)
	if err != nil {
		t.Fatalf("Go verification of an honest chain: %v", err)
	}
	if rep.Rows != int64(len(entries)*len(times)) {
		t.Fatalf("verified %d rows, want %d", rep.Rows, len(entries)*len(times))
	}
	// And the SQL function, asked directly, gives what Go computes.
	rows, err := pool.Query(ctx, "SELECT seq, audit_event_digest(audit_events.*) FROM audit_events ORDER BY seq")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	sqlDigest := map[int64][]byte{}
	for rows.Next() {
		var seq int64
		var d []byte
		if err := rows.Scan(&seq, &d); err != nil {
			t.Fatal(err)
		}
		sqlDigest[seq] = d
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	r, err := audit.Rows(ctx, q, 1, rep.HeadSeq)
	if err != nil {
		t.Fatal(err)
	}
	for _, row := range r {
		if got, want := hex.EncodeToString(row.Digest()), hex.EncodeToString(sqlDigest[row.Seq]); got != want {
			t.Errorf("seq %d: Go digest %s, SQL digest %s; canonical form %q", row.Seq, got, want, row.Canonical())
		}
	}
}

// BenchmarkVerify is `muster audit verify`'s rate: rows read and rehashed
// in Go per second, over a 10,000-row chain built by the insert trigger.
func BenchmarkVerify(b *testing.B) {
	ctx := context.Background()
	pool := dbtest.New(b)
	if _, err := pool.Exec(ctx, `DO $$
DECLARE prev bytea := '\x0000000000000000000000000000000000000000000000000000000000000000'::bytea;
BEGIN
  FOR i IN 1..10000 LOOP
    INSERT INTO audit_events (seq, at, actor_kind, actor, action, target_kind, target, outcome, reason, before, after, prev_hash, hash)
    VALUES (i, now(), 'operator', 'operator:oscar', 'contract.put', 'service', 'web', 'accepted', '',
            jsonb_build_object('n', i), jsonb_build_object('n', i + 1, 'deps', jsonb_build_array('a', 'b')), prev, ''::bytea)
    RETURNING hash INTO prev;
  END LOOP;
END $$`); err != nil {
		b.Fatal(err)
	}
	q := db.New(pool)
	b.ResetTimer()
	for b.Loop() {
		rep, err := audit.Verify(ctx, q)
		if err != nil || rep.Rows != 10000 {
			b.Fatal(rep, err)
		}
	}
	b.ReportMetric(float64(10000*b.N)/b.Elapsed().Seconds(), "rows/s")
}
