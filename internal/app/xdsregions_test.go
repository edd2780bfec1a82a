package app

import (
	"testing"

	"github.com/musterhq/muster/internal/identity"
)

type grantsOf map[string]map[string][]string // region -> service -> callers

func (g grantsOf) Granted(region, service, caller string) bool {
	for _, c := range g[region][service] {
		if c == caller {
			return true
		}
	}
	return false
}

// TestMayResolveRemoteIsThePeersDecision: xDS sees a peer region's
// series of a service as /v1 serves it: by that region's grants for
// workloads (its own service always), by role for operators and tools.
func TestMayResolveRemoteIsThePeersDecision(t *testing.T) {
	t.Parallel()
	may := mayResolveRemote(grantsOf{"b": {"billing": {"checkout"}}})
	checkout := identity.Principal{Kind: identity.KindWorkload, Service: "checkout"}
	for _, tc := range []struct {
		p               identity.Principal
		region, service string
		want            bool
	}{
		{checkout, "b", "billing", true},
		{checkout, "c", "billing", false}, // c granted nothing
		{checkout, "b", "ledger", false},
		{identity.Principal{Kind: identity.KindWorkload, Service: "ledger"}, "c", "ledger", true}, // its own service
		{identity.Principal{Kind: identity.KindWorkload, Service: "search"}, "b", "billing", false},
		{identity.Principal{Kind: identity.KindOperator, Subject: "vera", Role: identity.RoleViewer}, "c", "billing", true},
	} {
		if got := may(tc.p, tc.region, tc.service); got != tc.want {
			t.Errorf("%s resolving %s@%s: %v, want %v", tc.p, tc.service, tc.region, got, tc.want)
		}
	}
}
