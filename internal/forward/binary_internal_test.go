package forward

import (
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/musterhq/muster/internal/evaluator"
)

func randomItems(rng *rand.Rand, n int) []item {
	actors := []*Actor{
		{Subject: "prober-az1", Kind: "prober"},
		{Subject: "web", Kind: "workload", Service: "web", Pod: "web-0", Cluster: "eks-1", Issuer: "https://issuer.example", Home: true},
	}
	classes := []string{"probe", "self", "passive", "future-class"}
	outcomes := []string{"", "success", "failure", "hard_failure", "unobservable", "future-outcome"}
	reports := make([]evaluator.Report, n)
	for i := range reports {
		r := evaluator.Report{Class: classes[rng.IntN(len(classes))], Outcome: outcomes[rng.IntN(len(outcomes))]}
		var id [16]byte
		for j := range id {
			id[j] = byte(rng.Uint32())
		}
		r.InstanceID = uuid.UUID(id)
		if rng.IntN(2) == 0 {
			at := time.Unix(0, rng.Int64N(1<<62)-1<<61).UTC()
			r.At = &at
		}
		if rng.IntN(3) == 0 {
			s, f := rng.Uint32(), uint32(rng.IntN(3))
			r.Successes = &s
			if rng.IntN(2) == 0 {
				r.Failures = &f
			}
		}
		if rng.IntN(5) == 0 {
			r.Dependency = "db"
		}
		reports[i] = r
	}
	// The first seven items are one actor's, the rest another's.
	cut := min(n, 7)
	return append(newItems(actors[0], reports[:cut], time.Time{}), newItems(actors[1], reports[cut:], time.Time{})...)
}

// TestCompactBodyCarriesWhatJSONDoes: the compact body decodes to the
// batches the JSON body decodes to, for every class, outcome and
// optional member, known names or not; and is several times smaller.
func TestCompactBodyCarriesWhatJSONDoes(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{1, 2, 7, 100, 5000} {
		items := randomItems(rng, n)
		compact, err := encodeBinary(items)
		if err != nil {
			t.Fatal(err)
		}
		got, err := DecodeBinary(compact, evaluator.MaxBatch)
		if err != nil {
			t.Fatalf("%d items: %v", n, err)
		}
		js, err := encode(items)
		if err != nil {
			t.Fatal(err)
		}
		var want Body
		if err := json.Unmarshal(js, &want); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want.Batches) {
			t.Fatalf("%d items: the compact body decodes to\n%+v\nthe JSON one to\n%+v", n, got, want.Batches)
		}
		if n == 5000 {
			t.Logf("5,000 reports: %d bytes compact, %d as JSON", len(compact), len(js))
			if len(compact)*2 > len(js) {
				t.Errorf("the compact body (%d bytes) is not half the JSON one (%d)", len(compact), len(js))
			}
		}
	}
}

// TestCompactBodyRefusals: a body that is cut short, has trailing bytes,
// claims more reports than it may hold, or a string over its bound is
// refused whole.
func TestCompactBodyRefusals(t *testing.T) {
	good, err := encodeBinary(randomItems(rand.New(rand.NewPCG(3, 4)), 10))
	if err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string][]byte{
		"empty":     nil,
		"no magic":  []byte("MEV2\x01"),
		"cut short": good[:len(good)-1],
		"trailing":  append(append([]byte{}, good...), 0),
		"too many":  append([]byte("MEV1"), 0xff, 0xff, 0x03),
	} {
		if _, err := DecodeBinary(body, evaluator.MaxBatch); err == nil {
			t.Errorf("%s: decoded", name)
		}
	}
	if _, err := DecodeBinary(good, 9); err == nil {
		t.Errorf("10 reports decoded with a bound of 9")
	}
}

// FuzzDecodeBinary: whatever the bytes, decoding refuses or succeeds
// without panicking, within its bound, and what it decodes encodes back
// to a body that decodes to the same.
func FuzzDecodeBinary(f *testing.F) {
	good, _ := encodeBinary(randomItems(rand.New(rand.NewPCG(5, 6)), 20))
	f.Add(good)
	f.Add([]byte("MEV1\x00"))
	f.Fuzz(func(t *testing.T, body []byte) {
		batches, err := DecodeBinary(body, 1000)
		if err != nil {
			return
		}
		var items []item
		n := 0
		for _, b := range batches {
			a := b.Actor
			items = append(items, newItems(&a, b.Reports, time.Time{})...)
			n += len(b.Reports)
		}
		if n > 1000 {
			t.Fatalf("%d reports decoded with a bound of 1000", n)
		}
		again, err := encodeBinary(items)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := DecodeBinary(again, 1000); err != nil {
			t.Fatalf("what decoded does not decode again: %v", err)
		}
	})
}

func BenchmarkCodec(b *testing.B) {
	random := randomItems(rand.New(rand.NewPCG(7, 8)), 1000)
	reports := make([]evaluator.Report, len(random))
	for i := range random {
		r := random[i].report()
		reports[i] = evaluator.Report{InstanceID: r.InstanceID, Class: "probe", Outcome: "success", At: r.At}
	}
	items := newItems(random[0].o.actor, reports, time.Time{})
	b.Run("compact", func(b *testing.B) {
		for b.Loop() {
			body, _ := encodeBinary(items)
			if _, err := DecodeBinary(body, evaluator.MaxBatch); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("json", func(b *testing.B) {
		for b.Loop() {
			body, _ := encode(items)
			var v Body
			if err := json.Unmarshal(body, &v); err != nil {
				b.Fatal(err)
			}
		}
	})
}
