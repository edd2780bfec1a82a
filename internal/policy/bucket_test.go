package policy_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/musterhq/muster/internal/policy"
)

type stepClock struct{ t time.Time }

func (c *stepClock) now() time.Time { return c.t }

func TestBuckets(t *testing.T) {
	t.Parallel()
	clk := &stepClock{t: time.Unix(1_700_000_000, 0)}
	b, err := policy.NewBuckets(policy.Limit{Max: 10, Window: 10 * time.Second}, clk.now) // 1/s, burst 10
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		if d := b.Take("a", 1); !d.Allowed || d.Remaining != 9-i {
			t.Fatalf("take %d: %+v, want allowed with %d remaining", i, d, 9-i)
		}
	}
	d := b.Take("a", 1)
	if d.Allowed || d.Remaining != 0 || d.ResetSeconds() != 1 {
		t.Fatalf("11th take: %+v, want refused, reset 1 s", d)
	}
	// Another key has its own bucket.
	if d := b.Take("b", 1); !d.Allowed {
		t.Fatalf("another key refused: %+v", d)
	}
	clk.t = clk.t.Add(time.Second)
	if d := b.Take("a", 1); !d.Allowed {
		t.Fatalf("after a refill: %+v", d)
	}

	// Charge goes into debt; Peek refuses until it is repaid.
	if d := b.Charge("c", 25); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("charge: %+v", d)
	}
	if d := b.Peek("c"); d.Allowed || d.ResetSeconds() != 1 {
		// 25 is charged as the burst, 10: the bucket is empty, a token is 1 s away.
		t.Fatalf("peek after charging the burst: %+v, want refused for 1 s", d)
	}
	b.Charge("c", 5)
	if d := b.Peek("c"); d.Allowed || d.ResetSeconds() != 6 {
		t.Fatalf("peek 5 in debt: %+v, want refused for 6 s", d)
	}
	clk.t = clk.t.Add(6 * time.Second)
	if d := b.Peek("c"); !d.Allowed {
		t.Fatalf("peek once repaid: %+v", d)
	}
	if d := b.Take("c", 3); d.Allowed {
		t.Fatalf("take 3 with 1 token: %+v, want refused", d)
	}
}

// TestBucketsSized: a key's own allowance adds to the set's limit, its
// growth is credited at once and its shrinking cuts what the bucket holds.
func TestBucketsSized(t *testing.T) {
	t.Parallel()
	clk := &stepClock{t: time.Unix(1_700_000_000, 0)}
	b, err := policy.NewBuckets(policy.Limit{Max: 10, Window: 10 * time.Second}, clk.now) // 1/s, burst 10
	if err != nil {
		t.Fatal(err)
	}
	extra := policy.Limit{Max: 20, Window: 10 * time.Second} // +2/s, +20 burst
	for i := range 30 {
		if d := b.TakeSized("fleet", 1, extra); !d.Allowed || d.Remaining != 29-i {
			t.Fatalf("take %d: %+v, want allowed with %d remaining", i, d, 29-i)
		}
	}
	d := b.TakeSized("fleet", 1, extra)
	if d.Allowed || d.Limit != (policy.Limit{Max: 30, Window: 10 * time.Second}) || d.ResetSeconds() != 1 {
		t.Fatalf("31st take: %+v, want refused under 30 per 10 s", d)
	}
	clk.t = clk.t.Add(time.Second) // 3 a second
	for i := range 3 {
		if d := b.TakeSized("fleet", 1, extra); !d.Allowed {
			t.Fatalf("take %d after a second: %+v", i, d)
		}
	}
	if d := b.TakeSized("fleet", 1, extra); d.Allowed {
		t.Fatalf("a fourth take after a second: %+v", d)
	}
	// The fleet grows by 15: credited at once.
	grown := policy.Limit{Max: 35, Window: 10 * time.Second}
	if d := b.TakeSized("fleet", 15, grown); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("take 15 after growing by 15: %+v", d)
	}
	// Charge keeps the allowance and goes into debt.
	if d := b.Charge("fleet", 9); d.Limit.Max != 45 || d.Remaining != 0 {
		t.Fatalf("charge: %+v", d)
	}
	// It shrinks: the bucket refills to no more than the new capacity.
	clk.t = clk.t.Add(time.Minute)
	shrunk := policy.Limit{Max: 2, Window: 10 * time.Second}
	if d := b.TakeSized("fleet", 1, shrunk); !d.Allowed || d.Remaining != 11 {
		t.Fatalf("take after shrinking to 12: %+v, want 11 remaining", d)
	}
	// Take is the set's limit alone.
	clk.t = clk.t.Add(time.Minute)
	if d := b.Take("fleet", 1); !d.Allowed || d.Remaining != 9 || d.Limit != b.Limit() {
		t.Fatalf("take without an allowance: %+v", d)
	}
}

func TestBucketsSweepFullOnes(t *testing.T) {
	t.Parallel()
	clk := &stepClock{t: time.Unix(1_700_000_000, 0)}
	b, err := policy.NewBuckets(policy.Limit{Max: 2, Window: time.Second}, clk.now)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5000 {
		b.Take(fmt.Sprint("k", i), 1)
	}
	clk.t = clk.t.Add(time.Second) // every bucket refilled
	b.Take("busy", 2)
	// The set sweeps when it has doubled (at 8,192 here).
	for i := range 4000 {
		b.Take(fmt.Sprint("new", i), 1)
	}
	if got := b.Len(); got > 4001 {
		t.Fatalf("%d buckets held after 9,001 keys of which 5,000 refilled, want the full ones swept", got)
	}
	if d := b.Peek("busy"); d.Allowed {
		t.Fatalf("a bucket in use was swept: %+v", d)
	}
	// Peeking at a key creates no bucket.
	n := b.Len()
	if d := b.Peek("never-taken"); !d.Allowed || d.Remaining != 2 || b.Len() != n {
		t.Fatalf("peek at a new key: %+v, %d buckets (was %d)", d, b.Len(), n)
	}
}

// BenchmarkBucketsReportPath is what a report batch costs the limiters:
// one Take from the batch bucket, one Peek and one Charge of 1,000 items.
func BenchmarkBucketsReportPath(b *testing.B) {
	batches, _ := policy.NewBuckets(policy.Limit{Max: 1 << 30, Window: time.Second}, nil)
	items, _ := policy.NewBuckets(policy.Limit{Max: 1 << 30, Window: time.Second}, nil)
	keys := make([]string, 64)
	for i := range keys {
		keys[i] = fmt.Sprintf("prober:loadgen-prober-%d", i)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			k := keys[i%len(keys)]
			batches.Take(k, 1)
			items.Peek(k)
			items.Charge(k, 1000)
			i++
		}
	})
}
