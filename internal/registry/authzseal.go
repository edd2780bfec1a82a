package registry

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/refusal"
	"github.com/musterhq/muster/internal/seal"
)

// Service and grant seals (package seal; migration 000022).
//
// Who owns a service decides who may change its contract, its grants,
// its instances and its overrides; a service's grants decide which
// workloads may resolve it (ADR-15). Both were trusted as the database
// said, so a grant row inserted by hand showed a service's endpoints to
// anyone, and an owner changed by hand gave another team the API. Every
// write through muster (PutService, PutGrants, the adoption) now seals
// what it writes, in its own transaction:
//
//   - a service over its name, owner and capabilities;
//   - a grant over its service, caller, grant time and author, version
//     (counting the row's writes), and its revocation (time and author)
//     when it has one.
//
// A revocation is a sealed tombstone (revoked_at), never a missing row.
// Every authorisation decision uses only rows whose seal verifies: the
// copy (AuthzCache) ignores a grant that does not verify and keeps what
// it held for that caller before; a service whose row does not verify
// keeps the owner the copy last verified, or, when no verified owner is
// known (a cold start), has no owner: only admins may change it, and its
// readers keep their access (grants are sealed on their own).

const (
	serviceDomain     = "muster service seal v1"
	grantDomain       = "muster grant seal v1"
	authzAdoptionName = "authz"
)

type sealedService struct {
	Name         string   `json:"name"`
	Owner        string   `json:"owner"`
	Capabilities []string `json:"capabilities"`
}

func serviceSealOf(row db.Service) sealedService {
	caps := row.Capabilities
	if caps == nil {
		caps = []string{}
	}
	return sealedService{Name: row.Name, Owner: row.Owner, Capabilities: caps}
}

type sealedGrant struct {
	Service   string `json:"service"`
	Caller    string `json:"caller"`
	GrantedAt int64  `json:"granted_at"` // microseconds since the epoch, as stored
	GrantedBy string `json:"granted_by"`
	Version   int64  `json:"version"`
	RevokedAt int64  `json:"revoked_at,omitempty"`
	RevokedBy string `json:"revoked_by,omitempty"`
}

func grantSealOf(row db.ServiceGrant) sealedGrant {
	g := sealedGrant{Service: row.Service, Caller: row.Caller, GrantedAt: row.GrantedAt.UnixMicro(), GrantedBy: row.GrantedBy, Version: row.Version}
	if row.RevokedAt != nil {
		g.RevokedAt = row.RevokedAt.UnixMicro()
	}
	if row.RevokedBy != nil {
		g.RevokedBy = *row.RevokedBy
	}
	return g
}

// sealService seals row as just written with q (no Sealer: unsealed).
func sealService(ctx context.Context, q *db.Queries, s seal.Signer, row db.Service) (db.Service, error) {
	return seal.Store(ctx, s, serviceDomain, "service "+row.Name, serviceSealOf(row), row, func(sig []byte, kid *string) (db.Service, error) {
		return q.ServiceSeal(ctx, db.ServiceSealParams{Name: row.Name, Seal: sig, SealKey: kid})
	})
}

// sealGrant seals row as just written with q (no Sealer: unsealed).
func sealGrant(ctx context.Context, q *db.Queries, s seal.Signer, row db.ServiceGrant) (db.ServiceGrant, error) {
	return seal.Store(ctx, s, grantDomain, "the grant of "+row.Service+" to "+row.Caller, grantSealOf(row), row, func(sig []byte, kid *string) (db.ServiceGrant, error) {
		return q.GrantSeal(ctx, db.GrantSealParams{Service: row.Service, Caller: row.Caller, Seal: sig, SealKey: kid})
	})
}

// verifyService checks a service row's seal. The copy reads every
// service on each reload, so seals are remembered (serviceSeals).
func (r *Registry) verifyService(row db.Service) error {
	return r.serviceSeals.Verify(r.trust.For(row.Seal, row.SealKey), serviceDomain, serviceSealOf(row), row.Seal, row.SealKey)
}

