package policy

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/google/uuid"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/evaluator"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/refusal"
	"github.com/musterhq/muster/internal/registry"
)

// DeregisterRequest is the optional body of DELETE /v1/instances/{id}. The
// instance deregistering itself needs none; anyone else must justify it.
type DeregisterRequest struct {
	Justification string `json:"justification"`
}

// Deregistration is what Deregister did.
type Deregistration struct {
	// Self: the instance deregistered itself (a graceful shutdown), which
	// is immediate.
	Self bool
	// Instance is the instance after the call: ended (or ended already).
	Instance registry.Instance
	// Override is the deregistration an operator's call was admitted as
	// (action deregister, state applied); nil for Self, and for an
	// instance that had already ended.
	Override *Override

	quota *Decision
}

// Quota is the caller's rate limit after the call, for the RateLimit-*
// headers; there is none when the instance deregistered itself.
func (d Deregistration) Quota() (Decision, bool) {
	if d.quota == nil {
		return Decision{}, false
	}
	return *d.quota, true
}

// errHidden marks a refusal to a caller that may not see the instance's
// service: audited with its reason, answered as not found.
var errHidden = refusal.Forbidden.Sub("hidden", "forbidden")

// Deregister ends an instance. The instance itself (a workload of its
// service calling from the address it registered, or whose token vouches
// for that address: the proof Register asks) is let through at once, as
// a graceful shutdown must be, and audited as instance.deregister as the
// registry always did. Anyone else's deregistration removes capacity as
// mark_ineligible does, for good, so it is an override (ADR-15)
// and goes through Create's checks in Create's order: authorisation (the
// owning team's operator role or admin: a sibling workload is refused),
// the per-actor per-service rate limit (shared with overrides), a
// justification, and the disruption budget counted as for
// mark_ineligible. Within budget the instance is ended and the decision
// kept as an override in state applied; a budget refusal is stored as
// pending_cosign for a second identity to co-sign (Cosign, which then
// ends the instance), and the last instance in rotation in the region is
// never removed this way. Every attempt is audited as instance.deregister
// with the deciding check and its figures. A caller that may not read the
// service is answered as if the instance did not exist (audited all the
// same).
//
// An instance with a credential (registry/credential.go) is
// itself only when the caller also presents that credential: on one host
// every instance of a service shares the address, so the address proves a
// host, not an instance, and a sibling there is anyone else.
//
// source is the request's TCP peer address (never a forwarded header);
// cred the instance credential the caller presented, if any.
func (s *Service) Deregister(ctx context.Context, actor identity.Principal, source netip.Addr, cred registry.Credential, id uuid.UUID, req DeregisterRequest) (Deregistration, error) {
	asked := map[string]any{"instance_id": id}
	if req.Justification != "" {
		asked["justification"] = clip(req.Justification, MaxJustificationLength)
	}
	if source.IsValid() {
		asked["source"] = source.Unmap().String()
	}
	a := &attempt{actor: actor, action: "instance.deregister", target: id.String(), asked: asked}
	var out Deregistration
	err := s.run(ctx, a, func(q *db.Queries, now time.Time) (*refusal.Error, error) {
		cur, err := registry.LockInstance(ctx, q, id)
		if errors.Is(err, registry.ErrNotFound) {
			return refusal.New(ErrNotFound, CheckInstance, "no instance %s", id), nil
		}
		if err != nil {
			return nil, err
		}
		out.Instance = cur
		if !registry.CanReadService(actor, cur.Service) {
			return refusal.New(errHidden, CheckAuthorization, "%s may not see instances of %s; answered as not found", actor, cur.Service), nil
		}
		a.passed = append(a.passed, CheckInstance)
		if isSelf(actor, source, cred, cur) {
			out.Self = true
			return nil, s.deregisterSelf(ctx, q, now, actor, &out)
		}
		e, err := s.deregisterOther(ctx, q, now, a, actor, source, cred, req, &out)
		out.quota = a.rate
		return e, err
	})
	if errors.Is(err, errHidden) {
		return Deregistration{}, refusal.New(ErrNotFound, CheckInstance, "no instance %s", id)
	}
	if err != nil {
		return Deregistration{}, err
	}
	if out.Self || out.Override != nil {
		s.changed(ctx)
	}
	return out, nil
}

