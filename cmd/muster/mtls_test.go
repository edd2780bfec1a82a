package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/tlsreload/tlstest"
	"github.com/musterhq/muster/internal/wait"
	"github.com/musterhq/muster/internal/xds/xdstest"
	"github.com/musterhq/muster/resolver"
)

// mtlsClient calls muster over TLS trusting roots, presenting cert (none
// when nil) from the local address local ("" for any). Its calls return
// the transport's error instead of failing, so that a refused handshake
// can be asserted.
type mtlsClient struct {
	t *testing.T
	c *http.Client
}

func newMTLSClient(t *testing.T, ca *tlstest.CA, cert *tls.Certificate, local string) *mtlsClient {
	cfg := &tls.Config{RootCAs: ca.Pool()}
	if cert != nil {
		cfg.Certificates = []tls.Certificate{*cert}
	}
	d := &net.Dialer{Timeout: 5 * time.Second}
	if local != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(local)}
	}
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg, DialContext: d.DialContext}}
	t.Cleanup(c.CloseIdleConnections)
	return &mtlsClient{t: t, c: c}
}

// do makes one call; tok and cred are sent when not empty.
func (m *mtlsClient) do(method, u, tok, cred, body string) (int, string, error) {
	m.t.Helper()
	req, err := http.NewRequest(method, u, strings.NewReader(body))
	if err != nil {
		m.t.Fatal(err)
	}
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	if cred != "" {
		req.Header.Set("Muster-Instance-Credential", cred)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := m.c.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b), nil
}

// must is do that fails the test on a transport error or another status.
func (m *mtlsClient) must(method, u, tok, cred, body string, want int) string {
	m.t.Helper()
	code, b, err := m.do(method, u, tok, cred, body)
	if err != nil {
		m.t.Fatalf("%s %s: %v", method, u, err)
	}
	if code != want {
		m.t.Fatalf("%s %s: %d %s; want %d", method, u, code, b, want)
	}
	return b
}

