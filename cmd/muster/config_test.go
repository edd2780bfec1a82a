package main

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/musterhq/muster/internal/policy"
	"github.com/musterhq/muster/internal/wait"
	"github.com/musterhq/muster/internal/xds"
	"github.com/musterhq/muster/server"
)

func TestParseLimit(t *testing.T) {
	got, err := parseLimit("MUSTER_OVERRIDE_LIMIT", "5/10m")
	if err != nil || got != (policy.Limit{Max: 5, Window: 10 * time.Minute}) {
		t.Fatalf("parseLimit(5/10m) = %+v, %v", got, err)
	}
	for _, bad := range []string{"5", "x/1m", "5/soon", "0/1m", "5/10ms"} {
		if _, err := parseLimit("MUSTER_OVERRIDE_LIMIT", bad); err == nil {
			t.Errorf("parseLimit(%q) accepted", bad)
		}
	}
}

func TestLoadEnvPolicyLimits(t *testing.T) {
	t.Setenv("MUSTER_OVERRIDE_LIMIT", "3/1m")
	t.Setenv("MUSTER_COSIGN_WINDOW", "2m")
	var c Config
	if err := loadEnv(&c); err != nil {
		t.Fatal(err)
	}
	if c.OverrideLimit != (policy.Limit{Max: 3, Window: time.Minute}) || c.CosignWindow != 2*time.Minute ||
		c.WriteLimit != (policy.Limit{Max: policy.DefaultWriteMax, Window: policy.DefaultWriteWindow}) || c.MaxExpiry != policy.DefaultMaxExpiry {
		t.Fatalf("config %+v", c)
	}
}

func TestLoadEnvDatabaseTimeouts(t *testing.T) {
	var c Config
	if err := loadEnv(&c); err != nil {
		t.Fatal(err)
	}
	if c.DBTimeout != 1500*time.Millisecond || c.DBIOTimeout != 5*time.Second || c.MaxPendingWindows != 2_000_000 {
		t.Fatalf("defaults: %s %s %d", c.DBTimeout, c.DBIOTimeout, c.MaxPendingWindows)
	}
	t.Setenv("MUSTER_DB_TIMEOUT", "800ms")
	t.Setenv("MUSTER_DB_IO_TIMEOUT", "3s")
	t.Setenv("MUSTER_MAX_PENDING_WINDOWS", "1000")
	if err := loadEnv(&c); err != nil {
		t.Fatal(err)
	}
	if c.DBTimeout != 800*time.Millisecond || c.DBIOTimeout != 3*time.Second || c.MaxPendingWindows != 1000 {
		t.Fatalf("from the environment: %s %s %d", c.DBTimeout, c.DBIOTimeout, c.MaxPendingWindows)
	}
	c.Addr, c.Region, c.ShiftSteps, c.ShiftPendingAlarm, c.AdmissionFloor, c.LeaseTTL, c.Dev = ":0", "local", []float64{1}, time.Minute, 1, time.Minute, true
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	c.DBTimeout = 0
	if err := c.Validate(); err == nil {
		t.Fatal("a zero DB timeout validated")
	}
}

func TestLoadEnvRequestLimits(t *testing.T) {
	var c Config
	if err := loadEnv(&c); err != nil {
		t.Fatal(err)
	}
	if c.Limits != server.DefaultLimits() || c.MetricsAddr != "" || c.XDSLimits != xds.DefaultLimits() {
		t.Fatalf("defaults: %+v, %+v, metrics address %q", c.Limits, c.XDSLimits, c.MetricsAddr)
	}
	t.Setenv("MUSTER_REPORT_ITEMS_LIMIT", "20000/1s")
	t.Setenv("MUSTER_UNAUTHENTICATED_LIMIT", "10/1m")
	t.Setenv("MUSTER_WATCH_STREAMS_LIMIT", "50")
	t.Setenv("MUSTER_METRICS_ADDR", ":9464")
	t.Setenv("MUSTER_XDS_MAX_NAMES", "500")
	t.Setenv("MUSTER_XDS_MAX_NAME_BYTES", "1048576")
	if err := loadEnv(&c); err != nil {
		t.Fatal(err)
	}
	wantXDS := xds.DefaultLimits()
	wantXDS.NamesPerStream, wantXDS.NameBytesPerPrincipal = 500, 1<<20
	if c.XDSLimits != wantXDS {
		t.Fatalf("xDS limits from the environment: %+v, want %+v", c.XDSLimits, wantXDS)
	}
	want := server.DefaultLimits()
	want.ReportItems = policy.Limit{Max: 20000, Window: time.Second}
	want.Unauthenticated = policy.Limit{Max: 10, Window: time.Minute}
	want.WatchStreams = 50
	if c.Limits != want || c.MetricsAddr != ":9464" {
		t.Fatalf("from the environment: %+v, metrics address %q", c.Limits, c.MetricsAddr)
	}
	for env, bad := range map[string]string{"MUSTER_REGISTRATION_LIMIT": "lots", "MUSTER_WATCH_STREAMS_LIMIT": "0",
		"MUSTER_XDS_MAX_NAMES": "0", "MUSTER_XDS_MAX_STREAMS_PER_CONNECTION": "many", "MUSTER_XDS_MAX_NAME_BYTES": "-1"} {
		t.Run(env, func(t *testing.T) {
			t.Setenv(env, bad)
			if err := loadEnv(&c); err == nil {
				t.Errorf("%s=%s accepted", env, bad)
			}
		})
	}
}

