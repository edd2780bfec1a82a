package reconcile

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/musterhq/muster/internal/registry"
)

// TestAuthorise: which endpoints of a reading their services take, by
// the services' member sources or, for a service naming none (or whose
// row does not verify), by what the source's configuration vouches for;
// an unauthorised endpoint that is a live instance already is kept.
func TestAuthorise(t *testing.T) {
	k8s := func(n int, svc, ns string, labels map[string]string, vouched bool) Endpoint {
		e := ep(n, true, true, false)
		e.Service, e.Namespace, e.KubeService, e.Labels, e.Vouched = svc, ns, svc+"-svc", labels, vouched
		return e
	}
	const src = "k8s/prod"
	for _, c := range []struct {
		name   string
		r      []Endpoint
		live   []Live
		auth   map[string]registry.MemberAuthority
		keep   []int
		claims []Claim
	}{
		{
			name:   "unconfigured: the config vouches",
			r:      []Endpoint{k8s(1, "web", "shop", nil, true), k8s(2, "web", "attacker", nil, false)},
			auth:   map[string]registry.MemberAuthority{"web": {}},
			keep:   []int{1},
			claims: []Claim{{Source: src, Namespace: "attacker", KubeService: "web-svc", Service: "web", Endpoints: 1}},
		},
		{
			name:   "configured: namespaces, not the config",
			r:      []Endpoint{k8s(1, "web", "shop", nil, true), k8s(2, "web", "canary", nil, false)},
			auth:   map[string]registry.MemberAuthority{"web": {Configured: true, Sources: []registry.MemberSource{{Source: src, Namespaces: []string{"canary"}}}}},
			keep:   []int{2},
			claims: []Claim{{Source: src, Namespace: "shop", KubeService: "web-svc", Service: "web", Endpoints: 1}},
		},
		{
			name:   "configured: another cluster's entry authorises nothing here",
			r:      []Endpoint{k8s(1, "web", "shop", nil, true)},
			auth:   map[string]registry.MemberAuthority{"web": {Configured: true, Sources: []registry.MemberSource{{Source: "k8s/staging", Namespaces: []string{"shop"}}}}},
			claims: []Claim{{Source: src, Namespace: "shop", KubeService: "web-svc", Service: "web", Endpoints: 1}},
		},
		{
			name: "configured: selector and namespaces both hold",
			r: []Endpoint{
				k8s(1, "web", "shop", map[string]string{"team": "payments"}, false),
				k8s(2, "web", "shop", map[string]string{"team": "search"}, false),
				k8s(3, "web", "other", map[string]string{"team": "payments"}, false),
			},
			auth: map[string]registry.MemberAuthority{"web": {Configured: true, Sources: []registry.MemberSource{{Source: src, Namespaces: []string{"shop"}, Selector: "team=payments"}}}},
			keep: []int{1},
			claims: []Claim{
				{Source: src, Namespace: "other", KubeService: "web-svc", Service: "web", Endpoints: 1},
				{Source: src, Namespace: "shop", KubeService: "web-svc", Service: "web", Endpoints: 1},
			},
		},
		{
			name:   "configured empty: nothing new, live members kept",
			r:      []Endpoint{k8s(1, "web", "shop", nil, true), k8s(2, "web", "shop", nil, true)},
			live:   live(1),
			auth:   map[string]registry.MemberAuthority{"web": {Configured: true, Sources: []registry.MemberSource{}}},
			keep:   []int{1},
			claims: []Claim{{Source: src, Namespace: "shop", KubeService: "web-svc", Service: "web", Endpoints: 2, Kept: 1}},
		},
		{
			name:   "a row that does not verify authorises nothing: the config's word stands",
			r:      []Endpoint{k8s(1, "web", "shop", nil, true), k8s(2, "web", "attacker", nil, false)},
			auth:   map[string]registry.MemberAuthority{"web": {SealErr: errors.New("not sealed by muster")}},
			keep:   []int{1},
			claims: []Claim{{Source: src, Namespace: "attacker", KubeService: "web-svc", Service: "web", Endpoints: 1}},
		},
		{
			name: "an unauthorised copy of an authorised member's id never speaks for it",
			r: func() []Endpoint {
				evil := k8s(1, "web", "attacker", nil, false)
				evil.Terminating, evil.Serving, evil.Ready = true, false, false
				return []Endpoint{k8s(1, "web", "shop", nil, true), evil}
			}(),
			live:   live(1),
			auth:   map[string]registry.MemberAuthority{"web": {}},
			keep:   []int{1},
			claims: []Claim{{Source: src, Namespace: "attacker", KubeService: "web-svc", Service: "web", Endpoints: 1}},
		},
		{
			name: "an unregistered service is left to the registry",
			r:    []Endpoint{k8s(1, "ghost", "x", nil, false)},
			auth: map[string]registry.MemberAuthority{},
			keep: []int{1},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, claims := Authorise(src, Reading{Endpoints: c.r, At: t0}, c.live, c.auth)
			var kept []int
			for _, e := range got.Endpoints {
				for n := 1; n <= 3; n++ {
					if e.ID == id(n) {
						kept = append(kept, n)
					}
				}
			}
			for _, e := range got.Endpoints {
				if e.Namespace == "attacker" && e.Terminating {
					t.Errorf("the unauthorised copy was kept: %+v", e)
				}
			}
			if d := cmp.Diff(c.keep, kept); d != "" {
				t.Errorf("kept (-want +got):\n%s", d)
			}
			if len(c.claims) == 0 {
				c.claims = []Claim{}
			}
			if d := cmp.Diff(c.claims, claims); d != "" {
				t.Errorf("claims (-want +got):\n%s", d)
			}
			if !got.At.Equal(t0) {
				t.Errorf("reading's time changed: %v", got.At)
			}
		})
	}
	// A snapshot source's entries: vouched by its configuration; a
	// configured service takes them only when it names the source.
	snap := ep(1, true, true, false)
	snap.Vouched = true
	if got, _ := Authorise("snapshot/ec2", Reading{Endpoints: []Endpoint{snap}}, nil, map[string]registry.MemberAuthority{"web": {}}); len(got.Endpoints) != 1 {
		t.Errorf("unconfigured service, snapshot entry: %+v", got.Endpoints)
	}
	named := map[string]registry.MemberAuthority{"web": {Configured: true, Sources: []registry.MemberSource{{Source: "snapshot/ec2"}}}}
	if got, _ := Authorise("snapshot/ec2", Reading{Endpoints: []Endpoint{snap}}, nil, named); len(got.Endpoints) != 1 {
		t.Errorf("configured service naming the snapshot: %+v", got.Endpoints)
	}
	if got, cl := Authorise("snapshot/other", Reading{Endpoints: []Endpoint{snap}}, nil, named); len(got.Endpoints) != 0 || len(cl) != 1 {
		t.Errorf("configured service, another snapshot: %+v %+v", got.Endpoints, cl)
	}
}
