package app_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/devissuer"
	"github.com/musterhq/muster/internal/evaluator"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/notify"
	"github.com/musterhq/muster/internal/registry"
	"github.com/musterhq/muster/internal/testbin"
	"github.com/musterhq/muster/internal/wait"
)

// amMessage is what Alertmanager's webhook receiver posts.
type amMessage struct {
	Receiver string `json:"receiver"`
	Status   string `json:"status"`
	Alerts   []struct {
		Status      string            `json:"status"`
		Labels      map[string]string `json:"labels"`
		Annotations map[string]string `json:"annotations"`
	} `json:"alerts"`
}

// receiver is a loopback webhook receiver Alertmanager notifies.
type receiver struct {
	mu   sync.Mutex
	msgs []amMessage
	srv  *httptest.Server
}

func newReceiver(t *testing.T) *receiver {
	r := &receiver{}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		var m amMessage
		if err := json.NewDecoder(req.Body).Decode(&m); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.mu.Lock()
		r.msgs = append(r.msgs, m)
		r.mu.Unlock()
	}))
	t.Cleanup(r.srv.Close)
	return r
}

// find returns the annotations of an alert named alertname on instance
// with status, if one was received.
func (r *receiver) find(alertname, instance, status string) (map[string]string, map[string]string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range r.msgs {
		for _, a := range m.Alerts {
			if a.Labels["alertname"] == alertname && a.Labels["instance"] == instance && a.Status == status {
				return a.Labels, a.Annotations, true
			}
		}
	}
	return nil, nil, false
}