func TestServeMetricsOnLoopback(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "muster_up 1\n") })
	addr, stop, err := serveMetrics(":0", h, nil, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if host, _, _ := net.SplitHostPort(addr); host != "127.0.0.1" {
		t.Fatalf("a bare :port listens on %s, want loopback", addr)
	}
	res, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK || string(b) != "muster_up 1\n" {
		t.Fatalf("GET /metrics without a token: %d %q", res.StatusCode, b)
	}
	res, err = http.Get("http://" + addr + "/v1/services")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusNotFound {
		t.Fatalf("the metrics listener serves /v1/services: %d, want 404", res.StatusCode)
	}
}

func TestLoadEnvAuditCheckpoints(t *testing.T) {
	c := Config{Dev: true, DataDir: "/data"}
	if err := loadEnv(&c); err != nil {
		t.Fatal(err)
	}
	if c.Audit.Checkpoints != "/data/audit-checkpoints" || c.Audit.SigningKeyFile != "/data/audit-signing.key" ||
		c.Audit.Interval != time.Minute || c.Audit.Heartbeat != time.Hour || c.Audit.S3Retention != 5*365*24*time.Hour {
		t.Fatalf("dev defaults: %+v", c.Audit)
	}
	t.Setenv("MUSTER_AUDIT_CHECKPOINTS", "s3://audit/muster/prod")
	t.Setenv("MUSTER_AUDIT_S3_RETENTION", "3650d")
	t.Setenv("MUSTER_AUDIT_CHECKPOINT_INTERVAL", "30s")
	c = Config{}
	if err := loadEnv(&c); err != nil {
		t.Fatal(err)
	}
	if c.Audit.Checkpoints != "s3://audit/muster/prod" || c.Audit.S3Retention != 3650*24*time.Hour || c.Audit.Interval != 30*time.Second {
		t.Fatalf("from the environment: %+v", c.Audit)
	}
	if err := c.Audit.Validate(); err == nil || !strings.Contains(err.Error(), "MUSTER_AUDIT_SIGNING_KEY_FILE") {
		t.Fatalf("a sink without a signing key: %v", err)
	}
	c.Audit.SigningKeyFile = "/k"
	if err := c.Audit.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []func(a *AuditConfig){
		func(a *AuditConfig) { a.Checkpoints = "s3://" },
		func(a *AuditConfig) { a.Interval = time.Millisecond },
		func(a *AuditConfig) { a.Heartbeat = time.Second },
		func(a *AuditConfig) { a.S3Retention = time.Hour },
	} {
		a := c.Audit
		bad(&a)
		if err := a.Validate(); err == nil {
			t.Errorf("validated %+v", a)
		}
	}
	t.Setenv("MUSTER_AUDIT_S3_RETENTION", "five years")
	if err := loadEnv(&Config{}); err == nil {
		t.Fatal("a bad retention loaded")
	}
}

