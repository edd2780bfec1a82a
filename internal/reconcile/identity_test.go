package reconcile_test

import (
	"crypto/rand"
	"crypto/rsa"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/reconcile"
	"github.com/musterhq/muster/internal/registry"
)

// platformIssuer is a test OpenID provider minting tokens with the claim
// layout of a real platform (a Kubernetes API server's projected
// service-account tokens, AWS web identity), served on loopback with a
// discovery document and a key set, so muster verifies them with go-oidc
// exactly as it would the real issuer's.
type platformIssuer struct {
	srv    *httptest.Server
	key    *rsa.PrivateKey
	signer jose.Signer
}

func newPlatformIssuer(t *testing.T) *platformIssuer {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	p := &platformIssuer{key: key}
	if p.signer, err = jose.NewSigner(jose.SigningKey{Algorithm: jose.RS256, Key: jose.JSONWebKey{Key: key, KeyID: "k1", Algorithm: "RS256"}},
		(&jose.SignerOptions{}).WithType("JWT")); err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/.well-known/openid-configuration", func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(map[string]any{
			"issuer": p.srv.URL, "jwks_uri": p.srv.URL + "/openid/v1/jwks",
			"response_types_supported": []string{"id_token"}, "subject_types_supported": []string{"public"},
			"id_token_signing_alg_values_supported": []string{"RS256"},
		})
	})
	mux.HandleFunc("/openid/v1/jwks", func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: &key.PublicKey, KeyID: "k1", Algorithm: "RS256", Use: "sig"}}})
	})
	p.srv = httptest.NewServer(mux)
	t.Cleanup(p.srv.Close)
	return p
}

func (p *platformIssuer) URL() string { return p.srv.URL }

