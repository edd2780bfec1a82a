package notify_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/musterhq/muster/internal/notify"
	"github.com/musterhq/muster/internal/testclock"
)

// flaky is a loopback Alertmanager stand-in that answers 503 to the first
// fail POSTs, then 200, recording what it accepted.
type flaky struct {
	mu       sync.Mutex
	fail     int
	posts    int
	accepted [][]notify.Alert
	paths    []string
}

func (f *flaky) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.posts++
	f.paths = append(f.paths, r.URL.Path)
	if f.fail > 0 {
		f.fail--
		http.Error(w, "not now", http.StatusServiceUnavailable)
		return
	}
	b, _ := io.ReadAll(r.Body)
	var as []notify.Alert
	if err := json.Unmarshal(b, &as); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	f.accepted = append(f.accepted, as)
}

func (f *flaky) state() (posts int, accepted [][]notify.Alert) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.posts, append([][]notify.Alert(nil), f.accepted...)
}

type alarmSet struct {
	mu sync.Mutex
	as []notify.Alarm
}

func (s *alarmSet) set(as ...notify.Alarm) { s.mu.Lock(); s.as = as; s.mu.Unlock() }
func (s *alarmSet) get() []notify.Alarm {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]notify.Alarm(nil), s.as...)
}

func newNotifier(t *testing.T, clock *testclock.Clock, alarms *alarmSet, targets notify.Targets, tune func(*notify.Config)) (*notify.Notifier, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg := notify.Config{Targets: targets, Alarms: alarms.get, Now: clock.Now, Jitter: func() float64 { return 0 }, Registerer: reg,
		Owner:   func(s string) (string, bool) { return map[string]string{"web": "payments"}[s], s == "web" },
		Backoff: time.Second, MaxBackoff: 8 * time.Second, MaxAttempts: 5, Resend: time.Minute}
	if tune != nil {
		tune(&cfg)
	}
	n, err := notify.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return n, reg
}

// TestRetriesWithBackoff: a target that fails is retried after 1 s, 2 s,
// 4 s (the backoff doubling, the clock injected), and the alert is
// delivered once it answers; nothing is sent before a retry is due.
func TestRetriesWithBackoff(t *testing.T) {
	t.Parallel()
	am := &flaky{fail: 3}
	srv := httptest.NewServer(am)
	t.Cleanup(srv.Close)
	clock := testclock.New(time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC))
	alarms := &alarmSet{}
	alarms.set(notify.Alarm{Kind: "fraction_guard", Service: "web", Zone: "az1", Since: clock.Now(), Detail: "guard tripped"})
	n, reg := newNotifier(t, clock, alarms, notify.Targets{Teams: map[string]notify.Target{"payments": {URL: srv.URL + "/am"}}}, nil)
	ctx := t.Context()

	n.RunOnce(ctx) // attempt 1 fails: next in 1 s
	for i, wait := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second} {
		posts, _ := am.state()
		clock.Advance(wait - time.Millisecond)
		n.RunOnce(ctx)
		if p, _ := am.state(); p != posts {
			t.Fatalf("retry %d sent %v early", i+1, time.Millisecond)
		}
		clock.Advance(time.Millisecond)
		n.RunOnce(ctx)
		if p, _ := am.state(); p != posts+1 {
			t.Fatalf("retry %d not sent after %v", i+1, wait)
		}
	}
	posts, acc := am.state()
	if posts != 4 || len(acc) != 1 || len(acc[0]) != 1 {
		t.Fatalf("after 3 failures: %d posts, accepted %v", posts, acc)
	}
	a := acc[0][0]
	if a.Labels["alertname"] != "fraction_guard" || a.Labels["team"] != "payments" || a.Labels["service"] != "web" || a.Labels["zone"] != "az1" {
		t.Fatalf("labels %v", a.Labels)
	}
	if !a.EndsAt.After(clock.Now()) {
		t.Fatalf("firing alert ends at %v, not after now %v", a.EndsAt, clock.Now())
	}
	if am.paths[0] != "/am/api/v2/alerts" {
		t.Fatalf("posted to %s, want Alertmanager's v2 alerts API", am.paths[0])
	}
	if got := metric(t, reg, "muster_alerts_send_failures_total", map[string]string{"target": "payments"}); got != 3 {
		t.Fatalf("muster_alerts_send_failures_total %v, want 3", got)
	}
	if got := metric(t, reg, "muster_alerts_sent_total", map[string]string{"target": "payments", "status": "firing"}); got != 1 {
		t.Fatalf("muster_alerts_sent_total %v, want 1", got)
	}

	// Resolution: the alarm clears; the same labels go out with endsAt now.
	alarms.set()
	n.RunOnce(ctx)
	_, acc = am.state()
	if len(acc) != 2 || acc[1][0].Labels["alarm"] != a.Labels["alarm"] || !acc[1][0].EndsAt.Equal(clock.Now()) {
		t.Fatalf("resolution: %+v", acc[len(acc)-1])
	}
}

