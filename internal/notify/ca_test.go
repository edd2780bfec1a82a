package notify_test

import (
	"encoding/pem"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/musterhq/muster/internal/notify"
	"github.com/musterhq/muster/internal/testclock"
)

// TestTargetCA: a target whose https certificate chains to a private CA
// is delivered to when the targets file names that CA (a path relative
// to the file), and not with the system roots alone; a CA that does not
// load stops the notifier's start, and ca: on an http URL is refused.
func TestTargetCA(t *testing.T) {
	t.Parallel()
	am := &flaky{}
	srv := httptest.NewTLSServer(am)
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	if err := os.WriteFile(filepath.Join(dir, "am-ca.pem"), caPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "targets.yaml")
	if err := os.WriteFile(file, []byte("platform: {url: \""+srv.URL+"\", ca: am-ca.pem}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	targets, err := notify.LoadTargets(file)
	if err != nil {
		t.Fatal(err)
	}
	if targets.Platform.CA != filepath.Join(dir, "am-ca.pem") {
		t.Fatalf("ca %q, want the file beside the targets file", targets.Platform.CA)
	}
	clock := testclock.New(time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC))
	alarms := &alarmSet{}
	alarms.set(notify.Alarm{Kind: "prober_outage", Since: clock.Now()})

	// The system roots do not hold the private CA: the POST fails.
	plain, reg := newNotifier(t, clock, alarms, notify.Targets{Platform: &notify.Target{URL: srv.URL}}, nil)
	plain.RunOnce(t.Context())
	if posts, _ := am.state(); posts != 0 || metric(t, reg, "muster_alerts_send_failures_total", map[string]string{"target": "platform"}) != 1 {
		t.Fatalf("without the CA: %d posts accepted, %v failures; want the handshake refused", posts,
			metric(t, reg, "muster_alerts_send_failures_total", map[string]string{"target": "platform"}))
	}

	// With it, the alert is delivered.
	withCA, reg := newNotifier(t, clock, alarms, targets, nil)
	withCA.RunOnce(t.Context())
	if posts, accepted := am.state(); posts != 1 || len(accepted) != 1 || accepted[0][0].Labels["alertname"] != "prober_outage" {
		t.Fatalf("with the CA: %d posts, accepted %+v", posts, accepted)
	}
	if f := metric(t, reg, "muster_alerts_send_failures_total", map[string]string{"target": "platform"}); f != 0 {
		t.Fatalf("with the CA: %v failures", f)
	}

	// A bundle that does not load, or none at all, stops the start.
	if err := os.WriteFile(filepath.Join(dir, "bad.pem"), []byte("not a certificate"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, ca := range []string{filepath.Join(dir, "bad.pem"), filepath.Join(dir, "missing.pem")} {
		_, err := notify.New(notify.Config{Targets: notify.Targets{Platform: &notify.Target{URL: srv.URL, CA: ca}}, Alarms: alarms.get})
		if err == nil || !strings.Contains(err.Error(), "target platform: ca") {
			t.Errorf("ca %s: %v, want the start refused naming the target", filepath.Base(ca), err)
		}
	}
	if err := os.WriteFile(file, []byte("platform: {url: \"http://am.example:9093?token=s3cret\", ca: am-ca.pem}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := notify.LoadTargets(file); err == nil || !strings.Contains(err.Error(), "ca is for an https:// URL") || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("ca on an http URL: %v, want refused without the URL", err)
	}
}
