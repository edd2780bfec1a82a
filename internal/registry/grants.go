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
// existing service.
func (r *Registry) PutGrants(ctx context.Context, actor identity.Principal, service string, callers []string) (Grants, error) {
	const action = "grants.put"
	callers = slices.Clone(callers)
	slices.Sort(callers)
	callers = slices.Compact(callers)
	if callers == nil {
		callers = []string{}
	}
	g := Grants{Service: service, Callers: callers}
	err := r.write(ctx, actor, action, "service", service, g, func(q *db.Queries) (*refusal.Error, error) {
		row, err := q.ServiceGetForUpdate(ctx, service)
		if notFound(err) {
			return newRefusal(ErrNotFound, "no service named %s", service), nil
		}
		if err != nil {
			return nil, fmt.Errorf("read service %s: %w", service, err)
		}
		if !CanManage(actor, row.Owner) {
			return newRefusal(ErrForbidden, "changing who may resolve %s needs the %s team's operator role or admin; %s has neither", service, row.Owner, actor), nil
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
		before, err := q.GrantsGet(ctx, service)
		if err != nil {
			return nil, fmt.Errorf("read grants of %s: %w", service, err)
		}
		if err := q.GrantsDelete(ctx, service); err != nil {
			return nil, fmt.Errorf("clear grants of %s: %w", service, err)
		}
		now := r.now()
		for _, c := range callers {
			if err := q.GrantInsert(ctx, db.GrantInsertParams{Service: service, Caller: c, Now: now, GrantedBy: actor.String()}); err != nil {
				return nil, fmt.Errorf("grant %s to %s: %w", service, c, err)
			}
		}
		_, err = audit.Append(ctx, q, now, accepted(actor, action, "service", service, Grants{Service: service, Callers: nonNil(before)}, g))
		return nil, err
	})
	if err != nil {
		return Grants{}, err
	}
	if c := r.authz.Load(); c != nil {
		c.putGrants(service, callers)
	}
	return g, nil
}

// GetGrants returns who may resolve service.
func (r *Registry) GetGrants(ctx context.Context, actor identity.Principal, service string) (Grants, error) {
	if _, err := r.GetService(ctx, actor, service); err != nil {
		return Grants{}, err
	}
	callers, err := db.New(r.cfg.Pool).GrantsGet(ctx, service)
	if err != nil {
		return Grants{}, fmt.Errorf("read grants of %s: %w", service, err)
	}
	return Grants{Service: service, Callers: nonNil(callers)}, nil
}

// MayResolve reports (as a refusal error) whether actor may resolve or
// watch service, reading the grants from PostgreSQL: operators and tools by
// role, a workload for its own service or one that granted its service.
// The error does not say whether the service exists, so it cannot be used
// to enumerate the estate. AuthzCache.MayResolve decides the same from
// memory.
func (r *Registry) MayResolve(ctx context.Context, actor identity.Principal, service string) error {
	return mayResolve(actor, service, func(caller string) (bool, error) {
		callers, err := db.New(r.cfg.Pool).GrantsGet(ctx, service)
		if err != nil {
			return false, fmt.Errorf("read grants of %s: %w", service, err)
		}
		return slices.Contains(callers, caller), nil
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

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