// startAlertmanager runs Debian's Alertmanager on loopback, routing by the
// team label: team="payments" to payments, the rest to platform, both
// with resolved notifications. It returns its base URL; the process ends
// with the test.
func startAlertmanager(t *testing.T, payments, platform string) string {
	t.Helper()
	bin := testbin.Require(t, "prometheus-alertmanager")
	dir := t.TempDir()
	conf := fmt.Sprintf(`route:
  receiver: platform
  group_by: ['alertname', 'team', 'service', 'instance']
  group_wait: 100ms
  group_interval: 200ms
  repeat_interval: 1h
  routes:
    - matchers: ['team="payments"']
      receiver: payments
receivers:
  - name: platform
    webhook_configs: [{url: %q, send_resolved: true}]
  - name: payments
    webhook_configs: [{url: %q, send_resolved: true}]
`, platform, payments)
	if err := os.WriteFile(filepath.Join(dir, "alertmanager.yml"), []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, "--config.file="+filepath.Join(dir, "alertmanager.yml"), "--storage.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--cluster.listen-address=", "--log.level=warn")
	var logs strings.Builder
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cancel()
		<-exited
		if t.Failed() {
			t.Logf("alertmanager's log:\n%s", logs.String())
		}
	})
	base := "http://" + addr
	wait.For(t, 20*time.Second, "alertmanager ready", func() bool {
		select {
		case <-exited:
			t.Fatalf("alertmanager exited:\n%s", logs.String())
		default:
		}
		resp, err := http.Get(base + "/-/ready")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return base
}

// TestQuarantineAlertReachesOwningTeam (issue 30): a flap quarantine of
// an instance of web (owned by payments) reaches payments' receiver
// through a real Alertmanager, routed by the team label, with the
// instance and its flap history; when the quarantine ends, the
// resolution follows. The platform's receiver gets nothing of it: its
// route is for the alarms no team owns.
func TestQuarantineAlertReachesOwningTeam(t *testing.T) {
	t.Parallel()
	payments, platform := newReceiver(t), newReceiver(t)
	am := startAlertmanager(t, payments.srv.URL, platform.srv.URL)
	st := apptest.New(t, apptest.Options{Notify: &notify.Config{
		Targets:  notify.Targets{Platform: &notify.Target{URL: am}, Teams: map[string]notify.Target{"payments": {URL: am}}},
		Interval: 100 * time.Millisecond,
	}})
	ids, until, probe := flapUntilQuarantined(t, st)

	var labels, ann map[string]string
	wait.For(t, 30*time.Second, "payments' receiver gets the quarantine alert", func() bool {
		var ok bool
		labels, ann, ok = payments.find(evaluator.AlarmInstanceQuarantined, ids[0], "firing")
		return ok
	})
	if labels["team"] != "payments" || labels["service"] != "web" || labels["zone"] != "az1" || labels["region"] != "local" {
		t.Fatalf("labels %v", labels)
	}
	desc := ann["description"]
	if !strings.Contains(desc, ids[0]) || !strings.Contains(desc, "10.0.0.1:8080") || !strings.Contains(desc, "flap history:") ||
		strings.Count(desc, "hard failure") < 2 || !strings.Contains(ann["summary"], "quarantined") {
		t.Fatalf("annotations carry no instance and flap history: %v", ann)
	}
	if _, _, ok := platform.find(evaluator.AlarmInstanceQuarantined, ids[0], "firing"); ok {
		t.Fatal("the platform's route got payments' alert: not routed by team")
	}

	// The quarantine ends when its time is up.
	st.Clock.Set(until().Add(time.Second))
	probe("success", ids...)
	if until() != nil {
		t.Fatal("still quarantined past its end")
	}
	wait.For(t, 30*time.Second, "payments' receiver gets the resolution", func() bool {
		_, _, ok := payments.find(evaluator.AlarmInstanceQuarantined, ids[0], "resolved")
		return ok
	})
}

// flapUntilQuarantined registers web (payments) with an instance in each
// of az1-az3 assigned to prober-1, and flaps the first until the
// evaluator quarantines it. It returns the instances, the first's
// quarantine end (nil when none) and a prober report that evaluates.
func flapUntilQuarantined(t *testing.T, st *apptest.Stack) (ids []string, until func() *time.Time, probe func(outcome string, ids ...string)) {
	t.Helper()
	st.Seed(t)
	ctx := context.Background()
	admin := identity.Principal{Kind: identity.KindOperator, Subject: "alice", Role: identity.RoleAdmin}
	for i, zone := range []string{"az1", "az2", "az3"} {
		in, err := st.Registry.Register(ctx, admin, netip.Addr{}, "web", registry.Registration{Address: fmt.Sprintf("10.0.0.%d", i+1), Port: 8080, Zone: zone})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, in.ID.String())
	}
	if _, err := st.Registry.PutProberAssignments(ctx, admin, "prober-1", registry.ProberAssignments{Services: []string{"web"}}); err != nil {
		t.Fatal(err)
	}
	st.WaitReady(t)
	if err := st.Evaluator.SyncNow(ctx); err != nil {
		t.Fatal(err)
	}
	token := st.Token(t, devissuer.TokenRequest{Kind: identity.KindProber, Subject: "prober-1"})
	probe = func(outcome string, ids ...string) {
		t.Helper()
		var items []string
		for _, id := range ids {
			items = append(items, fmt.Sprintf(`{"instance_id":%q,"class":"probe","outcome":%q}`, id, outcome))
		}
		r := st.JSON(t, "POST", "/v1/reports", token, `{"reports":[`+strings.Join(items, ",")+`]}`)
		if r.Status != http.StatusOK || strings.Contains(string(r.Body), `"code"`) {
			t.Fatalf("reports: %d %s", r.Status, r.Body)
		}
		st.Evaluator.EvaluateNow()
	}
	until = func() *time.Time {
		t.Helper()
		el, err := st.Evaluator.ServiceEligibility("web")
		if err != nil {
			t.Fatal(err)
		}
		for _, in := range el.Instances {
			if in.InstanceID.String() == ids[0] {
				return in.QuarantineUntil
			}
		}
		t.Fatalf("no instance %s", ids[0])
		return nil
	}
	probe("success", ids...)
	// Flap ids[0] until the evaluator quarantines it, the others fresh.
	for i := 0; until() == nil; i++ {
		if i == 12 {
			t.Fatal("not quarantined after 12 flaps")
		}
		probe("hard_failure", ids[0])
		if until() != nil {
			break
		}
		st.Clock.Advance(35 * time.Second)
		probe("success", ids...)
		st.Clock.Advance(time.Second)
	}

	return ids, until, probe
}
