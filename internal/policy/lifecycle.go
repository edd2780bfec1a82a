package policy

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/refusal"
	"github.com/musterhq/muster/internal/registry"
)

// Cosign applies an override the budget refused, on the word of a second
// identity with the same authority (ADR-15's second authoriser). The
// co-signer passes authorisation, must not be the actor who asked, passes
// its own rate limit and justification, and must co-sign before the
// window closes. The last-instance rule still holds. Both identities and
// both justifications are audited. A co-signed deregistration ends the
// instance in the same transaction and is then applied.
func (s *Service) Cosign(ctx context.Context, actor identity.Principal, id uuid.UUID, req CosignRequest) (Override, error) {
	req.Justification = clip(req.Justification, MaxJustificationLength+1)
	a := &attempt{actor: actor, action: "override.cosign", target: id.String(), asked: req}
	var out Override
	err := s.run(ctx, a, func(q *db.Queries, now time.Time) (*refusal.Error, error) {
		row, svc, e, err := s.load(ctx, q, a, id)
		if e != nil || err != nil {
			return e, err
		}
		a.target = row.InstanceID.String()
		a.asked = map[string]any{"override_id": id, "justification": clip(req.Justification, MaxJustificationLength)}
		if !mayOverride(actor, svc.Owner) {
			return refusal.New(ErrForbidden, CheckAuthorization,
				"co-signing an override of %s needs the %s team's operator role or admin; %s has neither", row.Service, svc.Owner, actor), nil
		}
		a.passed = append(a.passed, CheckAuthorization)
		if actor.String() == row.Actor {
			return refusal.New(ErrSelfCosign, CheckCosign,
				"%s asked for override %s and cannot co-sign it: a co-signature must come from a second identity", actor, id), nil
		}
		a.passed = append(a.passed, CheckCosign)
		if e, err := s.limit(ctx, q, now, a, "override:"+row.Service); e != nil || err != nil {
			return e, err
		}
		if e := checkJustification("justification", req.Justification); e != nil {
			return e, nil
		}
		a.passed = append(a.passed, CheckJustification)
		cur := fromRow(row, now)
		switch {
		case cur.State == StateExpired && row.State == string(StatePending):
			return refusal.New(ErrCosignExpired, CheckState, "override %s waited for a co-signer until %s and has expired; ask again",
				id, row.CosignBy.Format(time.RFC3339)), nil
		case cur.State != StatePending:
			return refusal.New(ErrConflict, CheckState, "override %s is %s, not awaiting a co-signer", id, cur.State), nil
		}
		deregister := Action(row.Action) == Deregister
		var insState string
		if deregister {
			// Locked: it is ended below, in this transaction.
			ins, err := registry.LockInstance(ctx, q, row.InstanceID)
			if err != nil {
				return nil, err
			}
			insState = ins.State
		} else {
			ins, found, err := registry.ReadInstance(ctx, q, row.InstanceID)
			if err != nil {
				return nil, err
			}
			if !found {
				return nil, fmt.Errorf("override %s names instance %s, which the registry does not have", row.ID, row.InstanceID)
			}
			insState = ins.State
		}
		if insState != registry.StateActive {
			return refusal.New(ErrConflict, CheckState, "instance %s has ended (%s); there is nothing to override", row.InstanceID, insState), nil
		}
		if err := q.OverrideServiceLock(ctx, row.Service); err != nil {
			return nil, fmt.Errorf("lock overrides of %s: %w", row.Service, err)
		}
		inForce, err := s.inForce(ctx, q, row.Service, now)
		if err != nil {
			return nil, fmt.Errorf("list overrides of %s: %w", row.Service, err)
		}
		for _, o := range inForce {
			// An override in force does not stand in the way of ending
			// the instance.
			if o.InstanceID == row.InstanceID && !deregister {
				return refusal.New(ErrConflict, CheckState, "instance %s already has override %s in force; lift it first", o.InstanceID, o.ID), nil
			}
		}
		a.passed = append(a.passed, CheckState)
		if Action(row.Action) == MarkIneligible || deregister {
			b, err := s.budget(ctx, q, row.Service, row.Zone, row.InstanceID, inForce)
			if err != nil {
				return nil, err
			}
			a.budget = b.figures()
			if e := b.refusal(); e != nil && errors.Is(e, ErrLastInstance) {
				return e, nil
			}
			// The fraction budget is what the co-signature exceeds.
			a.passed = append(a.passed, CheckBudget)
		}
		cosigner, just := actor.String(), req.Justification
		note := fmt.Sprintf("co-signed by %s for %s, exceeding the budget: %s", cosigner, row.Actor, row.BudgetDetail)
		if deregister {
			ended, err := registry.EndInstance(ctx, q, s.cfg.Sealer, row.InstanceID, now)
			if err != nil {
				return nil, err
			}
			a.ended = &ended
			applied, err := q.OverrideCosignApply(ctx, db.OverrideCosignApplyParams{Cosigner: &cosigner, CosignJustification: &just, Now: now, ID: id})
			if err != nil {
				return nil, fmt.Errorf("apply deregistration %s: %w", id, err)
			}
			out = fromRow(applied, now)
			note = fmt.Sprintf("co-signed by %s for %s: instance %s deregistered, exceeding the budget: %s", cosigner, row.Actor, row.InstanceID, row.BudgetDetail)
		} else {
			active, err := q.OverrideActivate(ctx, db.OverrideActivateParams{Cosigner: &cosigner, CosignJustification: &just, Now: now, ID: id})
			if err != nil {
				return nil, fmt.Errorf("activate override %s: %w", id, err)
			}
			if active, err = sealRow(ctx, q, s.cfg.Sealer, active); err != nil {
				return nil, err
			}
			out = fromRow(active, now)
		}
		if err := a.accept(ctx, q, now, CheckBudget, note, cur, out); err != nil {
			return nil, err
		}
		out.quota = a.rate
		return nil, nil
	})
	if err != nil {
		return Override{}, err
	}
	s.changed(ctx)
	return out, nil
}

