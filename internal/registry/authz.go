package registry

import (
	"github.com/musterhq/muster/internal/identity"
)

// CanManage reports whether p may change a service owned by team: the
// owning team's operators (people or tools) and admins.
func CanManage(p identity.Principal, team string) bool {
	if p.IsAdmin() {
		return true
	}
	switch p.Kind {
	case identity.KindOperator, identity.KindTool:
		return p.Role.AtLeast(identity.RoleOperator) && p.Team != "" && p.Team == team
	}
	return false
}

// CanReadEstate reports whether p may list the whole registry. Workloads and
// probers may not: resolution is authorised per caller-callee pair (ADR-15),
// so a compromised workload must not be able to map the estate.
func CanReadEstate(p identity.Principal) bool {
	switch p.Kind {
	case identity.KindOperator, identity.KindTool:
		return p.Role.AtLeast(identity.RoleViewer)
	}
	return false
}

// CanReadService reports whether p may read one service and its
// instances: estate readers, and workloads and probers bound to that
// service. Anyone else is answered as if the service's instances did not
// exist.
func CanReadService(p identity.Principal, service string) bool { return canReadService(p, service) }

// canReadService reports whether p may read one service and its instances:
// estate readers, and workloads and probers bound to that service.
func canReadService(p identity.Principal, service string) bool {
	if CanReadEstate(p) {
		return true
	}
	return (p.Kind == identity.KindWorkload || p.Kind == identity.KindProber) && p.Service == service
}
