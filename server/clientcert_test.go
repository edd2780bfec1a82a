package server_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/tlsreload/tlstest"
)

// mapped is ClientCertificates without chain verification (the
// handshake's, tested in tlsreload and end to end in cmd/muster).
type mapped struct{ td *identity.TrustDomains }

func (m mapped) Principal(chain []*x509.Certificate) (identity.Principal, error) {
	return m.td.Principal(chain[0])
}

// TestClientCertificateIdentity (issue 28): a request carrying a client
// certificate that maps to web and no token is web's workload: it
// registers an address its certificate's IP SANs list from another
// source. An unmapped certificate without a token is 401, a token of api
// with web's certificate 403 conflicting-proofs, and both refusals are
// on the audit record by source address with their codes, and nothing
// of the certificates.
func TestClientCertificateIdentity(t *testing.T) {
	t.Parallel()
	td, err := identity.NewTrustDomains([]identity.TrustDomainConfig{{TrustDomain: "prod.example.org", Path: "/ns/{namespace}/sa/{service}"}})
	if err != nil {
		t.Fatal(err)
	}
	s := apptest.New(t, apptest.Options{ClientCertificates: mapped{td}})
	admin := s.Token(t, adminReq)
	s.Seed(t)
	ca := tlstest.NewCA(t)
	web := ca.ClientCert(t, "spiffe://prod.example.org/ns/shop/sa/web", net.IPv4(10, 9, 8, 7))
	staging := ca.ClientCert(t, "spiffe://staging.example.org/ns/shop/sa/web")

	do := func(method, path, tok string, cert *tls.Certificate, body string) *httptest.ResponseRecorder {
		t.Helper()
		r := httptest.NewRequest(method, path, strings.NewReader(body))
		r.RemoteAddr = "192.0.2.10:40000"
		r.TLS = &tls.ConnectionState{HandshakeComplete: true, PeerCertificates: []*x509.Certificate{cert.Leaf}}
		if tok != "" {
			r.Header.Set("Authorization", "Bearer "+tok)
		}
		if body != "" {
			r.Header.Set("Content-Type", "application/json")
		}
		w := httptest.NewRecorder()
		s.Server.ServeHTTP(w, r)
		return w
	}
	if w := do("POST", "/v1/services/web/instances", "", &web, `{"address":"10.9.8.7","port":8080,"zone":"az1"}`); w.Code != http.StatusCreated {
		t.Fatalf("register by certificate at its IP SAN: %d %s", w.Code, w.Body)
	}
	if w := do("POST", "/v1/services/web/instances", "", &web, `{"address":"10.9.8.6","port":8080,"zone":"az1"}`); w.Code != http.StatusForbidden {
		t.Fatalf("register by certificate at an address it does not list: %d %s", w.Code, w.Body)
	}
	if w := do("PUT", "/v1/services/web/contract", "", &web, `{"dependencies":[]}`); w.Code != http.StatusForbidden {
		t.Fatalf("a certificate's workload writing a contract: %d %s", w.Code, w.Body)
	}
	if w := do("GET", "/v1/services", "", &staging, ""); w.Code != http.StatusUnauthorized || !strings.Contains(w.Body.String(), "not configured") {
		t.Fatalf("unmapped certificate, no token: %d %s", w.Code, w.Body)
	}
	api := s.Token(t, apiReq)
	if w := do("GET", "/v1/services", api, &web, ""); w.Code != http.StatusForbidden || !strings.Contains(w.Body.String(), "conflicting-proofs") {
		t.Fatalf("api's token with web's certificate: %d %s", w.Code, w.Body)
	}
	if w := do("GET", "/v1/services/web/instances", s.Token(t, webReq), &web, ""); w.Code != http.StatusOK {
		t.Fatalf("web's token with web's certificate: %d %s", w.Code, w.Body)
	}

	s.AuthFailures.RunOnce(context.Background(), false)
	r := s.Do(t, "GET", "/v1/audit?outcome=refused&action=auth.refuse&limit=50", admin, "", "")
	var page struct{ Items []audit.Event }
	if err := json.Unmarshal(r.Body, &page); r.Status != http.StatusOK || err != nil || len(page.Items) != 1 {
		t.Fatalf("audit: %d %s", r.Status, r.Body)
	}
	e := page.Items[0]
	var after struct {
		ByReason map[string]int `json:"by_reason"`
	}
	if err := json.Unmarshal(e.After, &after); err != nil {
		t.Fatal(err)
	}
	if want := map[string]int{"certificate_unmapped": 1, "conflicting_proofs": 1}; e.Target != "192.0.2.10" || !cmp.Equal(want, after.ByReason) {
		t.Errorf("auth.refuse row for %s with %v, want 192.0.2.10 with %v", e.Target, after.ByReason, want)
	}
	if raw, _ := json.Marshal(e); strings.Contains(string(raw), "BEGIN") || strings.Contains(string(raw), "spiffe://") {
		t.Errorf("the row carries certificate material: %s", raw)
	}
}
