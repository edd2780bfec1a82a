package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/tlsreload/tlstest"
	"github.com/musterhq/muster/internal/wait"
	"github.com/musterhq/muster/resolver"
)

// TestTLSEveryListenerAndRotation (issue 28): muster dev with
// MUSTER_TLS_CERT and MUSTER_TLS_KEY serves its API, UI, metrics and xDS
// listeners over TLS, announces an https URL and advertises it to its
// peers, answers a resolver that trusts the CA, and serves a rotated
// certificate on the next connection without a restart.
func TestTLSEveryListenerAndRotation(t *testing.T) {
	t.Parallel() // its own data folder, certificates, ports and process
	dir := devDir(t)
	addr, metricsAddr, xdsAddr := freeAddr(t), freeAddr(t), freeAddr(t)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = db.StopDir(ctx, dir)
	})
	ca := tlstest.NewCA(t)
	files := t.TempDir()
	certFile, keyFile, caFile := filepath.Join(files, "tls.crt"), filepath.Join(files, "tls.key"), filepath.Join(files, "ca.pem")
	certA, keyA := ca.Leaf(t, "muster-a", time.Hour)
	tlstest.WriteFile(t, certFile, certA)
	tlstest.WriteFile(t, keyFile, keyA)
	tlstest.WriteFile(t, caFile, ca.PEM)

	proc, line := startProcessServing(t, dir, addr, "MUSTER_TLS_CERT="+certFile, "MUSTER_TLS_KEY="+keyFile,
		"MUSTER_TLS_CA="+caFile, "MUSTER_METRICS_ADDR="+metricsAddr, "MUSTER_XDS_ADDR="+xdsAddr)
	t.Cleanup(func() {
		_ = proc.Process.Signal(os.Interrupt)
		_ = proc.Wait()
	})
	url := "https://" + addr
	if !strings.Contains(line, "serving on "+url) {
		t.Fatalf("muster dev announced %q, want it serving on %s", line, url)
	}

	do := httpsCaller(t, ca)
	// Ready once the evaluator has rebuilt its state after the start.
	wait.For(t, 60*time.Second, "GET /readyz over TLS answering 200", func() bool {
		res, _ := do("GET", url+"/readyz", "", "")
		return res.StatusCode == 200
	})
	// Plain http gets no answer but Go's "HTTP request to an HTTPS
	// server" 400.
	if res, err := http.Get("http://" + addr + "/readyz"); err == nil {
		res.Body.Close()
		if res.StatusCode != http.StatusBadRequest {
			t.Errorf("plain http to the API listener: %d, want TLS only", res.StatusCode)
		}
	}
	// The UI: HSTS on its pages (its session cookie is Secure already).
	if res, _ := do("GET", url+uiPath+"/", "", ""); res.Header.Get("Strict-Transport-Security") == "" {
		t.Errorf("GET %s/: no Strict-Transport-Security header (status %d)", uiPath, res.StatusCode)
	}
	// /metrics on its own listener, over TLS, with the certificate's expiry.
	if res, body := do("GET", "https://"+metricsAddr+"/metrics", "", ""); res.StatusCode != 200 ||
		!strings.Contains(body, "muster_tls_certificate_expiry_seconds") || !strings.Contains(body, "muster_tls_reload_failures_total 0") {
		t.Fatalf("GET /metrics over TLS: %d, want 200 with the TLS metrics", res.StatusCode)
	}
	if cn := tlstest.PeerCN(t, xdsAddr, ca.Pool()); cn != "muster-a" {
		t.Errorf("xDS listener presented %q, want muster-a", cn)
	}

	admin := token(t, dir, "--kind", "operator", "--subject", "alice", "--role", "admin")
	// The replica advertises its https address to its peers, from its
	// first heartbeat on (ready comes before it on a loaded machine).
	wait.For(t, 30*time.Second, "GET /v1/replicas listing this replica at "+url, func() bool {
		res, body := do("GET", url+"/v1/replicas", admin, "")
		return res.StatusCode == 200 && strings.Contains(body, `"`+url+`"`)
	})
	if res, body := do("PUT", url+"/v1/services/web", admin, `{"owner":"payments","capabilities":[]}`); res.StatusCode != 201 {
		t.Fatalf("create web: %d %s", res.StatusCode, body)
	}
	if res, body := do("POST", url+"/v1/services/web/instances", admin, `{"address":"10.1.2.3","port":8080,"zone":"az1"}`); res.StatusCode != 201 {
		t.Fatalf("register: %d %s", res.StatusCode, body)
	}
	viewer := token(t, dir, "--kind", "operator", "--subject", "vera", "--role", "viewer")
	c, err := resolver.New(context.Background(), resolver.Config{URLs: []string{url}, Services: []string{"web"}, RootCAs: ca.Pool(),
		Token:       func(context.Context) (string, error) { return viewer, nil },
		BaseBackoff: 50 * time.Millisecond, MaxBackoff: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	waitVersion(t, c, 1)
	// `muster resolve` with --ca.
	if out, errOut, err := runCmd(t, "resolve", "web", "--server", url, "--ca", caFile, "--data", dir, "--cache", t.TempDir()); err != nil || !strings.Contains(out, "10.1.2.3") {
		t.Errorf("muster resolve --ca: %v\n%s\n%s", err, out, errOut)
	}

	// Rotation: new files renamed over the old; a new connection to
	// each listener sees the new certificate, with no restart.
	certB, keyB := ca.Leaf(t, "muster-b", 2*time.Hour)
	tlstest.WriteFile(t, keyFile, keyB)
	tlstest.WriteFile(t, certFile, certB)
	for _, a := range []string{addr, metricsAddr, xdsAddr} {
		wait.For(t, 10*time.Second, "a new connection to "+a+" seeing the rotated certificate", func() bool {
			return tlstest.PeerCN(t, a, ca.Pool()) == "muster-b"
		})
	}
	if res, body := do("GET", url+"/readyz", "", ""); res.StatusCode != 200 {
		t.Fatalf("GET /readyz after the rotation: %d %s", res.StatusCode, body)
	}
	if proc.ProcessState != nil {
		t.Fatal("muster dev exited during the rotation")
	}
}

// TestTLSFlagsGoTogether: a certificate without its key (or a key
// without its certificate) stops the start with a clear error.
func TestTLSFlagsGoTogether(t *testing.T) {
	for _, args := range [][]string{{"--tls-cert", "x.crt"}, {"--tls-key", "x.key"}} {
		_, _, err := runCmd(t, append([]string{"dev", "--data", t.TempDir()}, args...)...)
		if err == nil || !strings.Contains(err.Error(), "go together") {
			t.Errorf("muster dev %v: %v, want the certificate and key to go together", args, err)
		}
	}
}

// httpsCaller returns a function making API calls over TLS, trusting
// only ca, without following redirects.
func httpsCaller(t *testing.T, ca *tlstest.CA) func(method, u, tok, body string) (*http.Response, string) {
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool()}},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	t.Cleanup(client.CloseIdleConnections)
	return func(method, u, tok, body string) (*http.Response, string) {
		t.Helper()
		req, err := http.NewRequest(method, u, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		res, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, u, err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res, string(b)
	}
}