// TestServeRefusesABadReconcileConfig: a reconcile config with a bad field
// stops muster serve before it opens the database, naming file, line and
// field.
func TestServeRefusesABadReconcileConfig(t *testing.T) {
	t.Setenv("DATABASE_URL", "postgres://127.0.0.1:1/never")
	t.Setenv("MUSTER_ISSUERS", "https://issuer.example")
	path := filepath.Join(t.TempDir(), "reconcile.yaml")
	if err := os.WriteFile(path, []byte("snapshots:\n  - name: fleet\n    file: /x.json\n    format: xml\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	err := cmdServe(t.Context(), []string{"--reconcile-config", path}, false, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), path+":4: snapshots.0.format") {
		t.Fatalf("serve with a bad reconcile config: %v", err)
	}
}

// TestUnauthenticatedListenersStayOnLoopback (issue 25): --debug-addr and
// --metrics-addr serve without a token, so a bare :port listens on
// loopback, and an explicit non-loopback address is served but warned
// about.
func TestUnauthenticatedListenersStayOnLoopback(t *testing.T) {
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	stop, err := serveDebug(":0", nil, log)
	if err != nil {
		t.Fatal(err)
	}
	stop()
	if !strings.Contains(logs.String(), "msg=\"serving debug\" addr=127.0.0.1:") || strings.Contains(logs.String(), "WARN") {
		t.Fatalf("a bare :0 for --debug-addr: %s", logs.String())
	}
	logs.Reset()
	ln, err := listenUnauthenticated("debug", "0.0.0.0:0", log)
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
	if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "non-loopback") {
		t.Fatalf("an explicit 0.0.0.0 for --debug-addr is not warned about: %s", logs.String())
	}
}

// TestLoadEnvPeers: MUSTER_PEERS is a comma-separated list of base URLs;
// anything else is refused at start, and so is a plain-http URL off
// loopback unless MUSTER_PEER_ALLOW_HTTP=true (a lab).
func TestLoadEnvPeers(t *testing.T) {
	t.Setenv("MUSTER_PEERS", " http://127.0.0.1:8080, ,https://m2.internal:8443/ ")
	var c Config
	if err := loadEnv(&c); err != nil {
		t.Fatal(err)
	}
	if len(c.Peers) != 2 || c.Peers[0] != "http://127.0.0.1:8080" || c.Peers[1] != "https://m2.internal:8443/" {
		t.Fatalf("peers: %q", c.Peers)
	}
	c.Addr, c.Region, c.ShiftSteps, c.ShiftPendingAlarm, c.AdmissionFloor, c.LeaseTTL, c.Dev = ":0", "local", []float64{1}, time.Minute, 1, time.Minute, true
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	c.Peers = append(c.Peers, "10.0.0.3:8080")
	if err := c.Validate(); err == nil {
		t.Fatal("a peer without a scheme validated")
	}
	c.Peers[2] = "http://10.0.0.3:8080"
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "MUSTER_PEER_ALLOW_HTTP") {
		t.Fatalf("a plain-http peer off loopback: %v, want refused naming MUSTER_PEER_ALLOW_HTTP", err)
	}
	t.Setenv("MUSTER_PEER_ALLOW_HTTP", "true")
	if err := loadEnv(&c); err != nil {
		t.Fatal(err)
	}
	c.Peers = append(c.Peers, "http://10.0.0.3:8080")
	if err := c.Validate(); err != nil {
		t.Fatalf("a plain-http peer with MUSTER_PEER_ALLOW_HTTP=true: %v", err)
	}
	t.Setenv("MUSTER_PEER_ALLOW_HTTP", "sometimes")
	if err := loadEnv(&c); err == nil {
		t.Fatal("MUSTER_PEER_ALLOW_HTTP=sometimes loaded")
	}
}

// TestLoadEnvPeerTrust: MUSTER_PEER_TRUST is strict by default, upgrade
// during a rolling upgrade, and nothing else.
func TestLoadEnvPeerTrust(t *testing.T) {
	var c Config
	if err := loadEnv(&c); err != nil {
		t.Fatal(err)
	}
	c.Addr, c.Region, c.ShiftSteps, c.ShiftPendingAlarm, c.AdmissionFloor, c.LeaseTTL, c.Dev = ":0", "local", []float64{1}, time.Minute, 1, time.Minute, true
	if err := c.Validate(); err != nil || c.PeerTrust != PeerTrustStrict {
		t.Fatalf("default: %q, %v", c.PeerTrust, err)
	}
	for v, ok := range map[string]bool{"upgrade": true, "strict": true, "lax": false, "UPGRADE": false} {
		t.Setenv("MUSTER_PEER_TRUST", v)
		if err := loadEnv(&c); err != nil {
			t.Fatal(err)
		}
		if err := c.Validate(); (err == nil) != ok {
			t.Errorf("MUSTER_PEER_TRUST=%s: %v, want ok %t", v, err, ok)
		}
	}
}