// verifyGrant checks a grant row's seal, remembered as verifyService's.
func (r *Registry) verifyGrant(row db.ServiceGrant) error {
	return r.grantSeals.Verify(r.trust.For(row.Seal, row.SealKey), grantDomain, grantSealOf(row), row.Seal, row.SealKey)
}

// ownerOf is the owner every authority decision about row's service
// uses: the row's own when its seal verifies, else the owner the copy
// last verified, else none ("": only admins may change the service).
func (r *Registry) ownerOf(row db.Service) string {
	if r.verifyService(row) == nil {
		return row.Owner
	}
	if c := r.authz.Load(); c != nil {
		if owner, ok := c.verifiedOwner(row.Name); ok {
			return owner
		}
	}
	return ""
}

// service converts row, with the owner ownerOf decides.
func (r *Registry) service(row db.Service) Service {
	svc := serviceFromRow(row)
	svc.Owner = r.ownerOf(row)
	return svc
}

// activeGrants returns the callers of rows that verify and are not
// revoked, sorted.
func (r *Registry) activeGrants(rows []db.ServiceGrant) []string {
	out := []string{}
	for _, row := range rows {
		if row.RevokedAt == nil && r.verifyGrant(row) == nil {
			out = append(out, row.Caller)
		}
	}
	slices.Sort(out)
	return out
}

// adoptAuthz seals, once per database, every service and grant row from
// before their seals, as it stands (trust on first use), and records the
// adoption (seal_adoptions 'authz', and an accepted registry.seal_adopt
// audit row when there was any row). A database in which some service or
// grant is sealed already, with no record, had its record deleted by
// hand: nothing is adopted, and the refusal is audited. Without a Sealer
// it does nothing.
func (r *Registry) adoptAuthz(ctx context.Context) (adopted int, err error) {
	s := r.cfg.Sealer
	if s == nil {
		return 0, nil
	}
	refused := false
	err = db.WithTx(ctx, r.cfg.Pool, func(q *db.Queries) error {
		if err := q.SealAdoptionLock(ctx, authzAdoptionName); err != nil {
			return fmt.Errorf("lock the seal adoption: %w", err)
		}
		if _, err := q.SealAdoptionGet(ctx, authzAdoptionName); err == nil {
			return nil
		} else if !notFound(err) {
			return fmt.Errorf("read the seal adoption: %w", err)
		}
		anyService, err := q.ServiceAnySealed(ctx)
		if err != nil {
			return fmt.Errorf("look for sealed services: %w", err)
		}
		anyGrant, err := q.GrantAnySealed(ctx)
		if err != nil {
			return fmt.Errorf("look for sealed grants: %w", err)
		}
		if anyService || anyGrant {
			refused = true
			return nil
		}
		services, err := q.ServiceListUnsealed(ctx)
		if err != nil {
			return fmt.Errorf("list unsealed services: %w", err)
		}
		grants, err := q.GrantListUnsealed(ctx)
		if err != nil {
			return fmt.Errorf("list unsealed grants: %w", err)
		}
		for _, row := range services {
			if _, err := sealService(ctx, q, s, row); err != nil {
				return err
			}
		}
		for _, row := range grants {
			if _, err := sealGrant(ctx, q, s, row); err != nil {
				return err
			}
		}
		now := r.now()
		adopted = len(services) + len(grants)
		if err := q.SealAdoptionInsert(ctx, db.SealAdoptionInsertParams{Name: authzAdoptionName, KeyID: s.KeyID(), Rows: int64(adopted), At: now}); err != nil {
			return fmt.Errorf("record the seal adoption: %w", err)
		}
		if adopted == 0 {
			return nil
		}
		_, err = audit.Append(ctx, q, now, audit.Entry{
			ActorKind: "system", Actor: "system:registry", Action: "registry.seal_adopt",
			TargetKind: "table", Target: authzAdoptionName, Outcome: audit.Accepted,
			Reason: fmt.Sprintf("sealed %d services and %d grants from before the seals with key %s (trust on first use); from now on an unsealed grant shows its service to nobody, and an owner changed outside muster gives its team no authority", len(services), len(grants), s.KeyID()),
		})
		return err
	})
	if err != nil {
		return 0, err
	}
	if refused {
		const why = "the record of the services' and grants' seal adoption is gone although some are sealed: it was deleted by hand, so no unsealed service or grant is adopted"
		r.cfg.Logger.Error(why)
		if _, err := audit.AppendAlone(ctx, r.cfg.Pool, r.now(), audit.Entry{
			ActorKind: "system", Actor: "system:registry", Action: "registry.seal_adopt",
			TargetKind: "table", Target: authzAdoptionName, Outcome: audit.Refused, Reason: why,
		}); err != nil {
			return 0, fmt.Errorf("audit the refused seal adoption: %w", err)
		}
		r.adoptedAuthz.Store(true) // seen through: refused once, not at every write
		return 0, nil
	}
	if adopted > 0 {
		r.cfg.Logger.Warn("adopted services and grants from before the seals", "rows", adopted, "key_id", s.KeyID())
	}
	r.adoptedAuthz.Store(true)
	return adopted, nil
}