// isSelf reports whether actor is the instance cur itself: a workload of
// its service proved to hold its address and, when cur has a credential,
// presenting it.
func isSelf(actor identity.Principal, source netip.Addr, cred registry.Credential, cur registry.Instance) bool {
	if actor.Kind != identity.KindWorkload || actor.Service != cur.Service {
		return false
	}
	addr, err := netip.ParseAddr(cur.Address)
	if err != nil || !registry.HoldsAddress(actor, addr, source) {
		return false
	}
	switch cur.CredentialHash().Check(cred) {
	case registry.CredentialNotNeeded, registry.CredentialMatches:
		return true
	}
	return false
}

// deregisterSelf is the graceful shutdown: no checks beyond identity and
// address, audited as the registry audits it; an instance that has
// already ended is left alone and nothing is audited.
func (s *Service) deregisterSelf(ctx context.Context, q *db.Queries, now time.Time, actor identity.Principal, out *Deregistration) error {
	cur := out.Instance
	if cur.State != registry.StateActive {
		return nil
	}
	ended, err := registry.EndInstance(ctx, q, s.cfg.Sealer, cur.ID, now)
	if err != nil {
		return err
	}
	out.Instance = ended
	_, err = audit.Append(ctx, q, now, audit.Entry{
		ActorKind: actorKind(actor), Actor: actor.String(), Action: "instance.deregister",
		TargetKind: "instance", Target: cur.ID.String(), Outcome: audit.Accepted,
		Before: cur, After: ended,
	})
	return err
}

