package registry

import (
	"context"
	"fmt"
	"slices"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/refusal"
)

// Grants lists the caller services whose workloads may resolve a service
// (ADR-15): resolution is authorised per caller-callee pair, so a
// compromised workload cannot map the estate.
type Grants struct {
	Service string   `json:"service"`
	Callers []string `json:"callers"`
}

// MaxGrants bounds one service's grant list.
const MaxGrants = 1000

// PutGrants replaces the callers allowed to resolve service. The owning
// team's operators and admins may change it; every caller must be an
// existing service. A new grant is sealed; a caller left out gets a
// sealed tombstone (revoked_at), never a deleted row (authzseal.go).
func (r *Registry) PutGrants(ctx context.Context, actor identity.Principal, service string, callers []string) (Grants, error) {
	const action = "grants.put"
	callers = slices.Clone(callers)
	slices.Sort(callers)
	callers = slices.Compact(callers)
	if callers == nil {
		callers = []string{}
	}
	g := Grants{Service: service, Callers: callers}
	var written []db.ServiceGrant
	err := r.write(ctx, actor, action, "service", service, g, func(q *db.Queries) (*refusal.Error, error) {
		row, err := q.ServiceGetForUpdate(ctx, service)
		if notFound(err) {
			return newRefusal(ErrNotFound, "no service named %s", service), nil
		}
		if err != nil {
			return nil, fmt.Errorf("read service %s: %w", service, err)
		}
		if owner := r.ownerOf(row); !CanManage(actor, owner) {
			return newRefusal(ErrForbidden, "changing who may resolve %s needs the %s team's operator role or admin; %s has neither", service, owner, actor), nil
		}
		var fe []FieldError
		if len(callers) > MaxGrants {
			fe = append(fe, FieldError{Field: "callers", Message: fmt.Sprintf("at most %d callers, got %d", MaxGrants, len(callers))})
		}
		for i, c := range callers {
			if !ValidName(c) {
				fe = append(fe, FieldError{Field: fmt.Sprintf("callers[%d]", i), Message: fmt.Sprintf("must be a service name, got %q", c)})
			} else if _, err := q.ServiceGet(ctx, c); notFound(err) {
				fe = append(fe, FieldError{Field: fmt.Sprintf("callers[%d]", i), Message: fmt.Sprintf("no service named %q", c)})
			} else if err != nil {
				return nil, fmt.Errorf("read service %s: %w", c, err)
			}
		}
		if len(fe) > 0 {
			return invalid("the grants are not valid", fe), nil
		}
		rows, err := q.GrantsOf(ctx, service)
		if err != nil {
			return nil, fmt.Errorf("read grants of %s: %w", service, err)
		}
		before := r.activeGrants(rows)
		// Every caller not granted any more gets a sealed tombstone: any
		// row not revoked (sealed or not), and any grant the copy still
		// holds whose row was deleted by hand, since only a tombstone
		// revokes.
		var drop []string
		for _, row := range rows {
			if row.RevokedAt == nil {
				drop = append(drop, row.Caller)
			}
		}
		if c := r.authz.Load(); c != nil {
			drop = append(drop, c.callers(service)...)
		}
		slices.Sort(drop)
		drop = slices.Compact(drop)
		now := r.now()
		copied := r.authz.Load()
		floor := func(caller string) int64 {
			if copied == nil {
				return 0
			}
			return copied.version(service, caller)
		}
		for _, c := range drop {
			if slices.Contains(callers, c) {
				continue
			}
			row, err := q.GrantRevoke(ctx, db.GrantRevokeParams{Service: service, Caller: c, Now: now, RevokedBy: actor.String(), Floor: floor(c)})
			if err != nil {
				return nil, fmt.Errorf("revoke the grant of %s to %s: %w", service, c, err)
			}
			if row, err = sealGrant(ctx, q, r.cfg.Sealer, row); err != nil {
				return nil, err
			}
			written = append(written, row)
		}
		for _, c := range callers {
			if slices.Contains(before, c) {
				continue // granted already: the seal stands
			}
			row, err := q.GrantUpsert(ctx, db.GrantUpsertParams{Service: service, Caller: c, Now: now, GrantedBy: actor.String(), Floor: floor(c)})
			if err != nil {
				return nil, fmt.Errorf("grant %s to %s: %w", service, c, err)
			}
			if row, err = sealGrant(ctx, q, r.cfg.Sealer, row); err != nil {
				return nil, err
			}
			written = append(written, row)
		}
		_, err = audit.Append(ctx, q, now, accepted(actor, action, "service", service, Grants{Service: service, Callers: before}, g))
		return nil, err
	})
	if err != nil {
		return Grants{}, err
	}
	if c := r.authz.Load(); c != nil {
		c.putGrants(written)
	}
	return g, nil
}

