package notify_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/musterhq/muster/internal/notify"
	"github.com/musterhq/muster/internal/testclock"
)

// TestAlertmanagerSet: each alert goes to every member of an Alertmanager
// set; a member that fails is retried on its own, and neither delays nor
// duplicates what the healthy member got. Each member is its own series
// in the metrics, TEAM@HOST.
func TestAlertmanagerSet(t *testing.T) {
	t.Parallel()
	up, down := &flaky{}, &flaky{fail: 2}
	upSrv, downSrv := httptest.NewServer(up), httptest.NewServer(down)
	t.Cleanup(upSrv.Close)
	t.Cleanup(downSrv.Close)
	clock := testclock.New(time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC))
	alarms := &alarmSet{}
	alarms.set(notify.Alarm{Kind: "shard_unowned", Since: clock.Now(), Detail: "3 shards"})
	n, reg := newNotifier(t, clock, alarms, notify.Targets{Platform: &notify.Target{URLs: []string{upSrv.URL, downSrv.URL}}}, nil)

	n.RunOnce(t.Context())
	if posts, acc := up.state(); posts != 1 || len(acc) != 1 {
		t.Fatalf("the healthy member: %d posts, %d accepted; want it at once", posts, len(acc))
	}
	if posts, acc := down.state(); posts != 1 || len(acc) != 0 {
		t.Fatalf("the failing member: %d posts, %d accepted", posts, len(acc))
	}
	upHost, downHost := hostOfURL(t, upSrv.URL), hostOfURL(t, downSrv.URL)
	if got := metric(t, reg, "muster_alerts_send_failures_total", map[string]string{"target": "platform@" + downHost}); got != 1 {
		t.Fatalf("failures of the failing member %v, want 1", got)
	}
	clock.Advance(time.Second)
	n.RunOnce(t.Context())
	clock.Advance(2 * time.Second)
	n.RunOnce(t.Context())
	if _, acc := down.state(); len(acc) != 1 || acc[0][0].Labels["alertname"] != "shard_unowned" {
		t.Fatalf("the failing member after its retries accepted %v", acc)
	}
	if posts, _ := up.state(); posts != 1 {
		t.Fatalf("the healthy member got %d posts; the other's retries must not resend to it", posts)
	}
	for _, h := range []string{upHost, downHost} {
		if got := metric(t, reg, "muster_alerts_sent_total", map[string]string{"target": "platform@" + h, "status": "firing"}); got != 1 {
			t.Fatalf("sent to %s: %v, want 1", h, got)
		}
	}
}

// TestLoadTargetSets: urls (and a ca on an http member) are checked when loaded, never
// repeating a URL.
func TestLoadTargetSets(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o644); err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string]string{
		"both.yaml":    "platform: {url: \"https://a?token=s3cret\", urls: [\"https://b\"]}\n",
		"none.yaml":    "platform: {kind: webhook}\n",
		"twice.yaml":   "platform: {urls: [\"https://am-0:9093?token=s3cret\", \"https://am-0:9093\"]}\n",
		"scheme.yaml":  "platform: {urls: [\"https://am-0:9093\", \"ftp://x?token=s3cret\"]}\n",
		"httpca.yaml":  "platform: {urls: [\"https://am-0:9093\", \"http://am-1:9093?token=s3cret\"], ca: " + notPEM + "}\n",
		"toomany.yaml": "platform: {urls: [" + manyURLs(17) + "]}\n",
	} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := notify.LoadTargets(p)
		if err == nil {
			t.Errorf("%s loaded", name)
		} else if strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%s: the error repeats the URL: %v", name, err)
		}
	}
}

func manyURLs(n int) string {
	var out []string
	for i := range n {
		out = append(out, "\"https://am-"+string(rune('a'+i))+":9093\"")
	}
	return strings.Join(out, ", ")
}

func hostOfURL(t *testing.T, raw string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return u.Host
}

// TestWebhookHearsAnAlarmOnce: a firing alert is resent to Alertmanager
// every Resend (it expires what it stops hearing about), never to a
// webhook, which would page again for the same alarm; a webhook hears a
// changed description and the resolution.
func TestWebhookHearsAnAlarmOnce(t *testing.T) {
	t.Parallel()
	am, hook := &flaky{}, &hookRecorder{}
	amSrv, hookSrv := httptest.NewServer(am), httptest.NewServer(hook)
	t.Cleanup(amSrv.Close)
	t.Cleanup(hookSrv.Close)
	clock := testclock.New(time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC))
	alarms := &alarmSet{}
	alarm := notify.Alarm{Kind: "instance_quarantined", Service: "web", Instance: "i-1", Since: clock.Now(), Detail: "3 flaps"}
	alarms.set(alarm)
	n, _ := newNotifier(t, clock, alarms, notify.Targets{
		Platform: &notify.Target{URL: amSrv.URL},
		Teams:    map[string]notify.Target{"payments": {URL: hookSrv.URL, Kind: notify.KindWebhook}},
	}, nil)
	n.RunOnce(t.Context())
	for range 3 {
		clock.Advance(time.Minute)
		n.RunOnce(t.Context())
	}
	if posts, _ := am.state(); posts != 4 {
		t.Fatalf("Alertmanager got %d posts over three resends, want 4", posts)
	}
	if got := hook.statuses(); len(got) != 1 || got[0] != "firing" {
		t.Fatalf("webhook heard %v over three resends, want one firing", got)
	}
	alarm.Detail = "4 flaps"
	alarms.set(alarm)
	n.RunOnce(t.Context())
	alarms.set()
	n.RunOnce(t.Context())
	if got := hook.statuses(); len(got) != 3 || got[1] != "firing" || got[2] != "resolved" {
		t.Fatalf("webhook heard %v, want firing, firing (the new description), resolved", got)
	}
}

type hookRecorder struct {
	mu   sync.Mutex
	seen []string
}

func (h *hookRecorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var b notify.Webhook
	if err := json.NewDecoder(r.Body).Decode(&b); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	h.mu.Lock()
	h.seen = append(h.seen, b.Status)
	h.mu.Unlock()
}

func (h *hookRecorder) statuses() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.seen...)
}