// deregisterOther runs Create's checks on a deregistration by someone
// other than the instance.
func (s *Service) deregisterOther(ctx context.Context, q *db.Queries, now time.Time, a *attempt, actor identity.Principal,
	source netip.Addr, cred registry.Credential, req DeregisterRequest, out *Deregistration) (*refusal.Error, error) {
	cur := out.Instance
	svc, err := s.readService(ctx, q, cur.Service)
	if err != nil {
		return nil, err
	}
	if !mayOverride(actor, svc.Owner) {
		if actor.Kind == identity.KindWorkload && actor.Service == cur.Service {
			if addr, err := netip.ParseAddr(cur.Address); err == nil && registry.HoldsAddress(actor, addr, source) {
				// The instance's host, but not the instance: a sibling, or
				// the instance without its credential.
				what := "presented none"
				if cur.CredentialHash().Check(cred) == registry.CredentialWrong {
					what = "presented another instance's"
				}
				return refusal.New(ErrForbidden, CheckAuthorization,
					"%s may deregister only its own instance; instance %s (%s:%d) was registered with an instance credential and the request %s, so it is another instance on the same host. An instance deregisters itself with the credential its registration returned, in the %s header; deregistering another instance of %s is an override: it needs the %s team's operator role or admin",
					actor, cur.ID, cur.Address, cur.Port, what, registry.CredentialHeader, cur.Service, svc.Owner), nil
			}
		}
		if actor.Kind == identity.KindWorkload {
			return refusal.New(ErrForbidden, CheckAuthorization,
				"%s may deregister only its own instance (from the address it registered, or one its token vouches for); instance %s is %s:%d and the request came from %s. Deregistering another instance of %s is an override: it needs the %s team's operator role or admin",
				actor, cur.ID, cur.Address, cur.Port, sourceWords(source), cur.Service, svc.Owner), nil
		}
		return refusal.New(ErrForbidden, CheckAuthorization,
			"deregistering instance %s of %s needs the instance itself, the %s team's operator role or admin; %s has none of these",
			cur.ID, cur.Service, svc.Owner, actor), nil
	}
	a.passed = append(a.passed, CheckAuthorization)
	if e, err := s.limit(ctx, q, now, a, "override:"+cur.Service); e != nil || err != nil {
		return e, err
	}
	if e := checkJustification("justification", req.Justification); e != nil {
		return e, nil
	}
	a.passed = append(a.passed, CheckJustification)
	if cur.State != registry.StateActive {
		// DELETE is idempotent: nothing to remove, nothing spent; the
		// attempt is on record all the same.
		a.passed = append(a.passed, CheckState)
		d := decision{Check: CheckState, Passed: a.passed, Request: a.asked, Instance: cur}
		_, err := audit.Append(ctx, q, now, audit.Entry{
			ActorKind: actorKind(actor), Actor: actor.String(), Action: a.action,
			TargetKind: "instance", Target: cur.ID.String(), Outcome: audit.Accepted,
			Reason: fmt.Sprintf("instance %s had already ended (%s); nothing changed", cur.ID, cur.State), After: d,
		})
		return nil, err
	}
	if err := q.OverrideServiceLock(ctx, cur.Service); err != nil {
		return nil, fmt.Errorf("lock overrides of %s: %w", cur.Service, err)
	}
	inForce, err := s.inForce(ctx, q, cur.Service, now)
	if err != nil {
		return nil, fmt.Errorf("list overrides of %s: %w", cur.Service, err)
	}
	a.passed = append(a.passed, CheckState)
	oid, err := uuid.NewV7()
	if err != nil {
		return nil, fmt.Errorf("new override id: %w", err)
	}
	a.overrideID = oid
	// expires_at holds the co-sign deadline: the table wants one, and a
	// deregistration never expires once applied.
	row := db.OverrideInsertParams{
		ID: oid, InstanceID: cur.ID, Service: cur.Service, Zone: cur.Zone, Action: string(Deregister),
		State: string(StateApplied), Actor: actor.String(), Justification: req.Justification,
		CreatedAt: now, ExpiresAt: now.Add(s.cfg.CosignWindow), EndedAt: &now,
	}
	if e, err := s.withinBudget(ctx, q, now, a, row, inForce, "deregistration", "deregister it"); e != nil || err != nil {
		return e, err
	}
	ended, err := registry.EndInstance(ctx, q, s.cfg.Sealer, cur.ID, now)
	if err != nil {
		return nil, err
	}
	a.ended, out.Instance = &ended, ended
	stored, err := q.OverrideInsert(ctx, row)
	if err != nil {
		return nil, fmt.Errorf("store deregistration: %w", err)
	}
	o := fromRow(stored, now)
	o.quota = a.rate
	out.Override = &o
	return nil, a.accept(ctx, q, now, CheckBudget, "", cur, o)
}

func sourceWords(source netip.Addr) string {
	if !source.IsValid() {
		return "an unknown address"
	}
	return source.Unmap().String()
}

// MayReplace is registry.ReplaceGate: a reconciled endpoint at a live
// instance's address and port ends that instance only within the
// disruption budget an operator's deregistration needs,
// counted the same way, under the same per-service lock, on the
// evaluator's snapshot with the overrides in force. There is no co-signer
// for reconciliation: over budget, the instance stays and the reconciled
// endpoint waits (registry.ApplyReconcile skips it and audits the
// refusal), as does one whose service the evaluator has not loaded yet.
func (s *Service) MayReplace(ctx context.Context, q *db.Queries, now time.Time, victim registry.Instance) (string, map[string]any, error) {
	if err := q.OverrideServiceLock(ctx, victim.Service); err != nil {
		return "", nil, fmt.Errorf("lock overrides of %s: %w", victim.Service, err)
	}
	inForce, err := s.inForce(ctx, q, victim.Service, now)
	if err != nil {
		return "", nil, fmt.Errorf("list overrides of %s: %w", victim.Service, err)
	}
	b, err := s.budget(ctx, q, victim.Service, victim.Zone, victim.ID, inForce)
	if errors.Is(err, evaluator.ErrNotReady) {
		return "the evaluator has not loaded " + victim.Service + " yet, so its budget cannot be counted", nil, nil
	}
	if err != nil {
		return "", nil, err
	}
	if e := b.refusal(); e != nil {
		return e.Detail, b.figures(), nil
	}
	return "", b.figures(), nil
}
