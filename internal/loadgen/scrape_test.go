package loadgen

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// TestScrapeReadsMustersMetrics: the watch load generator reads the
// figures it prints from a real exposition (client_golang's handler),
// the withdrawal lag's buckets summed over services.
func TestScrapeReadsMustersMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), collectors.NewGoCollector())
	subs := prometheus.NewGauge(prometheus.GaugeOpts{Name: "muster_watch_subscribers"})
	refused := prometheus.NewCounter(prometheus.CounterOpts{Name: "muster_watch_admission_refused_total"})
	lag := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "muster_withdrawal_lag_seconds",
		Buckets: []float64{0.1, 0.25, 0.5, 1, 2, 5}}, []string{"service"})
	reg.MustRegister(subs, refused, lag)
	subs.Set(10000)
	refused.Add(42)
	for _, o := range []struct {
		svc string
		v   float64
	}{{"web", 0.05}, {"web", 0.3}, {"api", 0.3}, {"api", 7}} {
		lag.WithLabelValues(o.svc).Observe(o.v)
	}
	token := ""
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token = r.Header.Get("Authorization")
		promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).ServeHTTP(w, r)
	}))
	defer srv.Close()
	w := &lgWatch{lgwOptions: lgwOptions{base: srv.URL}, adminToken: "tok", api: srv.Client()}
	s, err := w.scrape(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if token != "Bearer tok" {
		t.Errorf("scraped with %q", token)
	}
	if s.rss <= 0 || s.heap <= 0 || s.subscribers != 10000 || s.refused != 42 {
		t.Errorf("scrape: rss %v heap %v subscribers %v refused %v", s.rss, s.heap, s.subscribers, s.refused)
	}
	for le, want := range map[string]float64{"0.1": 1, "0.25": 1, "0.5": 3, "1": 3, "5": 3, "+Inf": 4} {
		if got := s.lagBuckets[le]; got != want {
			t.Errorf("lag bucket le=%s: %v, want %v", le, got, want)
		}
	}
}

// TestReplicaCountersReadTheRunsCost: loadgen reports reads a replica's
// CPU and churn from a real exposition: the process's CPU seconds, and
// the transitions and view deltas summed over their labels.
func TestReplicaCountersReadTheRunsCost(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	transitions := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "muster_eligibility_transitions_total"}, []string{"to"})
	deltas := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "muster_view_deltas_total"}, []string{"queue"})
	reg.MustRegister(transitions, deltas)
	transitions.WithLabelValues("eligible").Add(3)
	transitions.WithLabelValues("ineligible").Add(4)
	deltas.WithLabelValues("withdrawal").Add(5)
	deltas.WithLabelValues("addition").Add(6)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer tok" {
			http.Error(w, "no", http.StatusUnauthorized)
			return
		}
		promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).ServeHTTP(w, r)
	}))
	defer srv.Close()
	c, err := readReplicaCounters(t.Context(), srv.Client(), srv.URL, "tok")
	if err != nil {
		t.Fatal(err)
	}
	if c.transitions != 7 || c.deltas != 11 || c.cpu <= 0 {
		t.Fatalf("counters %+v, want 7 transitions, 11 deltas and some CPU", c)
	}
	if _, err := readReplicaCounters(t.Context(), srv.Client(), srv.URL, "wrong"); err == nil {
		t.Fatal("a refused scrape read no error")
	}
}