// TestMTLSSpiffe (issue 28, mutual TLS): muster dev with
// MUSTER_TLS_CLIENT_CA and MUSTER_SPIFFE takes a client certificate whose
// SPIFFE ID maps to web as web's workload identity, without a token:
// it registers and self-reports; it may not register for another
// service; a certificate of an unknown CA fails the handshake, one of an
// unmapped trust domain is 401; a token of api with web's certificate is
// 403; the certificate's IP SANs prove addresses from elsewhere; a
// resolver (and muster resolve --cert) presents one; and a rotated CA
// bundle is taken without a restart.
func TestMTLSSpiffe(t *testing.T) {
	t.Parallel() // its own data folder, certificates, ports and process
	dir := devDir(t)
	addr, xaddr := freeAddr(t), freeAddr(t)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = db.StopDir(ctx, dir)
	})
	serverCA, clientCA, rotatedCA, otherCA := tlstest.NewCA(t), tlstest.NewCA(t), tlstest.NewCA(t), tlstest.NewCA(t)
	files := t.TempDir()
	certFile, keyFile := filepath.Join(files, "tls.crt"), filepath.Join(files, "tls.key")
	clientCAFile, spiffeFile := filepath.Join(files, "clients.pem"), filepath.Join(files, "spiffe.yaml")
	cert, key := serverCA.Leaf(t, "muster", time.Hour)
	tlstest.WriteFile(t, certFile, cert)
	tlstest.WriteFile(t, keyFile, key)
	tlstest.WriteFile(t, clientCAFile, clientCA.PEM)
	tlstest.WriteFile(t, spiffeFile, []byte("trust_domains:\n  - trust_domain: prod.example.org\n    path: /ns/{namespace}/sa/{service}\n"))

	proc := startProcess(t, dir, addr, "MUSTER_TLS_CERT="+certFile, "MUSTER_TLS_KEY="+keyFile,
		"MUSTER_TLS_CLIENT_CA="+clientCAFile, "MUSTER_SPIFFE="+spiffeFile, "MUSTER_XDS_ADDR="+xaddr, "MUSTER_LEASE_TTL=10m")
	t.Cleanup(func() {
		_ = proc.Process.Signal(os.Interrupt)
		_ = proc.Wait()
	})
	url := "https://" + addr
	plain := newMTLSClient(t, serverCA, nil, "")
	wait.For(t, 60*time.Second, "GET /readyz without a client certificate answering 200", func() bool {
		code, _, _ := plain.do("GET", url+"/readyz", "", "", "")
		return code == 200
	})
	admin := token(t, dir, "--kind", "operator", "--subject", "alice", "--role", "admin")
	for _, svc := range []string{"web", "api"} {
		plain.must("PUT", url+"/v1/services/"+svc, admin, "", `{"owner":"payments","capabilities":[]}`, 201)
	}

	// (1) web's certificate, no token: registers, and self-reports.
	webPEM, webKey := clientCA.ClientLeaf(t, "spiffe://prod.example.org/ns/shop/sa/web", nil, time.Hour)
	webCert, err := tls.X509KeyPair(webPEM, webKey)
	if err != nil {
		t.Fatal(err)
	}
	web := newMTLSClient(t, serverCA, &webCert, "")
	var inst struct{ ID, Credential string }
	if err := json.Unmarshal([]byte(web.must("POST", url+"/v1/services/web/instances", "", "", `{"address":"127.0.0.1","port":9000,"zone":"az1"}`, 201)), &inst); err != nil || inst.Credential == "" {
		t.Fatalf("registration by certificate: %v", err)
	}
	report := `{"reports":[{"instance_id":"` + inst.ID + `","class":"self","outcome":"success"}]}`
	var last string
	wait.For(t, 30*time.Second, "web's self-report by certificate accepted", func() bool {
		code, b, err := web.do("POST", url+"/v1/reports", "", inst.Credential, report)
		last = b
		return err == nil && code == 200 && strings.Contains(b, `"accepted":1`)
	})
	if !strings.Contains(last, `"refused":[]`) {
		t.Errorf("self-report: %s", last)
	}
	web.must("PUT", url+"/v1/instances/"+inst.ID+"/lease", "", inst.Credential, "", 200)

	// (2) ...but not for another service, nor with operator powers.
	if b := web.must("POST", url+"/v1/services/api/instances", "", "", `{"address":"127.0.0.1","port":9001,"zone":"az1"}`, 403); !strings.Contains(b, "may not register instances of api") {
		t.Errorf("web's certificate registering api: %s", b)
	}
	web.must("PUT", url+"/v1/services/web/contract", "", "", `{"dependencies":[]}`, 403)

	// (3) A certificate of a CA outside the bundle fails the handshake.
	stranger := stranger(t, otherCA)
	if code, _, err := stranger.do("GET", url+"/v1/services/web/instances", "", "", ""); err == nil {
		t.Errorf("a certificate of an unknown CA was answered %d, want the handshake refused", code)
	}

	// (4) A verified certificate of a trust domain not configured is no
	// identity: 401 without a token.
	stagingCert := clientCA.ClientCert(t, "spiffe://staging.example.org/ns/shop/sa/web")
	staging := newMTLSClient(t, serverCA, &stagingCert, "")
	if b := staging.must("POST", url+"/v1/services/web/instances", "", "", `{"address":"127.0.0.1","port":9002,"zone":"az1"}`, 401); !strings.Contains(b, "not configured") {
		t.Errorf("unmapped trust domain: %s", b)
	}

	// (5) A token of api with web's certificate: conflicting proofs. A
	// token of web with it is the token's, as without a certificate.
	apiTok := token(t, dir, "--kind", "workload", "--service", "api", "--subject", "api-1")
	if b := web.must("POST", url+"/v1/services/api/instances", apiTok, "", `{"address":"127.0.0.1","port":9003,"zone":"az1"}`, 403); !strings.Contains(b, "conflicting-proofs") {
		t.Errorf("api's token with web's certificate: %s", b)
	}
	webTok := token(t, dir, "--kind", "workload", "--service", "web", "--subject", "web-1")
	web.must("POST", url+"/v1/services/web/instances", webTok, "", `{"address":"127.0.0.1","port":9004,"zone":"az1"}`, 201)
	if m := plain.must("GET", url+"/metrics", admin, "", "", 200); !strings.Contains(m, `muster_auth_failures_total{reason="conflicting_proofs"} 1`) ||
		!strings.Contains(m, `muster_auth_failures_total{reason="certificate_unmapped"} 1`) {
		t.Errorf("/metrics does not count the conflicting proofs and the unmapped certificate once each")
	}

	// (6) Addresses: the certificate's IP SANs prove 10.1.2.3 from
	// 127.0.0.1; 10.1.2.4 it does not list. Without IP SANs the source
	// address proves itself (127.0.0.2), and nothing else.
	sanCert := clientCA.ClientCert(t, "spiffe://prod.example.org/ns/shop/sa/web", net.IPv4(10, 1, 2, 3))
	san := newMTLSClient(t, serverCA, &sanCert, "")
	san.must("POST", url+"/v1/services/web/instances", "", "", `{"address":"10.1.2.3","port":9000,"zone":"az1"}`, 201)
	if b := san.must("POST", url+"/v1/services/web/instances", "", "", `{"address":"10.1.2.4","port":9000,"zone":"az1"}`, 403); !strings.Contains(b, "not proved to belong") {
		t.Errorf("an address the certificate does not list: %s", b)
	}
	fromTwo := newMTLSClient(t, serverCA, &webCert, "127.0.0.2")
	fromTwo.must("POST", url+"/v1/services/web/instances", "", "", `{"address":"127.0.0.2","port":9000,"zone":"az1"}`, 201)
	fromTwo.must("POST", url+"/v1/services/web/instances", "", "", `{"address":"127.0.0.3","port":9000,"zone":"az1"}`, 403)

	// (8) A resolver with web's certificate and no token resolves web,
	// and so does muster resolve --cert --key.
	c, err := resolver.New(context.Background(), resolver.Config{URLs: []string{url}, Services: []string{"web"}, RootCAs: serverCA.Pool(),
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &webCert, nil },
		BaseBackoff:          50 * time.Millisecond, MaxBackoff: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	wait.For(t, 60*time.Second, "the resolver's view of web holding 10.1.2.3", func() bool {
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
	// xDS shares the pair: web's certificate without a token opens a
	// stream and gets web's endpoints; an unmapped one is refused, and
	// api's token with web's certificate too.
	if r, err := xdsFirst(t, xaddr, serverCA, &webCert, ""); err != nil || len(r.GetResources()) != 1 {
		t.Errorf("xDS with web's certificate: %v (%d resources), want web's endpoints", err, len(r.GetResources()))
	}
	if _, err := xdsFirst(t, xaddr, serverCA, &stagingCert, ""); status.Code(err) != codes.Unauthenticated {
		t.Errorf("xDS with an unmapped certificate: %v, want Unauthenticated", err)
	}
	if _, err := xdsFirst(t, xaddr, serverCA, &webCert, apiTok); status.Code(err) != codes.PermissionDenied {
		t.Errorf("xDS with api's token and web's certificate: %v, want PermissionDenied", err)
	}

	caFile, webCertFile, webKeyFile := filepath.Join(files, "ca.pem"), filepath.Join(files, "web.crt"), filepath.Join(files, "web.key")
	tlstest.WriteFile(t, caFile, serverCA.PEM)
	tlstest.WriteFile(t, webCertFile, webPEM)
	tlstest.WriteFile(t, webKeyFile, webKey)
	if out, errOut, err := runCmd(t, "resolve", "web", "--server", url, "--ca", caFile, "--cert", webCertFile, "--key", webKeyFile,
		"--data", t.TempDir(), "--cache", t.TempDir()); err != nil || !strings.Contains(out, "10.1.2.3") {
		t.Errorf("muster resolve --cert: %v\n%s\n%s", err, out, errOut)
	}
	// muster agent holding web's SVID files serves web's view, without
	// credentials, on loopback.
	agentURL, stopAgent := runAgent(t, "--upstream", url, "--ca", caFile, "--cert", webCertFile, "--key", webKeyFile, "--service", "web")
	if code, body, err := plain.do("GET", agentURL+"/v1/resolve/web", "", "", ""); err != nil || code != 200 || !strings.Contains(body, "10.1.2.3") {
		t.Errorf("web through muster agent --cert: %d %v %s", code, err, body)
	}
	stopAgent()

	// (7) The client CA bundle rotated on disk is taken on new
	// connections without a restart: the new CA's certificates are
	// good, the old CA's fail the handshake.
	tlstest.WriteFile(t, clientCAFile, rotatedCA.PEM)
	rotatedCert := rotatedCA.ClientCert(t, "spiffe://prod.example.org/ns/shop/sa/web")
	wait.For(t, 10*time.Second, "a certificate of the rotated CA accepted on a new connection", func() bool {
		code, _, err := newMTLSClient(t, serverCA, &rotatedCert, "").do("GET", url+"/v1/services/web/instances", "", "", "")
		return err == nil && code == 200
	})
	if code, _, err := newMTLSClient(t, serverCA, &webCert, "").do("GET", url+"/v1/services/web/instances", "", "", ""); err == nil {
		t.Errorf("a certificate of the CA rotated out was answered %d, want the handshake refused", code)
	}
	if proc.ProcessState != nil {
		t.Fatal("muster dev exited")
	}
}

// xdsFirst opens a delta ADS stream to addr over TLS presenting cert
// (none when nil; and tok, when not empty), subscribes to web's endpoints
// and returns the first response or the stream's error, within 10 s.
// extra adds dial options (a dialer sending a PROXY header).
func xdsFirst(t *testing.T, addr string, ca *tlstest.CA, cert *tls.Certificate, tok string, extra ...grpc.DialOption) (*discovery.DeltaDiscoveryResponse, error) {
	t.Helper()
	tc := &tls.Config{RootCAs: ca.Pool()}
	if cert != nil {
		tc.Certificates = []tls.Certificate{*cert}
	}
	opts := append([]grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(tc))}, extra...)
	if tok != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(xdstest.Bearer(tok)))
	}
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	s, err := discovery.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(ctx)
	if err != nil {
		return nil, err
	}
	// io.EOF: the server has already ended the stream (a refusal); the
	// receive returns its status.
	if err := s.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNamesSubscribe: []string{"web"}}); err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	return s.Recv()
}