// The rolling deploy's settings (docs/production.md): a drain window of
// 2 s and a shutdown grace of 25 s by default; the window must fit in
// the grace, and a grace under a second is refused.
func TestLoadEnvDrainSpreadAndShutdownGrace(t *testing.T) {
	var c Config
	if err := loadEnv(&c); err != nil {
		t.Fatal(err)
	}
	if c.DrainSpread != 2*time.Second || c.ShutdownGrace != 25*time.Second {
		t.Fatalf("defaults: spread %s, grace %s", c.DrainSpread, c.ShutdownGrace)
	}
	c.Addr, c.Region, c.ShiftSteps, c.ShiftPendingAlarm, c.AdmissionFloor, c.LeaseTTL, c.Dev = ":0", "local", []float64{1}, time.Minute, 1, time.Minute, true
	for _, tc := range []struct {
		spread, grace string
		ok            bool
	}{
		{"5s", "40s", true},
		{"0", "10s", true},
		{"30s", "30s", false},
		{"1s", "500ms", false},
		{"-1s", "30s", false},
	} {
		t.Setenv("MUSTER_DRAIN_SPREAD", tc.spread)
		t.Setenv("MUSTER_SHUTDOWN_GRACE", tc.grace)
		if err := loadEnv(&c); err != nil {
			t.Fatal(err)
		}
		if err := c.Validate(); (err == nil) != tc.ok {
			t.Errorf("spread %s, grace %s: validate %v, want ok %t", tc.spread, tc.grace, err, tc.ok)
		}
	}
	t.Setenv("MUSTER_SHUTDOWN_GRACE", "soon")
	if err := loadEnv(&c); err == nil || !strings.Contains(err.Error(), "MUSTER_SHUTDOWN_GRACE") {
		t.Fatalf("a grace that is no duration: %v", err)
	}
}

// TestAdvertiseURL: MUSTER_ADVERTISE_URL must be a base URL in the
// listener's scheme; a replica listening on every interface registers it
// for its peers instead of loopback.
func TestAdvertiseURL(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		url, cert string
		ok        bool
		// lab: with MUSTER_PEER_ALLOW_HTTP=true
		lab bool
	}{
		{"https://muster-0.muster-peers.ns.svc.cluster.local:8080", "tls.crt", true, false},
		{"https://muster-0:8080/", "tls.crt", true, false},
		{"http://127.0.0.1:8080", "", true, false},
		{"http://localhost:8080/", "", true, false},
		{"http://[::1]:8080", "", true, false},
		// Plain http off loopback: its peers would talk to it in clear.
		{"http://muster-0.muster-peers.ns.svc.cluster.local:8080", "", false, false},
		{"http://10.0.0.7:8080", "", false, false},
		{"http://muster-0:8080/", "", true, true},
		{"https://muster-0:8080", "", false, true},
		{"http://muster-0:8080", "tls.crt", false, true},
		{"http://muster-0", "", false, true},
		{"http://muster-0:8080/api", "", false, true},
		{"http://u:p@muster-0:8080", "", false, true},
		{"muster-0:8080", "", false, true},
	} {
		c := Config{AdvertiseURL: tc.url, TLSCert: tc.cert, PeerAllowHTTP: tc.lab}
		if err := c.validateAdvertise(); (err == nil) != tc.ok {
			t.Errorf("%q (cert %q, plain http allowed %t): %v, want ok %t", tc.url, tc.cert, tc.lab, err, tc.ok)
		}
	}
	dir := devDir(t)
	_, port, _ := strings.Cut(freeAddr(t), ":")
	dev := startDev(t, dir, "--addr", "0.0.0.0:"+port, "--advertise-url", "http://localhost:"+port)
	want := "http://localhost:" + port
	if dev.url != want {
		t.Fatalf("muster dev announces %s, want the advertised %s", dev.url, want)
	}
	admin := token(t, dir, "--kind", "operator", "--subject", "alice", "--role", "admin")
	// The replica registers itself at its ownership worker's first round.
	var last string
	wait.For(t, time.Minute, "the advertised address registered in GET /v1/replicas", func() bool {
		code, body := call(t, "GET", want+"/v1/replicas", admin, "")
		last = fmt.Sprintf("%d %s", code, body)
		return code == 200 && strings.Contains(string(body), `"address":"`+want+`"`)
	})
	t.Logf("GET /v1/replicas: %s", last)
}