// TestDeadLetter: a delivery that fails MaxAttempts times is counted in
// muster_alerts_dead_letter_total and never tried again.
func TestDeadLetter(t *testing.T) {
	t.Parallel()
	am := &flaky{fail: 1000}
	srv := httptest.NewServer(am)
	t.Cleanup(srv.Close)
	clock := testclock.New(time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC))
	alarms := &alarmSet{}
	alarms.set(notify.Alarm{Kind: "prober_outage", Since: clock.Now(), Detail: "prober p1 is out"})
	n, reg := newNotifier(t, clock, alarms, notify.Targets{Platform: &notify.Target{URL: srv.URL}}, nil)
	for range 50 {
		n.RunOnce(t.Context())
		clock.Advance(time.Second)
	}
	posts, _ := am.state()
	if posts != 5 {
		t.Fatalf("%d posts, want MaxAttempts (5)", posts)
	}
	if got := metric(t, reg, "muster_alerts_dead_letter_total", map[string]string{"target": "platform", "reason": "attempts"}); got != 1 {
		t.Fatalf("muster_alerts_dead_letter_total %v, want 1", got)
	}
	// Still open: it is sent again at the next resend, a new delivery.
	clock.Advance(time.Minute)
	n.RunOnce(t.Context())
	if p, _ := am.state(); p != 6 {
		t.Fatalf("%d posts after the resend interval, want 6", p)
	}
}

// TestQueueBounded: a target's queue holds at most QueueSize deliveries;
// the oldest is dead-lettered to make room.
func TestQueueBounded(t *testing.T) {
	t.Parallel()
	am := &flaky{fail: 1000}
	srv := httptest.NewServer(am)
	t.Cleanup(srv.Close)
	clock := testclock.New(time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC))
	alarms := &alarmSet{}
	var as []notify.Alarm
	for i := range 5 {
		as = append(as, notify.Alarm{Kind: "instance_unsealed", Service: "web", Instance: strings.Repeat("x", i+1), Since: clock.Now()})
	}
	alarms.set(as...)
	n, reg := newNotifier(t, clock, alarms, notify.Targets{Platform: &notify.Target{URL: srv.URL}}, func(c *notify.Config) { c.QueueSize = 3 })
	n.RunOnce(t.Context())
	if got := metric(t, reg, "muster_alerts_dead_letter_total", map[string]string{"target": "platform", "reason": "queue_full"}); got != 2 {
		t.Fatalf("queue_full dead letters %v, want 2", got)
	}
	if got := metric(t, reg, "muster_alerts_queued", map[string]string{"target": "platform"}); got != 3 {
		t.Fatalf("queued %v, want 3", got)
	}
}

// TestWebhookAndTeams: a webhook target gets {"status","alerts"}; an
// alarm of a team with a target goes to it and the platform's, one
// without only to the platform's, labelled with its owner.
func TestWebhookAndTeams(t *testing.T) {
	t.Parallel()
	type body struct {
		Status string         `json:"status"`
		Alerts []notify.Alert `json:"alerts"`
	}
	var mu sync.Mutex
	got := map[string][]body{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var b body
		if err := json.NewDecoder(r.Body).Decode(&b); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		mu.Lock()
		got[r.URL.Path] = append(got[r.URL.Path], b)
		mu.Unlock()
	}))
	t.Cleanup(srv.Close)
	clock := testclock.New(time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC))
	alarms := &alarmSet{}
	alarms.set(notify.Alarm{Kind: "instance_quarantined", Service: "web", Instance: "i-1", Since: clock.Now(), Detail: "flap history"},
		notify.Alarm{Kind: "shiftback_pending", Service: "api", Since: clock.Now()})
	n, _ := newNotifier(t, clock, alarms, notify.Targets{
		Platform: &notify.Target{URL: srv.URL + "/platform", Kind: notify.KindWebhook},
		Teams:    map[string]notify.Target{"payments": {URL: srv.URL + "/payments?token=secret", Kind: notify.KindWebhook}},
	}, nil)
	n.RunOnce(t.Context())
	mu.Lock()
	defer mu.Unlock()
	if len(got["/payments"]) != 1 || len(got["/payments"][0].Alerts) != 1 || got["/payments"][0].Status != "firing" {
		t.Fatalf("payments got %+v", got["/payments"])
	}
	if a := got["/payments"][0].Alerts[0]; a.Labels["instance"] != "i-1" || a.Labels["team"] != "payments" || a.Annotations["description"] != "flap history" || a.Status != "firing" {
		t.Fatalf("payments' alert %+v", a)
	}
	if len(got["/platform"]) != 1 || len(got["/platform"][0].Alerts) != 2 {
		t.Fatalf("platform got %+v", got["/platform"])
	}
	for _, a := range got["/platform"][0].Alerts {
		if want := map[string]string{"web": "payments", "api": "platform"}[a.Labels["service"]]; a.Labels["team"] != want {
			t.Fatalf("%s labelled team %s, want %s", a.Labels["service"], a.Labels["team"], want)
		}
	}
}

// metric is the value of name's series with exactly labels (0 if none).
func metric(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			if len(m.GetLabel()) != len(labels) {
				continue
			}
			for _, lp := range m.GetLabel() {
				if labels[lp.GetName()] != lp.GetValue() {
					continue next
				}
			}
			return m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return 0
}
