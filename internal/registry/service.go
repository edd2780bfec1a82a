package registry

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"time"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/refusal"
)

// Capability is a kind of health evidence a service's runtime can supply
// (ADR-16).
type Capability string

// Capabilities.
const (
	CapProbe     Capability = "probe"
	CapSelf      Capability = "self"
	CapPassive   Capability = "passive"
	CapReadiness Capability = "readiness"
)

var allCapabilities = []Capability{CapProbe, CapSelf, CapPassive, CapReadiness}

// Service is a named, owned service with its capability profile.
type Service struct {
	Name         string       `json:"name"`
	Owner        string       `json:"owner"`
	Capabilities []Capability `json:"capabilities"`
	CreatedAt    time.Time    `json:"created_at"`
	UpdatedAt    time.Time    `json:"updated_at"`
}

// Has reports whether the service declares capability c.
func (s Service) Has(c Capability) bool { return slices.Contains(s.Capabilities, c) }

// ServiceSpec is what a caller sets on a service.
type ServiceSpec struct {
	Owner        string       `json:"owner"`
	Capabilities []Capability `json:"capabilities"`
}

var labelRE = regexp.MustCompile(`^[a-z]([a-z0-9-]{0,61}[a-z0-9])?$`)

// ValidName reports whether s is a DNS label (RFC 1123, lower case,
// starting with a letter): the rule for service, team and dependency names.
func ValidName(s string) bool { return labelRE.MatchString(s) }

func validateService(name string, spec *ServiceSpec) []FieldError {
	var fe []FieldError
	if !ValidName(name) {
		fe = append(fe, FieldError{Field: "name", Message: "must be a DNS label: 1-63 characters of a-z, 0-9 and '-', starting with a letter and not ending with '-'"})
	}
	if !ValidName(spec.Owner) {
		fe = append(fe, FieldError{Field: "owner", Message: "must name the owning team as a DNS label"})
	}
	seen := map[Capability]bool{}
	for i, c := range spec.Capabilities {
		switch {
		case !slices.Contains(allCapabilities, c):
			fe = append(fe, FieldError{Field: fmt.Sprintf("capabilities[%d]", i), Message: fmt.Sprintf("unknown capability %q: want probe, self, passive or readiness", c)})
		case seen[c]:
			fe = append(fe, FieldError{Field: fmt.Sprintf("capabilities[%d]", i), Message: fmt.Sprintf("capability %q listed twice", c)})
		}
		seen[c] = true
	}
	if spec.Capabilities == nil {
		spec.Capabilities = []Capability{}
	}
	slices.Sort(spec.Capabilities)
	return fe
}

// PutService creates the service or updates its owner and capabilities.
// Creating needs the named team's operator role or admin; updating needs the
// current owner's operator role or admin; moving a service to another team
// needs admin. Capabilities cannot be narrowed below what the current
// contract uses. It reports whether the service was created.
func (r *Registry) PutService(ctx context.Context, actor identity.Principal, name string, spec ServiceSpec) (Service, bool, error) {
	const action = "service.put"
	if fe := validateService(name, &spec); len(fe) > 0 {
		return Service{}, false, r.refuse(ctx, actor, action, "service", name, spec, invalid("the service is not valid", fe))
	}
	var (
		out     Service
		created bool
	)
	err := r.write(ctx, actor, action, "service", name, spec, func(q *db.Queries) (*refusal.Error, error) {
		now := r.now()
		cur, err := q.ServiceGetForUpdate(ctx, name)
		if notFound(err) {
			if !CanManage(actor, spec.Owner) {
				return newRefusal(ErrForbidden, "creating service %s for team %s needs that team's operator role or admin; %s has neither", name, spec.Owner, actor), nil
			}
			row, err := q.ServiceInsert(ctx, db.ServiceInsertParams{Name: name, Owner: spec.Owner, Capabilities: capStrings(spec.Capabilities), Now: now})
			if err != nil {
				return nil, fmt.Errorf("create service %s: %w", name, err)
			}
			if row, err = sealService(ctx, q, r.cfg.Sealer, row); err != nil {
				return nil, err
			}
			out, created = serviceFromRow(row), true
			_, err = audit.Append(ctx, q, now, accepted(actor, action, "service", name, nil, out))
			return nil, err
		}
		if err != nil {
			return nil, fmt.Errorf("read service %s: %w", name, err)
		}
		// The owner as muster last sealed it: one changed by hand gives
		// its team nothing (authzseal.go).
		before := r.service(cur)
		switch {
		case !CanManage(actor, before.Owner):
			return newRefusal(ErrForbidden, "changing service %s needs the %s team's operator role or admin; %s has neither", name, before.Owner, actor), nil
		case spec.Owner != before.Owner && !actor.IsAdmin():
			return newRefusal(ErrForbidden, "moving service %s from team %s to %s needs admin", name, before.Owner, spec.Owner), nil
		}
		if c, err := r.contract(ctx, q, name); err == nil {
			narrowed := before
			narrowed.Capabilities = spec.Capabilities
			if fe := ValidateContract(c.Contract, narrowed); len(fe) > 0 {
				return &refusal.Error{Kind: ErrConflict, Detail: fmt.Sprintf("the health contract of %s uses evidence these capabilities leave out; change the contract first", name), Fields: fe}, nil
			}
		} else if !isNotFound(err) {
			return nil, err
		}
		row, err := q.ServiceUpdate(ctx, db.ServiceUpdateParams{Name: name, Owner: spec.Owner, Capabilities: capStrings(spec.Capabilities), Now: now})
		if err != nil {
			return nil, fmt.Errorf("update service %s: %w", name, err)
		}
		if row, err = sealService(ctx, q, r.cfg.Sealer, row); err != nil {
			return nil, err
		}
		out = serviceFromRow(row)
		_, err = audit.Append(ctx, q, now, accepted(actor, action, "service", name, before, out))
		return nil, err
	})
	if err != nil {
		return Service{}, false, err
	}
	if c := r.authz.Load(); c != nil {
		c.putService(out.Name, out.Owner, r.cfg.Sealer != nil || len(r.trust.Keys()) == 0)
	}
	return out, created, nil
}

