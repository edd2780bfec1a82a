package forward_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/musterhq/muster/internal/forward"
	"github.com/musterhq/muster/internal/peer"
	"github.com/musterhq/muster/internal/seal"
)

// BenchmarkForward measures forwarding to one peer over loopback: b.N
// offers of a 100-report batch (a reporter's typical batch), sent,
// signed, verified by the peer and acknowledged. It reports items/s and
// the p50/p99 of the offer-to-acknowledgement lag, as the peer saw each
// request complete (the lag histogram's buckets are too coarse for a
// percentile). burst offers everything at once (throughput: the lag is
// the queue's drain time); paced offers one batch every 2 ms (50,000
// items/s, a busy region's reports), the lag a steady load sees.
//
//	go test -run '^$' -bench BenchmarkForward -benchtime 2000x ./internal/forward/
func BenchmarkForward(b *testing.B) {
	b.Run("burst", func(b *testing.B) { benchForward(b, 0) })
	b.Run("paced", func(b *testing.B) { benchForward(b, 2*time.Millisecond) })
}

func benchForward(b *testing.B, every time.Duration) {
	const batch = 100
	k := newKey(b)
	verifier := &peer.Verifier{Keys: func() seal.Keys { return seal.Keys{}.With(k) }, Self: []string{"b"}}
	var received atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if _, err := verifier.Verify(r, body); err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		var fb forward.Body
		if err := json.Unmarshal(body, &fb); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		n := 0
		for _, g := range fb.Batches {
			n += len(g.Reports)
		}
		received.Add(int64(n))
		_ = json.NewEncoder(w).Encode(forward.Result{Accepted: n})
	}))
	defer srv.Close()
	reg := prometheus.NewRegistry()
	f, err := forward.New(forward.Config{
		Signer:     peer.Signer{ID: "a", Key: k},
		Peers:      func() []forward.Peer { return []forward.Peer{{ID: "b", Address: srv.URL}} },
		Registerer: reg,
		QueueLimit: 1 << 30, // measure throughput, not drops
	})
	if err != nil {
		b.Fatal(err)
	}
	if err := f.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	defer f.Stop()
	for f.Queued("b") != 0 || !registered(reg) {
		time.Sleep(time.Millisecond) // the first peer reading; not a condition under test
	}
	reports := items(batch)
	offered := make([]time.Time, b.N)
	acked := make([]time.Time, b.N)
	want := int64(b.N * batch)
	done := make(chan struct{})
	go func() {
		// Each offer is acknowledged once the peer has its last item.
		defer close(done)
		next := 0
		for next < b.N {
			got := int(received.Load() / batch)
			now := time.Now()
			for ; next < got; next++ {
				acked[next] = now
			}
			time.Sleep(50 * time.Microsecond) // the sampling period of the acknowledgements
		}
	}()
	b.ResetTimer()
	start := time.Now()
	for i := range b.N {
		if every > 0 {
			time.Sleep(time.Until(start.Add(time.Duration(i) * every))) // pacing the load
		}
		offered[i] = time.Now()
		f.Offer(prober, reports, nil)
	}
	<-done
	elapsed := time.Since(start)
	lags := make([]time.Duration, b.N)
	for i := range lags {
		lags[i] = acked[i].Sub(offered[i])
	}
	b.StopTimer()
	slices.Sort(lags)
	b.ReportMetric(float64(want)/elapsed.Seconds(), "items/s")
	b.ReportMetric(float64(lags[len(lags)/2].Microseconds())/1000, "p50-lag-ms")
	b.ReportMetric(float64(lags[len(lags)*99/100].Microseconds())/1000, "p99-lag-ms")
}

func registered(reg *prometheus.Registry) bool {
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() == "muster_evidence_forward_queue" {
			return true
		}
	}
	return false
}
