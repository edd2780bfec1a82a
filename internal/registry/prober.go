package registry

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/refusal"
)

// ProberAssignments says which instances a prober may report about (ADR-15):
// every instance of the listed services, and the listed instances.
type ProberAssignments struct {
	Prober    string      `json:"prober"`
	Services  []string    `json:"services"`
	Instances []uuid.UUID `json:"instances"`
}

// MaxProberAssignments bounds one prober's assignment list.
const MaxProberAssignments = 10000

// PutProberAssignments replaces a prober's assignments. Admin only: a wrong
// assignment lets a prober report on instances it should not (or makes
// legitimate reports be refused), so it is a privileged, audited change.
func (r *Registry) PutProberAssignments(ctx context.Context, actor identity.Principal, prober string, a ProberAssignments) (ProberAssignments, error) {
	const action = "prober.assign"
	a.Prober = prober
	if a.Services == nil {
		a.Services = []string{}
	}
	if a.Instances == nil {
		a.Instances = []uuid.UUID{}
	}
	if !actor.IsAdmin() {
		return ProberAssignments{}, r.refuse(ctx, actor, action, "prober", prober, a,
			newRefusal(ErrForbidden, "assigning probe targets needs admin; %s is not", actor))
	}
	var fe []FieldError
	if prober == "" || len(prober) > 255 {
		fe = append(fe, FieldError{Field: "prober", Message: "must be the prober's token subject, 1-255 characters"})
	}
	if n := len(a.Services) + len(a.Instances); n > MaxProberAssignments {
		fe = append(fe, FieldError{Field: "services", Message: fmt.Sprintf("at most %d assignments, got %d", MaxProberAssignments, n)})
	}
	slices.Sort(a.Services)
	a.Services = slices.Compact(a.Services)
	slices.SortFunc(a.Instances, func(x, y uuid.UUID) int { return slices.Compare(x[:], y[:]) })
	a.Instances = slices.Compact(a.Instances)
	if len(fe) > 0 {
		return ProberAssignments{}, r.refuse(ctx, actor, action, "prober", prober, a, invalid("the assignments are not valid", fe))
	}
	err := r.write(ctx, actor, action, "prober", prober, a, func(q *db.Queries) (*refusal.Error, error) {
		for i, s := range a.Services {
			if _, err := q.ServiceGet(ctx, s); notFound(err) {
				fe = append(fe, FieldError{Field: fmt.Sprintf("services[%d]", i), Message: fmt.Sprintf("no service named %q", s)})
			} else if err != nil {
				return nil, fmt.Errorf("read service %s: %w", s, err)
			}
		}
		for i, id := range a.Instances {
			if _, err := q.InstanceGet(ctx, id); notFound(err) {
				fe = append(fe, FieldError{Field: fmt.Sprintf("instances[%d]", i), Message: fmt.Sprintf("no instance %s", id)})
			} else if err != nil {
				return nil, fmt.Errorf("read instance %s: %w", id, err)
			}
		}
		if len(fe) > 0 {
			return invalid("the assignments name things that do not exist", fe), nil
		}
		before, err := proberAssignments(ctx, q, prober)
		if err != nil {
			return nil, err
		}
		now := r.now()
		if err := q.ProberAssignmentsDelete(ctx, prober); err != nil {
			return nil, fmt.Errorf("clear assignments of %s: %w", prober, err)
		}
		for _, s := range a.Services {
			if err := q.ProberAssignmentInsertService(ctx, db.ProberAssignmentInsertServiceParams{Prober: prober, Service: &s, Now: now, AssignedBy: actor.String()}); err != nil {
				return nil, fmt.Errorf("assign %s to %s: %w", s, prober, err)
			}
		}
		for _, id := range a.Instances {
			if err := q.ProberAssignmentInsertInstance(ctx, db.ProberAssignmentInsertInstanceParams{Prober: prober, InstanceID: &id, Now: now, AssignedBy: actor.String()}); err != nil {
				return nil, fmt.Errorf("assign %s to %s: %w", id, prober, err)
			}
		}
		_, err = audit.Append(ctx, q, now, accepted(actor, action, "prober", prober, before, a))
		return nil, err
	})
	if err != nil {
		return ProberAssignments{}, err
	}
	if f := r.following(); f != nil {
		f.ProberAssigned(a)
	}
	return a, nil
}

// GetProberAssignments returns a prober's assignments, to estate readers and
// to the prober itself.
func (r *Registry) GetProberAssignments(ctx context.Context, actor identity.Principal, prober string) (ProberAssignments, error) {
	if !CanReadEstate(actor) && (actor.Kind != identity.KindProber || actor.Subject != prober) {
		return ProberAssignments{}, newRefusal(ErrForbidden, "%s may not read the assignments of prober %s", actor, prober)
	}
	return proberAssignments(ctx, db.New(r.cfg.Pool), prober)
}

// AllProberAssignments returns every prober's assignments, for the evaluator.
func (r *Registry) AllProberAssignments(ctx context.Context) ([]ProberAssignments, error) {
	rows, err := db.New(r.cfg.Pool).ProberAssignmentsAll(ctx)
	if err != nil {
		return nil, fmt.Errorf("list prober assignments: %w", err)
	}
	var out []ProberAssignments
	for _, row := range rows {
		if len(out) == 0 || out[len(out)-1].Prober != row.Prober {
			out = append(out, ProberAssignments{Prober: row.Prober, Services: []string{}, Instances: []uuid.UUID{}})
		}
		addAssignment(&out[len(out)-1], row)
	}
	return out, nil
}