// GetGrants returns who may resolve service: the grants whose seal
// verifies and that are not revoked, and those the copy keeps although
// their rows are gone.
func (r *Registry) GetGrants(ctx context.Context, actor identity.Principal, service string) (Grants, error) {
	if _, err := r.GetService(ctx, actor, service); err != nil {
		return Grants{}, err
	}
	rows, err := db.New(r.cfg.Pool).GrantsOf(ctx, service)
	if err != nil {
		return Grants{}, fmt.Errorf("read grants of %s: %w", service, err)
	}
	callers := r.activeGrants(rows)
	if c := r.authz.Load(); c != nil {
		// What this replica enforces: a grant whose row was deleted by
		// hand stands until a sealed revocation (authzcache.go).
		callers = append(callers, c.callers(service)...)
		slices.Sort(callers)
		callers = slices.Compact(callers)
	}
	return Grants{Service: service, Callers: callers}, nil
}

// MayResolve reports (as a refusal error) whether actor may resolve or
// watch service, reading the grants from PostgreSQL (only those whose
// seal verifies and that are not revoked): operators and tools by
// role, a workload for its own service or one that granted its service.
// The error does not say whether the service exists, so it cannot be used
// to enumerate the estate. AuthzCache.MayResolve decides the same from
// memory.
func (r *Registry) MayResolve(ctx context.Context, actor identity.Principal, service string) error {
	return mayResolve(actor, service, func(caller string) (bool, error) {
		rows, err := db.New(r.cfg.Pool).GrantsOf(ctx, service)
		if err != nil {
			return false, fmt.Errorf("read grants of %s: %w", service, err)
		}
		return slices.Contains(r.activeGrants(rows), caller), nil
	})
}

// mayResolve is the one rule of who may resolve or watch a service, for
// both the database path (Registry.MayResolve) and the in-memory copy
// (AuthzCache): estate readers by role, a workload for its own service,
// and a workload whose service the owners of service granted. granted
// (whether service's grants name caller) is asked only in that last case.
func mayResolve(actor identity.Principal, service string, granted func(caller string) (bool, error)) error {
	if CanReadEstate(actor) || (actor.Kind == identity.KindWorkload && actor.Service == service) {
		return nil
	}
	if actor.Kind == identity.KindWorkload && actor.Service != "" {
		ok, err := granted(actor.Service)
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
	}
	return newRefusal(ErrForbidden, "%s may not resolve %s: its owners have not granted %s", actor, service, callerName(actor))
}

func callerName(p identity.Principal) string {
	if p.Service != "" {
		return "service " + p.Service
	}
	return "this identity"
}

// MayResolveGranted applies MayResolve's rule to a service whose grants
// another authority keeps (a peer region's): granted reports
// whether that authority granted a caller service.
func MayResolveGranted(actor identity.Principal, service string, granted func(caller string) bool) error {
	return mayResolve(actor, service, func(caller string) (bool, error) { return granted(caller), nil })
}
