package identity_test

import (
	"testing"

	"github.com/musterhq/muster/internal/devissuer"
	"github.com/musterhq/muster/internal/identity"
)

func TestRoleAtLeast(t *testing.T) {
	t.Parallel()
	roles := []identity.Role{identity.RoleViewer, identity.RoleOperator, identity.RoleAdmin}
	for i, r := range roles {
		for j, min := range roles {
			if got, want := r.AtLeast(min), i >= j; got != want {
				t.Errorf("%s.AtLeast(%s) = %v, want %v", r, min, got, want)
			}
		}
		// Unknown roles fail closed on either side.
		if r.AtLeast("") || r.AtLeast("root") {
			t.Errorf("%s.AtLeast(unknown) = true", r)
		}
		if identity.Role("").AtLeast(r) || identity.Role("root").AtLeast(r) {
			t.Errorf("unknown.AtLeast(%s) = true", r)
		}
	}
}

func TestParseRoleAndKind(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"viewer", "operator", "admin"} {
		if r, err := identity.ParseRole(s); err != nil || string(r) != s {
			t.Errorf("ParseRole(%q) = %q, %v", s, r, err)
		}
	}
	for _, s := range []string{"workload", "prober", "tool", "operator"} {
		if k, err := identity.ParseKind(s); err != nil || string(k) != s {
			t.Errorf("ParseKind(%q) = %q, %v", s, k, err)
		}
	}
	for _, s := range []string{"", "Admin", "root", " viewer"} {
		if r, err := identity.ParseRole(s); err == nil {
			t.Errorf("ParseRole(%q) = %q, want error", s, r)
		}
	}
	for _, s := range []string{"", "Workload", "human", "tool "} {
		if k, err := identity.ParseKind(s); err == nil {
			t.Errorf("ParseKind(%q) = %q, want error", s, k)
		}
	}
}

func TestPrincipalIsAdmin(t *testing.T) {
	t.Parallel()
	tests := []struct {
		p    identity.Principal
		want bool
	}{
		{identity.Principal{Kind: identity.KindOperator, Role: identity.RoleAdmin}, true},
		{identity.Principal{Kind: identity.KindTool, Role: identity.RoleAdmin}, true},
		{identity.Principal{Kind: identity.KindOperator, Role: identity.RoleOperator}, false},
		// A role on a kind that cannot hold one grants nothing.
		{identity.Principal{Kind: identity.KindWorkload, Service: "web", Role: identity.RoleAdmin}, false},
		{identity.Principal{Kind: identity.KindProber, Role: identity.RoleAdmin}, false},
	}
	for _, tt := range tests {
		if got := tt.p.IsAdmin(); got != tt.want {
			t.Errorf("%+v.IsAdmin() = %v, want %v", tt.p, got, tt.want)
		}
	}
}

// TestPrincipalNamesCarryTheIssuer checks that the same subject at two
// issuers is two names: the home (first) issuer's principals keep the
// short form, any other issuer's are prefixed with it.
func TestPrincipalNamesCarryTheIssuer(t *testing.T) {
	t.Parallel()
	home, other := newDevServer(t), newDevServer(t)
	clock := newFakeClock()
	v := newVerifier(t, clock, identity.IssuerConfig{URL: home.URL()}, identity.IssuerConfig{URL: other.URL()})
	for _, req := range []devissuer.TokenRequest{
		{Kind: identity.KindOperator, Subject: "alice", Role: identity.RoleAdmin},
		{Kind: identity.KindWorkload, Service: "web"},
		{Kind: identity.KindProber, Subject: "p1"},
	} {
		a, err := v.Verify(t.Context(), home.mint(t, req, clock.Now()))
		if err != nil {
			t.Fatal(err)
		}
		b, err := v.Verify(t.Context(), other.mint(t, req, clock.Now()))
		if err != nil {
			t.Fatal(err)
		}
		if a.String() == b.String() || a.ProberName() == b.ProberName() {
			t.Errorf("%s at two issuers: names %q and %q, prober names %q and %q; want them to differ",
				req.Kind, a, b, a.ProberName(), b.ProberName())
		}
		short := identity.Principal{Kind: a.Kind, Service: a.Service, Subject: a.Subject}.String()
		if a.String() != short || a.ProberName() != a.Subject {
			t.Errorf("home issuer's %s named %q (prober name %q), want %q (%q)", req.Kind, a, a.ProberName(), short, a.Subject)
		}
		if want := other.URL() + "#" + short; b.String() != want {
			t.Errorf("other issuer's %s named %q, want %q", req.Kind, b, want)
		}
	}
	if v.Home() != home.URL() {
		t.Errorf("Home() = %q, want the first issuer %q", v.Home(), home.URL())
	}
}