// stranger is a client presenting a certificate of ca, which muster's
// bundle does not hold.
func stranger(t *testing.T, ca *tlstest.CA) *mtlsClient {
	t.Helper()
	c := ca.ClientCert(t, "spiffe://prod.example.org/ns/shop/sa/web")
	return newMTLSClient(t, ca, &c, "")
}

// TestMTLSFlags: --tls-client-ca needs a TLS listener, --spiffe needs
// --tls-client-ca, and a bad trust-domain file stops the start naming
// the file and the entry.
func TestMTLSFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--tls-client-ca", "ca.pem"}, "needs --tls-cert"},
		{[]string{"--tls-cert", "x.crt", "--tls-key", "x.key", "--spiffe", "s.yaml"}, "needs --tls-client-ca"},
		{[]string{"--xds-tls-client-ca", "ca.pem"}, "needs --xds-tls-cert"},
	} {
		_, _, err := runCmd(t, append([]string{"dev", "--data", t.TempDir()}, tc.args...)...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("muster dev %v: %v, want %q", tc.args, err, tc.want)
		}
	}
	for body, want := range map[string]string{
		"":                    "empty",
		"trust_domains: []\n": "at least one trust domain",
		"trust_domain: x\n":   "field trust_domain not found",
		"trust_domains:\n  - trust_domain: prod.example.org\n    path: /ns/{namespace}/sa/{name}\n": "trust_domains.0: trust domain prod.example.org: path template",
		"trust_domains:\n  - trust_domain: spiffe://prod.example.org\n    path: /{service}\n":       "trust_domains.0",
	} {
		if _, err := parseSPIFFE("spiffe.yaml", []byte(body)); err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "spiffe.yaml") {
			t.Errorf("parseSPIFFE(%q): %v, want %q", body, err, want)
		}
	}
}