func (p *platformIssuer) mint(t *testing.T, sub string, extra map[string]any) string {
	t.Helper()
	now := time.Now()
	std := jwt.Claims{Issuer: p.URL(), Subject: sub, Audience: jwt.Audience{"muster"},
		IssuedAt: jwt.NewNumericDate(now), NotBefore: jwt.NewNumericDate(now), Expiry: jwt.NewNumericDate(now.Add(time.Hour))}
	tok, err := jwt.Signed(p.signer).Claims(std).Claims(extra).Serialize()
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// saToken is a projected service-account token as the kubelet mounts it
// for a pod: the real layout of the kubernetes.io claim.
func (p *platformIssuer) saToken(t *testing.T, namespace, sa, podName, podUID string) string {
	t.Helper()
	return p.mint(t, "system:serviceaccount:"+namespace+":"+sa, map[string]any{
		"kubernetes.io": map[string]any{
			"namespace":      namespace,
			"node":           map[string]any{"name": "node-1", "uid": "2f0c5bd3-node"},
			"pod":            map[string]any{"name": podName, "uid": podUID},
			"serviceaccount": map[string]any{"name": sa, "uid": "8e1f3c7a-sa"},
			"warnafter":      time.Now().Add(50 * time.Minute).Unix(),
		},
	})
}

// TestPodTokenReportsForItsOwnInstance: a pod's projected token reports
// self-health for its own pod's reconciled instance and is refused for a
// sibling's; it cannot act as an operator; the audit names its issuer.
func TestPodTokenReportsForItsOwnInstance(t *testing.T) {
	t.Parallel()
	iss := newPlatformIssuer(t)
	st := apptest.New(t, apptest.Options{Issuers: []identity.IssuerConfig{{URL: iss.URL(), Mapping: &identity.ClaimMapping{
		Type: identity.MappingKubernetes, Cluster: "test", Services: map[string]string{ns + "/web": "web"}}}}})
	admin := st.Token(t, apptest.Admin)
	if r := st.JSON(t, "PUT", "/v1/services/web", admin, `{"owner":"payments","capabilities":["self","readiness","passive"]}`); r.Status != http.StatusCreated {
		t.Fatalf("create web: %d %s", r.Status, r.Body)
	}
	c := &cluster{t: t, st: st, client: fake.NewClientset(service("web", "web"), slice("web", "web-1", running("uid-a", "10.7.0.1"), running("uid-b", "10.7.0.2")))}
	c.start(reconcile.Disbelief{})
	c.sees(2)
	c.pass()
	ida, idb := registry.ReconciledID("k8s/test", "web", "uid-a"), registry.ReconciledID("k8s/test", "web", "uid-b")
	tokA := iss.saToken(t, ns, "web", "web-uid-a", "uid-a")

	// Its own instance: accepted, from any address (the token is bound to
	// the pod, not to where the report comes from).
	r := st.JSON(t, "POST", "/v1/reports", tokA, fmt.Sprintf(`{"reports":[{"instance_id":"%s","class":"self","outcome":"failure"}]}`, ida))
	if r.Status != http.StatusOK || !strings.Contains(string(r.Body), `"accepted":1`) {
		t.Fatalf("own report: %d %s", r.Status, r.Body)
	}
	// A sibling's: refused, naming the binding.
	r = st.JSON(t, "POST", "/v1/reports", tokA, fmt.Sprintf(`{"reports":[{"instance_id":"%s","class":"self","outcome":"failure"}]}`, idb))
	if r.Status != http.StatusOK || !strings.Contains(string(r.Body), `"accepted":0`) || !strings.Contains(string(r.Body), "not_own_instance") || !strings.Contains(string(r.Body), "bound to pod uid-a") {
		t.Fatalf("sibling report: %d %s", r.Status, r.Body)
	}
	// A workload, never an operator: an override and a confirmation are
	// refused, and the audit actor carries the issuer.
	r = st.JSON(t, "POST", "/v1/leases/expiry-confirmations", tokA, `{"reason":"pod says so"}`)
	if r.Status != http.StatusForbidden {
		t.Fatalf("confirm lease expiry as a pod: %d %s", r.Status, r.Body)
	}
	a := st.Do(t, "GET", "/v1/audit?action=lease.expiry.confirm", admin, "", "")
	if want := iss.URL() + "#workload:web/system:serviceaccount:" + ns + ":web"; !strings.Contains(string(a.Body), want) {
		t.Fatalf("audit %s lacks actor %s", a.Body, want)
	}
	// A token of this issuer claiming muster's operator claims is refused
	// outright: the issuer is mapped to workloads.
	forged := iss.mint(t, "system:serviceaccount:"+ns+":web", map[string]any{
		"kubernetes.io": map[string]any{"namespace": ns, "serviceaccount": map[string]any{"name": "web"}},
		"muster_kind":   "operator", "muster_role": "admin",
	})
	if r := st.Do(t, "GET", "/v1/alarms", forged, "", ""); r.Status != http.StatusUnauthorized {
		t.Fatalf("an operator claim from a workload issuer: %d %s, want 401", r.Status, r.Body)
	}
	// An unmapped service account is refused.
	if r := st.Do(t, "GET", "/v1/resolve/web", iss.saToken(t, ns, "other", "x", "uid-x"), "", ""); r.Status != http.StatusUnauthorized {
		t.Fatalf("unmapped service account: %d %s, want 401", r.Status, r.Body)
	}
}

// TestAWSWebIdentityMapping: an AWS web-identity token's role session maps
// to a service by its account and role (ACCOUNT:role/NAME): another
// account's role of the same name maps to nothing, and a mapping keyed by
// a role name alone is refused at start. The issuer cannot mint anything
// else.
func TestAWSWebIdentityMapping(t *testing.T) {
	t.Parallel()
	iss := newPlatformIssuer(t)
	v, err := identity.NewVerifier([]identity.IssuerConfig{{URL: iss.URL(), Mapping: &identity.ClaimMapping{
		Type: identity.MappingAWS, Services: map[string]string{"123456789012:role/web-role": "web", "210987654321:role/web-role": "api"}}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ sub, service string }{
		{"arn:aws:sts::123456789012:assumed-role/web-role/i-0abc", "web"},
		{"arn:aws:iam::123456789012:role/team/web-role", "web"},
		{"arn:aws:sts::210987654321:assumed-role/web-role/i-0def", "api"},
	} {
		p, err := v.Verify(t.Context(), iss.mint(t, tc.sub, nil))
		if err != nil {
			t.Fatalf("%s: %v", tc.sub, err)
		}
		if p.Kind != identity.KindWorkload || p.Service != tc.service || p.Role != "" || p.Pod != "" || p.Subject != tc.sub {
			t.Fatalf("%s: principal %+v, want a workload of %s", tc.sub, p, tc.service)
		}
	}
	for _, sub := range []string{
		"arn:aws:sts::123456789012:assumed-role/admin-role/s",
		"arn:aws:sts::999999999999:assumed-role/web-role/i-0abc", // the same role name in another account
		"not-an-arn", "arn:aws:iam::123456789012:user/web-role", "arn:aws:sts::12345:assumed-role/web-role/s",
	} {
		if _, err := v.Verify(t.Context(), iss.mint(t, sub, nil)); err == nil {
			t.Errorf("%s accepted", sub)
		}
	}
	for _, services := range []map[string]string{nil, {"web-role": "web"}, {"123456789012:web-role": "web"}, {"123456789012:role/path/web-role": "web"}} {
		if _, err := identity.NewVerifier([]identity.IssuerConfig{{URL: iss.URL(), Mapping: &identity.ClaimMapping{Type: identity.MappingAWS, Services: services}}}, nil); err == nil {
			t.Errorf("a mapping of %v accepted", services)
		}
	}
	// A plain issuer limited to workloads refuses an operator token.
	v2, err := identity.NewVerifier([]identity.IssuerConfig{{URL: iss.URL(), Kinds: []identity.Kind{identity.KindWorkload}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v2.Verify(t.Context(), iss.mint(t, "ops", map[string]any{"muster_kind": "operator", "muster_role": "admin"})); err == nil || !strings.Contains(err.Error(), "not trusted for kind operator") {
		t.Fatalf("operator from a workload-only issuer: %v", err)
	}
}