// GetService returns one service.
func (r *Registry) GetService(ctx context.Context, actor identity.Principal, name string) (Service, error) {
	if !canReadService(actor, name) {
		return Service{}, newRefusal(ErrForbidden, "%s may not read service %s", actor, name)
	}
	row, err := db.New(r.cfg.Pool).ServiceGet(ctx, name)
	if notFound(err) {
		return Service{}, newRefusal(ErrNotFound, "no service named %s", name)
	}
	if err != nil {
		return Service{}, fmt.Errorf("read service %s: %w", name, err)
	}
	return r.service(row), nil
}

// ServiceFilter narrows ListServices.
type ServiceFilter struct {
	Owner string
}

// ListServices returns services ordered by name, after page.After.
func (r *Registry) ListServices(ctx context.Context, actor identity.Principal, f ServiceFilter, page Page) ([]Service, error) {
	if !CanReadEstate(actor) {
		return nil, newRefusal(ErrForbidden, "%s may not list the registry: workloads resolve only the services granted to them", actor)
	}
	var owner *string
	if f.Owner != "" {
		owner = &f.Owner
	}
	rows, err := db.New(r.cfg.Pool).ServiceList(ctx, db.ServiceListParams{After: page.After, Owner: owner, Lim: page.limit()})
	if err != nil {
		return nil, fmt.Errorf("list services: %w", err)
	}
	out := make([]Service, len(rows))
	for i, row := range rows {
		out[i] = r.service(row)
	}
	return out, nil
}

func serviceFromRow(row db.Service) Service {
	caps := make([]Capability, len(row.Capabilities))
	for i, c := range row.Capabilities {
		caps[i] = Capability(c)
	}
	return Service{Name: row.Name, Owner: row.Owner, Capabilities: caps, CreatedAt: row.CreatedAt, UpdatedAt: row.UpdatedAt}
}

func capStrings(cs []Capability) []string {
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = string(c)
	}
	return out
}

// ServiceExists reports whether a service is registered. It checks no
// authority: callers authorise first (MayResolve) and then learn whether
// what they may see exists.
func (r *Registry) ServiceExists(ctx context.Context, name string) (bool, error) {
	_, err := db.New(r.cfg.Pool).ServiceGet(ctx, name)
	switch {
	case notFound(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("read service %s: %w", name, err)
	}
	return true, nil
}

// ReadService returns a service, read with q (the caller's transaction);
// found is false when there is no such service. Its owner is the row's,
// sealed or not: decisions about authority use Registry.ReadService.
func ReadService(ctx context.Context, q *db.Queries, name string) (svc Service, found bool, err error) {
	row, err := q.ServiceGet(ctx, name)
	if notFound(err) {
		return Service{}, false, nil
	}
	if err != nil {
		return Service{}, false, fmt.Errorf("read service %s: %w", name, err)
	}
	return serviceFromRow(row), true, nil
}

// ReadService is the package's ReadService with the owner every authority
// decision uses (ownerOf): the sealed one, never one changed by hand.
func (r *Registry) ReadService(ctx context.Context, q *db.Queries, name string) (svc Service, found bool, err error) {
	row, err := q.ServiceGet(ctx, name)
	if notFound(err) {
		return Service{}, false, nil
	}
	if err != nil {
		return Service{}, false, fmt.Errorf("read service %s: %w", name, err)
	}
	return r.service(row), true, nil
}