// Lift ends an override (active or awaiting a co-signer) before its time.
// The same authority as creating one is needed; the attempt is audited.
func (s *Service) Lift(ctx context.Context, actor identity.Principal, id uuid.UUID) (Override, error) {
	a := &attempt{actor: actor, action: "override.lift", target: id.String()}
	var out Override
	err := s.run(ctx, a, func(q *db.Queries, now time.Time) (*refusal.Error, error) {
		row, svc, e, err := s.load(ctx, q, a, id)
		if e != nil || err != nil {
			return e, err
		}
		a.target = row.InstanceID.String()
		a.asked = map[string]any{"override_id": id}
		if !mayOverride(actor, svc.Owner) {
			return refusal.New(ErrForbidden, CheckAuthorization,
				"lifting an override of %s needs the %s team's operator role or admin; %s has neither", row.Service, svc.Owner, actor), nil
		}
		a.passed = append(a.passed, CheckAuthorization)
		cur := fromRow(row, now)
		if cur.State != StateActive && cur.State != StatePending {
			return refusal.New(ErrConflict, CheckState, "override %s is already %s", id, cur.State), nil
		}
		a.passed = append(a.passed, CheckState)
		by := actor.String()
		lifted, err := q.OverrideLift(ctx, db.OverrideLiftParams{Now: now, LiftedBy: &by, ID: id})
		if err != nil {
			return nil, fmt.Errorf("lift override %s: %w", id, err)
		}
		if err := recordEnd(ctx, q, s.cfg.Sealer, lifted); err != nil {
			return nil, err
		}
		out = fromRow(lifted, now)
		return nil, a.accept(ctx, q, now, CheckState, "", cur, out)
	})
	if err != nil {
		return Override{}, err
	}
	s.changed(ctx)
	return out, nil
}

// load reads an override for update with its service.
func (s *Service) load(ctx context.Context, q *db.Queries, a *attempt, id uuid.UUID) (db.Override, registry.Service, *refusal.Error, error) {
	row, err := q.OverrideGetForUpdate(ctx, id)
	if errors.Is(err, pgx.ErrNoRows) {
		return db.Override{}, registry.Service{}, refusal.New(ErrNotFound, CheckRequest, "no override %s", id), nil
	}
	if err != nil {
		return db.Override{}, registry.Service{}, nil, fmt.Errorf("read override %s: %w", id, err)
	}
	svc, err := s.readService(ctx, q, row.Service)
	if err != nil {
		return db.Override{}, registry.Service{}, nil, err
	}
	a.passed = append(a.passed, CheckRequest)
	return row, svc, nil, nil
}

// Get returns one override, to operator and tool identities.
func (s *Service) Get(ctx context.Context, actor identity.Principal, id uuid.UUID) (Override, error) {
	if !canRead(actor) {
		return Override{}, refusal.New(ErrForbidden, CheckAuthorization, "overrides are for operator and tool identities with the viewer role or higher")
	}
	row, err := db.New(s.cfg.Pool).OverrideGet(ctx, id)
	if errors.Is(err, pgx.ErrNoRows) {
		return Override{}, refusal.New(ErrNotFound, CheckRequest, "no override %s", id)
	}
	if err != nil {
		return Override{}, fmt.Errorf("read override %s: %w", id, err)
	}
	return fromRow(row, s.now()), nil
}

// Filter narrows List; empty fields match everything.
type Filter struct {
	Service string
	// Instance is an instance id.
	Instance uuid.UUID
	// State is matched as of now (see Override).
	State State
	// Actor matches who asked or who co-signed.
	Actor string
	// Before lists overrides older than this id (uuid.Nil: the newest).
	Before uuid.UUID
	Limit  int
}

