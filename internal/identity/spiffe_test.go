package identity_test

import (
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/tlsreload/tlstest"
)

func TestPathTemplate(t *testing.T) {
	t.Parallel()
	tmpl, err := identity.ParsePathTemplate("/ns/{namespace}/sa/{service}")
	if err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{
		"/ns/shop/sa/web":       "web",
		"/ns/other/sa/checkout": "checkout",
		"/ns/shop/sa/Web":       "", // not a service name
		"/ns/shop/sa/web/x":     "",
		"/ns/shop/sa":           "",
		"/ns//sa/web":           "",
		"/nx/shop/sa/web":       "",
		"ns/shop/sa/web":        "",
		"":                      "",
		"/":                     "",
	} {
		got, ok := tmpl.Match(path)
		if got != want || ok != (want != "") {
			t.Errorf("Match(%q) = %q, %v; want %q", path, got, ok, want)
		}
	}
	for _, bad := range []string{
		"", "ns/{service}", "/ns/{namespace}", "/{service}/{service}", "/a//{service}",
		"/{service}/", "/{Service}", "/x{service}", "/{service", "/a}/{service}", "/../{service}", "/a b/{service}",
		"/" + strings.Repeat("a/", 40) + "{service}",
	} {
		if _, err := identity.ParsePathTemplate(bad); err == nil {
			t.Errorf("ParsePathTemplate(%q) accepted, want an error", bad)
		}
	}
	if _, err := identity.ParsePathTemplate("/{service}"); err != nil {
		t.Errorf("ParsePathTemplate(/{service}): %v", err)
	}
}

func FuzzPathTemplate(f *testing.F) {
	for _, s := range []string{"/ns/{namespace}/sa/{service}", "/{service}", "/a/{x}/{service}/b", "/{service}/{service}", "//", "/{}"} {
		f.Add(s, "/ns/shop/sa/web")
	}
	f.Fuzz(func(t *testing.T, tmpl, path string) {
		p, err := identity.ParsePathTemplate(tmpl)
		if err != nil {
			return
		}
		if p.String() != tmpl {
			t.Fatalf("String() = %q, want %q", p.String(), tmpl)
		}
		svc, ok := p.Match(path)
		if !ok {
			return
		}
		// A match names a service that is one whole segment of the path,
		// and the path has as many segments as the template.
		if !strings.Contains(path+"/", "/"+svc+"/") {
			t.Fatalf("Match(%q) with %q = %q, not a segment of the path", path, tmpl, svc)
		}
		if strings.Count(path, "/") != strings.Count(tmpl, "/") {
			t.Fatalf("Match(%q) with %q: segment counts differ", path, tmpl)
		}
		if _, err := identity.NewPrincipal("spiffe://x", "s", identity.Claims{Kind: "workload", Service: svc}); err != nil {
			t.Fatalf("Match returned %q, which is not a service name: %v", svc, err)
		}
	})
}

func TestTrustDomainsConfig(t *testing.T) {
	t.Parallel()
	for _, cfgs := range [][]identity.TrustDomainConfig{
		{{TrustDomain: "spiffe://prod.example.org", Path: "/{service}"}},
		{{TrustDomain: "Prod.example.org", Path: "/{service}"}},
		{{TrustDomain: "prod.example.org/x", Path: "/{service}"}},
		{{TrustDomain: "", Path: "/{service}"}},
		{{TrustDomain: "prod.example.org", Path: "/sa/{name}"}},
		{{TrustDomain: "prod.example.org", Path: "/{service}"}, {TrustDomain: "prod.example.org", Path: "/a/{service}"}},
	} {
		if _, err := identity.NewTrustDomains(cfgs); err == nil {
			t.Errorf("NewTrustDomains(%+v) accepted, want an error", cfgs)
		}
	}
}

func TestTrustDomainsPrincipal(t *testing.T) {
	t.Parallel()
	td, err := identity.NewTrustDomains([]identity.TrustDomainConfig{
		{TrustDomain: "prod.example.org", Path: "/ns/{namespace}/sa/{service}"},
	})
	if err != nil {
		t.Fatal(err)
	}
	ca := tlstest.NewCA(t)
	c := ca.ClientCert(t, "spiffe://prod.example.org/ns/shop/sa/web", net.IPv4(10, 1, 2, 3), net.ParseIP("2001:db8::1"))
	got, err := td.Principal(c.Leaf)
	if err != nil {
		t.Fatal(err)
	}
	want := identity.Principal{Issuer: "spiffe://prod.example.org", Subject: "spiffe://prod.example.org/ns/shop/sa/web",
		Kind: identity.KindWorkload, Service: "web", Expiry: c.Leaf.NotAfter,
		Addresses: []netip.Addr{netip.MustParseAddr("10.1.2.3"), netip.MustParseAddr("2001:db8::1")}}
	if diff := cmp.Diff(want, got, cmpopts.EquateComparable(netip.Addr{})); diff != "" {
		t.Errorf("Principal (-want +got):\n%s", diff)
	}
	if got.Home || got.Role != "" {
		t.Errorf("a certificate principal is never home and has no role: %+v", got)
	}

	for name, id := range map[string]string{
		"no SPIFFE ID":         "",
		"unknown trust domain": "spiffe://staging.example.org/ns/shop/sa/web",
		"path not matching":    "spiffe://prod.example.org/ns/shop/web",
		"service not a name":   "spiffe://prod.example.org/ns/shop/sa/WEB",
		"not a spiffe URI":     "https://prod.example.org/ns/shop/sa/web",
	} {
		c := ca.ClientCert(t, id)
		if _, err := td.Principal(c.Leaf); !errors.Is(err, identity.ErrCertificateUnmapped) {
			t.Errorf("%s: Principal = %v, want ErrCertificateUnmapped", name, err)
		}
	}
}