// TestTLSReplicasRelayOverHTTPS (issue 28): two muster dev replicas with
// TLS advertise https addresses and relay each other's views over https,
// trusting the CA of --tls-ca (MUSTER_TLS_CA): a resolver at either
// replica gets the view, whichever replica owns the service's shard.
func TestTLSReplicasRelayOverHTTPS(t *testing.T) {
	t.Parallel() // its own data folder, certificates, ports and processes
	if testing.Short() {
		t.Skip("starts two muster dev processes")
	}
	dir := devDir(t)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = db.StopDir(ctx, dir)
	})
	ca := tlstest.NewCA(t)
	files := t.TempDir()
	certFile, keyFile, caFile := filepath.Join(files, "tls.crt"), filepath.Join(files, "tls.key"), filepath.Join(files, "ca.pem")
	cert, key := ca.Leaf(t, "muster", time.Hour)
	tlstest.WriteFile(t, certFile, cert)
	tlstest.WriteFile(t, keyFile, key)
	tlstest.WriteFile(t, caFile, ca.PEM)
	env := []string{"MUSTER_LEASE_TTL=10m", "MUSTER_TLS_CERT=" + certFile, "MUSTER_TLS_KEY=" + keyFile, "MUSTER_TLS_CA=" + caFile, "MUSTER_XDS_ADDR="}
	a, b := freeAddr(t), freeAddr(t)
	first := startProcess(t, dir, a, env...)
	second := startProcess(t, dir, b, env...)
	t.Cleanup(func() {
		for _, p := range []*os.Process{first.Process, second.Process} {
			_ = p.Signal(os.Interrupt)
		}
		_ = first.Wait()
		_ = second.Wait()
	})
	do := httpsCaller(t, ca)
	admin := token(t, dir, "--kind", "operator", "--subject", "alice", "--role", "admin")
	for _, addr := range []string{a, b} {
		var last string
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("GET /v1/replicas at %s last answered: %s", addr, last)
			}
		})
		wait.For(t, time.Minute, "both replicas listed at https addresses, as "+addr+" reads it", func() bool {
			res, body := do("GET", "https://"+addr+"/v1/replicas", admin, "")
			last = body
			return res.StatusCode == 200 && strings.Contains(body, `"https://`+a+`"`) && strings.Contains(body, `"https://`+b+`"`)
		})
	}
	if res, body := do("PUT", "https://"+a+"/v1/services/web", admin, `{"owner":"payments","capabilities":[]}`); res.StatusCode != 201 {
		t.Fatalf("create web: %d %s", res.StatusCode, body)
	}
	if res, body := do("POST", "https://"+a+"/v1/services/web/instances", admin, `{"address":"10.1.2.3","port":8080,"zone":"az1"}`); res.StatusCode != 201 {
		t.Fatalf("register: %d %s", res.StatusCode, body)
	}
	viewer := token(t, dir, "--kind", "operator", "--subject", "vera", "--role", "viewer")
	for _, addr := range []string{a, b} {
		c, err := resolver.New(context.Background(), resolver.Config{URLs: []string{"https://" + addr}, Services: []string{"web"}, RootCAs: ca.Pool(),
			Token:       func(context.Context) (string, error) { return viewer, nil },
			BaseBackoff: 50 * time.Millisecond, MaxBackoff: 500 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		wait.For(t, time.Minute, "a view of web with 10.1.2.3 at "+addr, func() bool {
			r, err := c.Resolve("web")
			if err != nil {
				return false
			}
			for _, ep := range r.Endpoints() {
				if ep.Address == "10.1.2.3" {
					return true
				}
			}
			return false
		})
	}
}

// TestCABundleRefusesWhatIsNotOne: --ca and --tls-ca name the file and
// say what is wrong with it.
func TestCABundleRefusesWhatIsNotOne(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := caPool(notPEM); err == nil || !strings.Contains(err.Error(), "holds no PEM certificate") {
		t.Errorf("caPool(not PEM): %v", err)
	}
	if _, err := caPool(filepath.Join(dir, "missing.pem")); err == nil || !strings.Contains(err.Error(), "missing.pem") {
		t.Errorf("caPool(missing): %v", err)
	}
	if p, err := caPool(""); p != nil || err != nil {
		t.Errorf("caPool(\"\") = %v, %v; want the system roots (nil)", p, err)
	}
	ca := tlstest.NewCA(t)
	good := filepath.Join(dir, "good.pem")
	tlstest.WriteFile(t, good, ca.PEM)
	if p, err := caPool(good); p == nil || err != nil {
		t.Errorf("caPool(good) = %v, %v", p, err)
	}
}

// The region's CA bundle is a private CA for the replicas; the UI's OIDC
// issuer is as often a public one. The UI's client must trust both, or a
// region given a private CA could no longer sign anyone in.
func TestUIIssuerClientTrustsTheBundleAndTheSystemRoots(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca := tlstest.NewCA(t)
	bundle := filepath.Join(dir, "ca.pem")
	tlstest.WriteFile(t, bundle, ca.PEM)
	lt, err := setupTLS(Config{TLSCA: bundle}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if lt.issuer == nil || lt.client == nil {
		t.Fatalf("setupTLS with a CA bundle: issuer %v, client %v; want both", lt.issuer, lt.client)
	}
	leafPEM, _ := ca.Leaf(t, "issuer.example", time.Hour)
	blk, _ := pem.Decode(leafPEM)
	leaf, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: lt.issuer.RootCAs}); err != nil {
		t.Errorf("the issuer client does not trust the bundle's CA: %v", err)
	}
	// Exactly the system roots and the bundle for the issuer, exactly
	// the bundle for the peers.
	want, err := x509.SystemCertPool()
	if err != nil || want == nil {
		want = x509.NewCertPool()
	}
	want.AppendCertsFromPEM(ca.PEM)
	if !lt.issuer.RootCAs.Equal(want) {
		t.Errorf("the issuer client's roots are not the system roots plus the bundle")
	}
	if !lt.client.RootCAs.Equal(ca.Pool()) {
		t.Errorf("the peers' client trusts more than the bundle")
	}
}