// List returns overrides newest first.
func (s *Service) List(ctx context.Context, actor identity.Principal, f Filter) ([]Override, error) {
	if !canRead(actor) {
		return nil, refusal.New(ErrForbidden, CheckAuthorization, "overrides are for operator and tool identities with the viewer role or higher")
	}
	switch f.State {
	case "", StatePending, StateActive, StateLifted, StateExpired, StateApplied:
	default:
		e := refusal.New(ErrInvalid, CheckRequest, "state must be pending_cosign, active, lifted, expired or applied, got %q", f.State)
		e.Fields = []registry.FieldError{{Field: "state", Message: "unknown state"}}
		return nil, e
	}
	p := db.OverrideListParams{BeforeID: f.Before, Now: s.now(), Lim: int32(f.Limit)}
	if f.Service != "" {
		p.Service = &f.Service
	}
	if f.Instance != uuid.Nil {
		p.InstanceID = &f.Instance
	}
	if f.Actor != "" {
		p.Actor = &f.Actor
	}
	if f.State != "" {
		st := string(f.State)
		p.State = &st
	}
	rows, err := db.New(s.cfg.Pool).OverrideList(ctx, p)
	if err != nil {
		return nil, fmt.Errorf("list overrides: %w", err)
	}
	out := make([]Override, len(rows))
	for i, r := range rows {
		out[i] = fromRow(r, p.Now)
	}
	return out, nil
}

// Sweep writes down the expiry of overrides past their time (readers
// already treat them as expired), audits each as a system action, and
// forgets rate-limit attempts older than every window. It returns how many
// overrides it ended. Safe to run on every replica at once.
func (s *Service) Sweep(ctx context.Context) (int, error) {
	now := s.now()
	var ended []db.Override
	err := db.WithTx(ctx, s.cfg.Pool, func(q *db.Queries) error {
		rows, err := q.OverrideExpireDue(ctx, db.OverrideExpireDueParams{Now: now, Lim: 1000})
		if err != nil {
			return fmt.Errorf("expire overrides: %w", err)
		}
		for _, r := range rows {
			o := fromRow(r, now)
			_, err := audit.Append(ctx, q, now, audit.Entry{
				ActorKind: "system", Actor: "system:policy", Action: "override.expire",
				TargetKind: "instance", Target: r.InstanceID.String(), Outcome: audit.Accepted,
				Reason: fmt.Sprintf("override %s reached its expiry", r.ID), After: o,
			})
			if err != nil {
				return err
			}
			if err := recordEnd(ctx, q, s.cfg.Sealer, r); err != nil {
				return err
			}
		}
		ended = rows
		oldest := max(s.cfg.OverrideLimit.Window, s.cfg.WriteLimit.Window)
		if _, err := q.RateLimitPruneAll(ctx, now.Add(-oldest)); err != nil {
			return fmt.Errorf("prune rate-limit attempts: %w", err)
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	if len(ended) > 0 {
		s.changed(ctx)
	}
	return len(ended), nil
}

// LimitWrite takes one attempt from actor's quota for a family of policy
// writes (scope "contracts", "grants", "probers"). Every authenticated
// write attempt counts, before the registry decides on it: the limit is
// there to stop a runaway script churning the estate, whoever it speaks
// for. A refusal is audited under the write's action and returned as an
// *refusal.Error of kind ErrRateLimited; the decision is returned either way for
// the RateLimit-* headers.
func (s *Service) LimitWrite(ctx context.Context, actor identity.Principal, scope, action, targetKind, target string) (Decision, error) {
	var d Decision
	now := s.now()
	var refused *refusal.Error
	err := db.WithTx(ctx, s.cfg.Pool, func(q *db.Queries) error {
		var err error
		d, err = take(ctx, q, now, actor.String(), "policy:"+scope, s.cfg.WriteLimit)
		if err != nil || d.Allowed {
			return err
		}
		refused = refusal.New(ErrRateLimited, CheckRateLimit,
			"%s has made %d %s writes in the last %s, the most allowed; retry in %d s",
			actor, d.Limit.Max, scope, d.Limit.Window, d.ResetSeconds())
		refused.Quota, refused.Figures = d.Quota(), d.figures()
		_, err = audit.Append(ctx, q, now, audit.Entry{
			ActorKind: actorKind(actor), Actor: actor.String(), Action: action,
			TargetKind: targetKind, Target: target, Outcome: audit.Refused,
			Reason: CheckRateLimit + ": " + refused.Detail,
			After:  decision{Check: CheckRateLimit, Passed: []string{}, Figures: refused.Figures},
		})
		return err
	})
	if err != nil {
		return Decision{}, err
	}
	if refused != nil {
		return d, refused
	}
	return d, nil
}

// readService reads a service an override or deregistration names, in
// the caller's transaction. Its instance exists, so the service does.
func (s *Service) readService(ctx context.Context, q *db.Queries, name string) (registry.Service, error) {
	read := registry.ReadService
	if s.cfg.Services != nil {
		read = s.cfg.Services.ReadService
	}
	svc, found, err := read(ctx, q, name)
	if err != nil {
		return registry.Service{}, err
	}
	if !found {
		return registry.Service{}, fmt.Errorf("service %s is not registered", name)
	}
	return svc, nil
}