func proberAssignments(ctx context.Context, q *db.Queries, prober string) (ProberAssignments, error) {
	rows, err := q.ProberAssignmentsGet(ctx, prober)
	if err != nil {
		return ProberAssignments{}, fmt.Errorf("read assignments of %s: %w", prober, err)
	}
	a := ProberAssignments{Prober: prober, Services: []string{}, Instances: []uuid.UUID{}}
	for _, row := range rows {
		addAssignment(&a, row)
	}
	return a, nil
}

func addAssignment(a *ProberAssignments, row db.ProberAssignment) {
	if row.Service != nil {
		a.Services = append(a.Services, *row.Service)
	}
	if row.InstanceID != nil {
		a.Instances = append(a.Instances, *row.InstanceID)
	}
}

// ServiceContract is a service with the contract in force for it (the
// platform defaults when none was set).
type ServiceContract struct {
	Service         Service
	Contract        Contract
	ContractVersion int64
	// SealErr is why the stored contract's seal does not verify (it was
	// written outside muster): Contract and ContractVersion are then the
	// platform defaults, and a reader that applied an earlier contract
	// keeps that one instead (registry/seal.go).
	SealErr error
}

// ServiceContracts returns every service with its contract, for the
// evaluator.
func (r *Registry) ServiceContracts(ctx context.Context) ([]ServiceContract, error) {
	rows, err := db.New(r.cfg.Pool).ServiceContractsAll(ctx)
	if err != nil {
		return nil, fmt.Errorf("list services and contracts: %w", err)
	}
	r.contractSeals.Next() // a full read: what it does not meet is forgotten
	return r.serviceContractsFromRows(rows)
}

// ServiceContractsNamed returns the named services with their contracts,
// for the evaluator meeting a service first through one of its instances.
// Names with no service are left out.
func (r *Registry) ServiceContractsNamed(ctx context.Context, names []string) ([]ServiceContract, error) {
	rows, err := db.New(r.cfg.Pool).ServiceContractsByName(ctx, names)
	if err != nil {
		return nil, fmt.Errorf("read services and contracts of %v: %w", names, err)
	}
	all := make([]db.ServiceContractsAllRow, len(rows))
	for i, row := range rows {
		all[i] = db.ServiceContractsAllRow(row)
	}
	return r.serviceContractsFromRows(all)
}

func (r *Registry) serviceContractsFromRows(rows []db.ServiceContractsAllRow) ([]ServiceContract, error) {
	out := make([]ServiceContract, 0, len(rows))
	for _, row := range rows {
		svc := serviceFromRow(db.Service{Name: row.Name, Owner: row.Owner, Capabilities: row.Capabilities, UpdatedAt: row.ServiceUpdatedAt})
		sc := ServiceContract{Service: svc, Contract: DefaultContract()}
		if row.ContractVersion != nil {
			hc := db.HealthContract{Service: row.Name, Version: *row.ContractVersion, Document: row.Contract,
				Seal: row.ContractSeal, SealKey: row.ContractSealKey}
			if row.ContractUpdatedAt != nil {
				hc.UpdatedAt = *row.ContractUpdatedAt
			}
			if row.ContractUpdatedBy != nil {
				hc.UpdatedBy = *row.ContractUpdatedBy
			}
			if sc.SealErr = r.verifyContract(hc); sc.SealErr == nil {
				stored, err := contractFromRow(hc)
				if err != nil {
					return nil, err
				}
				sc.Contract, sc.ContractVersion = stored.Contract, stored.Version
			}
		}
		sc.Contract.normalize(svc)
		out = append(out, sc)
	}
	return out, nil
}

// InstancesChangedSince returns up to limit instances whose row changed
// after (since, afterID), ordered by (updated_at, id), for incremental
// refresh; the zero time and uuid.Nil load everything.
func (r *Registry) InstancesChangedSince(ctx context.Context, since time.Time, afterID uuid.UUID, limit int) ([]Instance, error) {
	rows, err := db.New(r.cfg.Pool).InstanceListChangedSince(ctx, db.InstanceListChangedSinceParams{Since: since, AfterID: afterID, Lim: int32(limit)})
	if err != nil {
		return nil, fmt.Errorf("list changed instances: %w", err)
	}
	out := make([]Instance, len(rows))
	for i, row := range rows {
		out[i] = instanceFromRow(row)
	}
	return out, nil
}

// InstancesByID returns the instances among ids, in any state and in no
// particular order; ids with no instance are left out. It checks no
// authority: the evaluator looks up the ids reports name before
// attributing them.
func (r *Registry) InstancesByID(ctx context.Context, ids []uuid.UUID) ([]Instance, error) {
	rows, err := db.New(r.cfg.Pool).InstanceListByIDs(ctx, ids)
	if err != nil {
		return nil, fmt.Errorf("look up %d instances: %w", len(ids), err)
	}
	out := make([]Instance, len(rows))
	for i, row := range rows {
		out[i] = instanceFromRow(row)
	}
	return out, nil
}