// AdoptAuthzUnsealed is the adoption of services and grants from before
// their seals (see adoptAuthz); the copy runs it before its first load.
func (r *Registry) AdoptAuthzUnsealed(ctx context.Context) (int, error) { return r.adoptAuthz(ctx) }

// AuthzConfirmation is an admin's confirmation that a held reload of
// services and grants is what the database should say (see AuthzCache).
type AuthzConfirmation struct {
	ID          int64     `json:"id"`
	ConfirmedAt time.Time `json:"confirmed_at"`
	ConfirmedBy string    `json:"confirmed_by"`
	Reason      string    `json:"reason"`
}

// ConfirmAuthzReload records an admin's confirmation, releasing every
// replica's held reload of services and grants that began before it (at
// its next reload; this replica's at once). The rows gone stay in the
// copies: only a sealed revocation takes a grant away. A reason is
// required; every attempt is audited.
func (r *Registry) ConfirmAuthzReload(ctx context.Context, actor identity.Principal, reason string) (AuthzConfirmation, error) {
	const action = "authz.reload.confirm"
	target := "region:" + r.cfg.Region
	var out AuthzConfirmation
	err := r.write(ctx, actor, action, "region", target, map[string]string{"reason": reason}, func(q *db.Queries) (*refusal.Error, error) {
		if !actor.IsAdmin() {
			return newRefusal(ErrForbidden, "confirming a held reload of services and grants needs an admin; %s is not one", actor), nil
		}
		reason = strings.TrimSpace(reason)
		if reason == "" {
			return invalid("a confirmation needs a reason", []FieldError{{Field: "reason", Message: "say why the services and grants the database lost are known to be gone"}}), nil
		}
		if len(reason) > 1000 {
			return invalid("the reason is too long", []FieldError{{Field: "reason", Message: "at most 1000 characters"}}), nil
		}
		now := r.now()
		sig, kid, err := r.sealConfirmation(ctx, authzConfirmationDomain, authzConfirmationSealOf(now, actor.String(), reason))
		if err != nil {
			return nil, err
		}
		row, err := q.AuthzReloadConfirmationInsert(ctx, db.AuthzReloadConfirmationInsertParams{ConfirmedAt: now, ConfirmedBy: actor.String(), Reason: reason, Seal: sig, SealKey: kid})
		if err != nil {
			return nil, fmt.Errorf("record confirmation: %w", err)
		}
		out = AuthzConfirmation{ID: row.ID, ConfirmedAt: row.ConfirmedAt, ConfirmedBy: row.ConfirmedBy, Reason: row.Reason}
		_, err = audit.Append(ctx, q, now, audit.Entry{
			ActorKind: actorKind(actor), Actor: actor.String(), Action: action,
			TargetKind: "region", Target: target, Outcome: audit.Accepted, Reason: reason, After: out,
		})
		return nil, err
	})
	if err != nil {
		return AuthzConfirmation{}, err
	}
	if c := r.authz.Load(); c != nil {
		c.poke()
	}
	return out, nil
}
