package reconcile_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/reconcile"
	"github.com/musterhq/muster/internal/registry"
)

func snapshotJSON(n int, from int) string {
	var rows []string
	for i := from; i < from+n; i++ {
		rows = append(rows, fmt.Sprintf(`{"id":"i-%04d","service":"web","address":"10.4.0.%d","port":8080,"zone":"az1"}`, i, i))
	}
	return `{"instances":[` + strings.Join(rows, ",") + `]}`
}

// writeAtomic replaces path as an exporter should: a new file renamed
// over the old one, so a reader sees the old snapshot or the new, whole.
func writeAtomic(t *testing.T, path, body string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

type snapshotHarness struct {
	t       *testing.T
	st      *apptest.Stack
	rc      *reconcile.Reconciler
	w       *reconcile.Worker
	metrics *prometheus.Registry
}

func newSnapshotHarness(t *testing.T, cfg reconcile.SnapshotConfig) *snapshotHarness {
	t.Helper()
	st := apptest.New(t, apptest.Options{})
	st.Seed(t)
	src, err := reconcile.NewSnapshotSource(cfg)
	if err != nil {
		t.Fatal(err)
	}
	m := prometheus.NewRegistry()
	rc, err := reconcile.New(reconcile.Config{Sources: []reconcile.Source{src}, Registry: st.Registry, Evidence: st.Evaluator, Now: st.Clock.Now, Registerer: m})
	if err != nil {
		t.Fatal(err)
	}
	return &snapshotHarness{t: t, st: st, rc: rc, w: rc.Workers()[0], metrics: m}
}

func (h *snapshotHarness) live() int {
	h.t.Helper()
	ins, err := h.st.Registry.ReconciledInstances(h.t.Context(), h.w.Name())
	if err != nil {
		h.t.Fatal(err)
	}
	return len(ins)
}

// errors reads muster_reconcile_errors_total of the source.
func (h *snapshotHarness) errors() float64 {
	h.t.Helper()
	mfs, err := h.metrics.Gather()
	if err != nil {
		h.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "muster_reconcile_errors_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "source" && l.GetValue() == h.w.Name() {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// TestSnapshotFile: a JSON snapshot file rewritten in place (atomic
// rename) is reconciled; a truncated one and an invalid one are refused
// whole, counted, and the last state is kept.
func TestSnapshotFile(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "web.json")
	writeAtomic(t, path, snapshotJSON(5, 1))
	h := newSnapshotHarness(t, reconcile.SnapshotConfig{Name: "ec2", File: path})
	ctx := t.Context()
	if err := h.w.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if n := h.live(); n != 5 {
		t.Fatalf("%d live, want 5", n)
	}
	// Rewritten: one instance replaced by another (ids i-0001 → i-0006).
	writeAtomic(t, path, snapshotJSON(5, 2))
	if err := h.w.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	ins, _ := h.st.Registry.ReconciledInstances(ctx, "snapshot/ec2")
	if len(ins) != 5 || ins[0].Source != "snapshot/ec2" || ins[0].LeaseExpiresAt != nil {
		t.Fatalf("after the rewrite: %+v", ins)
	}
	gone := registry.ReconciledID("snapshot/ec2", "web", "i-0001")
	for _, in := range ins {
		if in.ID == gone {
			t.Fatalf("i-0001 still live after leaving the snapshot")
		}
	}
	for _, bad := range []struct{ name, body, why string }{
		{"truncated", snapshotJSON(5, 2)[:120], "unexpected EOF"},
		{"invalid row", strings.Replace(snapshotJSON(5, 2), `"port":8080`, `"port":0`, 1), "port 0"},
		{"unknown field", strings.Replace(snapshotJSON(5, 2), `"zone"`, `"zonee"`, 1), "unknown field"},
		{"empty file", "", "EOF"},
	} {
		before := h.errors()
		writeAtomic(t, path, bad.body)
		err := h.w.RunOnce(ctx)
		if err == nil || !strings.Contains(err.Error(), bad.why) {
			t.Fatalf("%s: pass error %v, want one naming %q", bad.name, err, bad.why)
		}
		if n := h.live(); n != 5 {
			t.Fatalf("%s: %d live, want the last 5", bad.name, n)
		}
		if got := h.errors(); got != before+1 {
			t.Fatalf("%s: muster_reconcile_errors_total = %v, want %v", bad.name, got, before+1)
		}
		if st := h.w.Status(); st.Error == "" {
			t.Fatalf("%s: status %+v, want the error", bad.name, st)
		}
	}
}

// TestSnapshotHTTP: a CSV snapshot served over HTTP with a bearer token;
// a wrong token, a server error and a truncated body are refused and the
// last state kept.
func TestSnapshotHTTP(t *testing.T) {
	t.Parallel()
	var (
		mu     sync.Mutex
		body   = "id,service,address,port,zone,ready\ni-1,web,10.5.0.1,8080,az1,true\ni-2,web,10.5.0.2,8080,az2,true\ni-3,web,10.5.0.3,8080,az1,false\n"
		status = http.StatusOK
		short  = false
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer s3cret" {
			http.Error(w, "no", http.StatusUnauthorized)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if status != http.StatusOK {
			http.Error(w, "exporter failing", status)
			return
		}
		if short {
			// Announce the whole body, send part of it: a cut connection.
			w.Header().Set("Content-Length", fmt.Sprint(len(body)))
			_, _ = w.Write([]byte(body[:len(body)/2]))
			return
		}
		_, _ = w.Write([]byte(body))
	}))
	t.Cleanup(srv.Close)
	h := newSnapshotHarness(t, reconcile.SnapshotConfig{Name: "asg", URL: srv.URL + "/web.csv", Token: "s3cret"})
	ctx := t.Context()
	if err := h.w.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	// i-3 is not ready (Pending): not an instance yet, listed as missing.
	if n := h.live(); n != 2 {
		t.Fatalf("%d live, want 2", n)
	}
	d, err := h.rc.Diff(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if d.Counts[reconcile.DiffMissing] != 1 || d.Items[0].Key != "i-3" {
		t.Fatalf("diff = %+v, want i-3 missing", d)
	}
	for _, bad := range []struct {
		name string
		set  func()
		why  string
	}{
		{"server error", func() { status = http.StatusBadGateway }, "502"},
		{"truncated body", func() { status, short = http.StatusOK, true }, "unexpected EOF"},
	} {
		mu.Lock()
		bad.set()
		mu.Unlock()
		before := h.errors()
		if err := h.w.RunOnce(ctx); err == nil || !strings.Contains(err.Error(), bad.why) {
			t.Fatalf("%s: pass error %v, want one naming %q", bad.name, err, bad.why)
		}
		if n := h.live(); n != 2 {
			t.Fatalf("%s: %d live, want the last 2", bad.name, n)
		}
		if got := h.errors(); got != before+1 {
			t.Fatalf("%s: errors metric %v, want %v", bad.name, got, before+1)
		}
	}
	src, err := reconcile.NewSnapshotSource(reconcile.SnapshotConfig{Name: "asg", URL: srv.URL + "/web.csv", Token: "wrong"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := src.Read(ctx); err == nil || !strings.Contains(err.Error(), "401") {
		t.Fatalf("wrong token: %v, want 401", err)
	}
	if _, err := reconcile.NewSnapshotSource(reconcile.SnapshotConfig{Name: "asg", URL: "http://inventory.example/web.csv"}); err == nil {
		t.Fatal("plain http to a remote host accepted")
	}
}

func TestParseSnapshotCSV(t *testing.T) {
	for _, bad := range []string{
		"",
		"id,service,address\n",
		"id,service,address,port,zone\ni-1,web,10.0.0.1,8080\n", // truncated row
		"id,service,address,port,zone\ni-1,web,10.0.0.1,http,az1\n",
		"id,service,address,port,zone\ni-1,Web,10.0.0.1,80,az1\n",
		"id,service,address,port,zone\ni-1,web,10.0.0.1,80,az1\ni-1,web,10.0.0.2,80,az1\n",
		"id,service,address,port,zone,ready\ni-1,web,10.0.0.1,80,az1,maybe\n",
		"id,service,address,port,zone\ni-1,web,0.0.0.0,80,az1\n",
	} {
		if _, err := reconcile.ParseSnapshotCSV([]byte(bad)); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	es, err := reconcile.ParseSnapshotCSV([]byte("id,service,address,port,zone\ni-1,web,::ffff:10.0.0.1,80,az1\n"))
	if err != nil || len(es) != 1 || es[0].Address != "10.0.0.1" || !es[0].Ready {
		t.Fatalf("%+v %v", es, err)
	}
}

func FuzzParseSnapshotJSON(f *testing.F) {
	f.Add([]byte(snapshotJSON(2, 1)))
	f.Add([]byte(`{"instances":[]}`))
	f.Add([]byte(`{"instances":[{"id":"x","service":"web","address":"::1","port":1,"zone":"a","ready":false}]}`))
	f.Add([]byte(`{"instances":null}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		es, err := reconcile.ParseSnapshotJSON(b)
		if err != nil {
			return
		}
		for _, e := range es {
			if e.Port < 1 || e.Port > 65535 || e.Key == "" || e.Service == "" || e.Zone == "" {
				t.Fatalf("accepted a bad endpoint %+v", e)
			}
		}
	})
}

func FuzzParseSnapshotCSV(f *testing.F) {
	f.Add([]byte("id,service,address,port,zone\ni-1,web,10.0.0.1,80,az1\n"))
	f.Add([]byte("id,service,address,port,zone,ready\ni-1,web,10.0.0.1,80,az1,false\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		es, err := reconcile.ParseSnapshotCSV(b)
		if err != nil {
			return
		}
		for _, e := range es {
			if e.Port < 1 || e.Port > 65535 || e.Key == "" || e.Service == "" || e.Zone == "" {
				t.Fatalf("accepted a bad endpoint %+v", e)
			}
		}
	})
}
