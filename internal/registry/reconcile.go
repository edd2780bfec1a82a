package registry

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/disbelief"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/refusal"
)

// Reconciled instances (ADR-03) exist because an orchestrator or
// an inventory says so: their source is the reconciliation source's name
// ("k8s/<cluster>", "snapshot/<name>"), they have no lease (the reaper
// only ever reads instances with lease_expires_at set, so it can never
// expire one), and they end when the source stops reporting them.

// Source name prefixes of reconciled instances.
const (
	SourcePrefixKubernetes = "k8s/"
	SourcePrefixSnapshot   = "snapshot/"
)

// ErrReconciledEndpoint refuses a registration of an endpoint a
// reconciliation source already holds: instances the orchestrator knows
// exist by reconciliation, not by registration.
var ErrReconciledEndpoint = refusal.Conflict.Sub("endpoint held by a reconciled instance", "reconciled-endpoint")

// reconcileNS is the UUID namespace of reconciled instance ids.
var reconcileNS = uuid.MustParse("6b1f3c1e-5d0a-4c8e-9a51-7f2d4b9e0c19")

// ReconciledID is the id of the instance source derives for key (a pod
// UID, a snapshot's instance id) in service: a name-based (v5) UUID, so
// every replica and every restart derives the same id, and a restarted
// pod (a new UID) is a new instance.
func ReconciledID(source, service, key string) uuid.UUID {
	return uuid.NewSHA1(reconcileNS, []byte(source+"\x00"+service+"\x00"+key))
}

// IsReconciled reports whether source names a reconciliation source.
func IsReconciled(source string) bool {
	return strings.HasPrefix(source, SourcePrefixKubernetes) || strings.HasPrefix(source, SourcePrefixSnapshot)
}

// ReconcileChange is what one reconciliation pass asks of the registry.
type ReconcileChange struct {
	// Create are new instances (ID, Service, Address, Port, Zone set).
	Create []Instance
	// End are live instances of the source the source no longer reports.
	End []uuid.UUID
	// QuietRefusals are creations whose refused replacement was audited
	// by an earlier pass: refused again, they are not audited again.
	QuietRefusals map[uuid.UUID]bool
	// Fence, when set, runs first in the transaction: the tenure under
	// which the caller decided the change (fence.Fence.Check). When it
	// fails nothing is written, audit rows included.
	Fence func(ctx context.Context, q *db.Queries) error
}

// ReconcileResult is what a pass changed.
type ReconcileResult struct {
	Created, Ended, Replaced []Instance
	// Skipped are creations not made, by id, with the reason (no such
	// service; the id already ended and is never reused; the instance
	// holding its endpoint could not be ended within the budget).
	Skipped map[uuid.UUID]string
	// ReplaceRefused are the creations skipped because ending the live
	// instance at their endpoint would spend more than the disruption
	// budget allows, with the refusal.
	ReplaceRefused map[uuid.UUID]string
}

// ReplaceGate decides whether a reconciled endpoint may end the live
// instance holding its address and port: the disruption budget an
// operator's deregistration needs (policy.Service). It runs in the
// reconciliation's transaction, with victim's row locked.
type ReplaceGate interface {
	// MayReplace returns "" to let victim end, or why not; figures are
	// the budget's numbers, for the audit record.
	MayReplace(ctx context.Context, q *db.Queries, now time.Time, victim Instance) (refused string, figures map[string]any, err error)
}

type gateRef struct{ g ReplaceGate }

// GateReplacements makes g decide every replacement by reconciliation.
// Without a gate none is made: a reconciled endpoint at a live
// instance's address waits (skipped) rather than end it unchecked.
func (r *Registry) GateReplacements(g ReplaceGate) { r.replaceGate.Store(&gateRef{g}) }

// replaceAt ends the live instances holding in's endpoint, each only if
// the gate lets it (the disruption budget), and audits each as
// instance.replace. When the gate refuses one, nothing more is ended, the
// refusal is returned, and (unless quiet) audited as refused.
func (r *Registry) replaceAt(ctx context.Context, q *db.Queries, now time.Time, source string, in Instance, quiet bool) ([]Instance, string, error) {
	actor := reconcileActor(source)
	var out []Instance
	for range 16 { // at most a few live instances share an endpoint
		row, err := q.InstanceGetLiveEndpoint(ctx, db.InstanceGetLiveEndpointParams{Service: in.Service, Address: in.Address, Port: int32(in.Port)})
		if notFound(err) {
			return out, "", nil
		}
		if err != nil {
			return nil, "", fmt.Errorf("read the live instance at %s:%d: %w", in.Address, in.Port, err)
		}
		// The row first, then the gate's locks: the order an operator's
		// deregistration takes them in.
		victim, err := LockInstance(ctx, q, row.ID)
		if err != nil {
			return nil, "", fmt.Errorf("lock instance %s: %w", row.ID, err)
		}
		if victim.State != StateActive {
			continue
		}
		refused, figures := "no disruption budget is configured for reconciliation's replacements", map[string]any(nil)
		if ref := r.replaceGate.Load(); ref != nil {
			if refused, figures, err = ref.g.MayReplace(ctx, q, now, victim); err != nil {
				return nil, "", fmt.Errorf("budget of replacing %s: %w", victim.ID, err)
			}
		}
		if refused != "" {
			refused = fmt.Sprintf("%s:%d of %s is held by instance %s (source %s); ending it for %s's endpoint %s would exceed the disruption budget an operator's deregistration needs: %s",
				in.Address, in.Port, in.Service, victim.ID, victim.Source, source, in.ID, refused)
			if !quiet {
				_, err := audit.Append(ctx, q, now, audit.Entry{ActorKind: "system", Actor: actor, Action: "instance.replace",
					TargetKind: "instance", Target: victim.ID.String(), Outcome: audit.Refused, Reason: refused,
					Before: victim, After: map[string]any{"replacement": in.ID.String(), "source": source, "budget": figures}})
				if err != nil {
					return nil, "", err
				}
			}
			return out, refused, nil
		}
		ended, err := q.InstanceEnd(ctx, db.InstanceEndParams{ID: victim.ID, State: StateReplaced, Now: now})
		if err != nil {
			return nil, "", fmt.Errorf("end instance %s: %w", victim.ID, err)
		}
		if ended, err = sealEnded(ctx, q, r.cfg.Sealer, ended); err != nil {
			return nil, "", err
		}
		after := instanceFromRow(ended)
		if _, err := audit.Append(ctx, q, now, audit.Entry{ActorKind: "system", Actor: actor, Action: "instance.replace",
			TargetKind: "instance", Target: victim.ID.String(), Outcome: audit.Accepted, Before: victim,
			After: map[string]any{"instance": after, "replacement": in.ID.String(), "budget": figures}}); err != nil {
			return nil, "", err
		}
		out = append(out, after)
	}
	return out, "", fmt.Errorf("more than 16 live instances at %s:%d of %s", in.Address, in.Port, in.Service)
}

func reconcileActor(source string) string { return "reconcile:" + source }

// ReconciledInstances lists the live instances of source.
func (r *Registry) ReconciledInstances(ctx context.Context, source string) ([]Instance, error) {
	rows, err := db.New(r.cfg.Pool).ReconcileListLive(ctx, source)
	if err != nil {
		return nil, fmt.Errorf("list live instances of %s: %w", source, err)
	}
	out := make([]Instance, len(rows))
	for i, row := range rows {
		out[i] = instanceFromRow(row)
	}
	return out, nil
}

// LiveInstancesOf lists the live instances of services, whatever their
// source: the reconciliation diff compares them with the sources.
func (r *Registry) LiveInstancesOf(ctx context.Context, services []string) ([]Instance, error) {
	rows, err := db.New(r.cfg.Pool).ReconcileListLiveInServices(ctx, services)
	if err != nil {
		return nil, fmt.Errorf("list live instances of %d services: %w", len(services), err)
	}
	out := make([]Instance, len(rows))
	for i, row := range rows {
		out[i] = instanceFromRow(row)
	}
	return out, nil
}

// ApplyReconcile applies one pass of source in one transaction, auditing
// each instance added, ended, or replaced (a registered instance holding
// an endpoint the source now reports ends as replaced: the orchestrator
// is the authority). The evaluator (the follower) is told after the
// commit, as for a registration.
func (r *Registry) ApplyReconcile(ctx context.Context, source string, ch ReconcileChange) (ReconcileResult, error) {
	if !IsReconciled(source) {
		return ReconcileResult{}, fmt.Errorf("apply reconcile: %q is not a reconciliation source", source)
	}
	if err := r.beforeSealing(ctx); err != nil {
		return ReconcileResult{}, err
	}
	actor := reconcileActor(source)
	res := ReconcileResult{Skipped: map[uuid.UUID]string{}}
	entry := func(action, id string, before, after any) audit.Entry {
		return audit.Entry{ActorKind: "system", Actor: actor, Action: action, TargetKind: "instance", Target: id,
			Outcome: audit.Accepted, Before: before, After: after}
	}
	err := r.withTx(ctx, func(q *db.Queries) error {
		res = ReconcileResult{Skipped: map[uuid.UUID]string{}}
		if ch.Fence != nil {
			if err := ch.Fence(ctx, q); err != nil {
				return fmt.Errorf("apply %s: %w", source, err)
			}
		}
		// Every replica reconciles every source: the passes of one source
		// apply one at a time, and each reads what the one before wrote.
		if err := q.ReconcileSourceLock(ctx, source); err != nil {
			return fmt.Errorf("lock source %s: %w", source, err)
		}
		// Row stamps on the database's clock, as registration's.
		now, err := r.leaseNow(ctx, q)
		if err != nil {
			return err
		}
		for _, id := range ch.End {
			row, err := q.InstanceEnd(ctx, db.InstanceEndParams{ID: id, State: StateDeregistered, Now: now})
			if notFound(err) {
				continue // ended meanwhile
			}
			if err != nil {
				return fmt.Errorf("end %s: %w", id, err)
			}
			if row, err = sealEnded(ctx, q, r.cfg.Sealer, row); err != nil {
				return err
			}
			after := instanceFromRow(row)
			before := after
			before.State, before.EndedAt = StateActive, nil
			if _, err := audit.Append(ctx, q, now, entry("instance.reconcile.end", id.String(), before, after)); err != nil {
				return err
			}
			res.Ended = append(res.Ended, after)
		}
		if len(ch.Create) == 0 {
			return nil
		}
		ids := make([]uuid.UUID, len(ch.Create))
		for i, in := range ch.Create {
			ids[i] = in.ID
		}
		states, err := q.ReconcileInstanceStates(ctx, ids)
		if err != nil {
			return fmt.Errorf("read existing ids: %w", err)
		}
		exists := map[uuid.UUID]string{}
		for _, s := range states {
			exists[s.ID] = s.State
		}
		services := map[string]bool{}
		for _, in := range ch.Create {
			if st, ok := exists[in.ID]; ok {
				if st != StateActive {
					res.Skipped[in.ID] = fmt.Sprintf("instance %s has ended (%s) and an id is never reused", in.ID, st)
				}
				continue
			}
			known, asked := services[in.Service]
			if !asked {
				_, err := q.ServiceGet(ctx, in.Service)
				if err != nil && !notFound(err) {
					return fmt.Errorf("read service %s: %w", in.Service, err)
				}
				known = err == nil
				services[in.Service] = known
			}
			if !known {
				res.Skipped[in.ID] = fmt.Sprintf("no service named %s in the registry", in.Service)
				continue
			}
			replaced, refused, err := r.replaceAt(ctx, q, now, source, in, ch.QuietRefusals[in.ID])
			if err != nil {
				return err
			}
			res.Replaced = append(res.Replaced, replaced...)
			if refused != "" {
				res.Skipped[in.ID] = refused
				if res.ReplaceRefused == nil {
					res.ReplaceRefused = map[uuid.UUID]string{}
				}
				res.ReplaceRefused[in.ID] = refused
				continue
			}
			row, err := insertSealed(ctx, q, r.cfg.Sealer, db.InstanceInsertParams{
				ID: in.ID, Service: in.Service, Address: in.Address, Port: int32(in.Port),
				Zone: in.Zone, Region: r.cfg.Region, Source: source, RegisteredBy: actor, Now: now,
			})
			if err != nil {
				return fmt.Errorf("insert instance %s: %w", in.ID, err)
			}
			out := instanceFromRow(row)
			if _, err := audit.Append(ctx, q, now, entry("instance.reconcile.add", in.ID.String(), nil, out)); err != nil {
				return err
			}
			res.Created = append(res.Created, out)
		}
		return nil
	})
	if err != nil {
		return ReconcileResult{}, err
	}
	if f := r.following(); f != nil {
		var all []Instance
		all = append(all, res.Ended...)
		all = append(all, res.Replaced...)
		all = append(all, res.Created...)
		if len(all) > 0 {
			f.InstancesRegistered(ctx, all)
		}
	}
	return res, nil
}

// refuseReconciledEndpoint refuses a registration of an endpoint a
// reconciled instance holds (read with q, in the registration's
// transaction).
func refuseReconciledEndpoint(ctx context.Context, q *db.Queries, service, address string, port int) (*refusal.Error, error) {
	row, err := q.InstanceGetLiveEndpoint(ctx, db.InstanceGetLiveEndpointParams{Service: service, Address: address, Port: int32(port)})
	if notFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the live instance at %s:%d: %w", address, port, err)
	}
	if !IsReconciled(row.Source) {
		return nil, nil
	}
	e := newRefusal(ErrReconciledEndpoint, "%s:%d of %s is instance %s, reconciled from %s: an instance the orchestrator or inventory knows exists by reconciliation and is not registered (ADR-03); registration is for runtimes nothing watches",
		address, port, service, row.ID, row.Source)
	e.Figures = map[string]any{"instance": row.ID.String(), "source": row.Source}
	return e, nil
}

// ReconcileConfirmation is an operator's confirmation that a
// reconciliation source really lost what its disbelief threshold holds.
type ReconcileConfirmation struct {
	ID int64 `json:"id"`
	// Gate is the source's gate, "reconcile/<source>".
	Gate string `json:"gate"`
	// Scope is what was asked for: the source as a whole, or one service
	// of it.
	Scope       disbelief.Scope `json:"scope"`
	Source      string          `json:"source"`
	ConfirmedAt time.Time       `json:"confirmed_at"`
	ConfirmedBy string          `json:"confirmed_by"`
	Reason      string          `json:"reason"`
	// Instances are the held instances it vouches for: the removals held
	// in Scope when it was given. A service's held removals are released
	// only while every one of them is among the instances vouched for.
	Instances []uuid.UUID `json:"instances"`
	// Services are their services (in the answer, not stored).
	Services []string `json:"services,omitempty"`
	// Released counts Instances, and ReleasedByService by service: what
	// the next pass of the source ends, unless the hold grows first.
	Released          int            `json:"released"`
	ReleasedByService map[string]int `json:"released_by_service,omitempty"`
	// StillHeld counts, by service, the removals the source holds outside
	// Scope: a service-scoped confirmation leaves them held.
	StillHeld map[string]int `json:"still_held,omitempty"`
}

// GatePrefixReconcile begins the gate of a reconciliation source's held
// removals ("reconcile/<source>").
const GatePrefixReconcile = "reconcile/"

// ConfirmReconcile records actor's confirmation of the removals source
// holds in scope, audited as reconcile.confirm (gate, scope, and what it
// releases) whether or not it is accepted. held are the instances the
// source's hold lacks now, with their services.
//
// scope is the source itself (every removal held) or one of its
// services (that service's held removals only; the others stay held).
// Removing capacity is a privileged act: it needs an admin, or an
// operator (person or tool, operator role) of the team that owns every
// service it releases, by the sealed owner. A source spans teams, so a
// source-wide confirmation of a hold covering services of several teams
// names each that is not the caller's in its refusal; each team confirms
// its own service, or an admin the source. The confirmation names the
// instances it covers; absences the hold gains afterwards are held until
// confirmed again.
//
// known says whether source is configured; an unknown source, or a
// service the registry does not know (and the source does not hold), is
// refused as not found once the caller has the operator role. A scope
// holding nothing is refused as a conflict naming what the source does
// hold (a confirmation vouches for what is held now, never for what a
// later hold lacks).
func (r *Registry) ConfirmReconcile(ctx context.Context, actor identity.Principal, source string, scope disbelief.Scope, reason string, known bool, held map[uuid.UUID]string) (ReconcileConfirmation, error) {
	const action = "reconcile.confirm"
	gate := GatePrefixReconcile + source
	inScope, outside := splitHeld(scope, held)
	asked := map[string]any{"gate": gate, "scope": scope.String(), "source": source, "reason": reason,
		"held": len(held), "released": len(inScope), "still_held": countByService(outside)}
	var out ReconcileConfirmation
	err := r.write(ctx, actor, action, "reconcile-source", source, asked, func(q *db.Queries) (*refusal.Error, error) {
		if !actor.IsAdmin() && !((actor.Kind == identity.KindOperator || actor.Kind == identity.KindTool) && actor.Role.AtLeast(identity.RoleOperator)) {
			return newRefusal(ErrForbidden, "confirming the removals held from %s needs the operator role or admin; %s has neither", source, actor), nil
		}
		switch {
		case scope.Kind == disbelief.Source && scope.Name == source:
		case scope.Kind == disbelief.Service && ValidName(scope.Name):
		default:
			return invalid("the scope is not one this source holds", []FieldError{{Field: "scope",
				Message: fmt.Sprintf("%q: the source as a whole (%q) or one of its services (\"service <name>\")", scope.String(), disbelief.Scope{Kind: disbelief.Source, Name: source}.String())}}), nil
		}
		if !known {
			return newRefusal(ErrNotFound, "no reconciliation source named %s", source), nil
		}
		services := servicesOf(inScope)
		// Authority is over the services the scope names: the one service
		// asked for (held or not), or every service the source holds.
		owners := services
		if scope.Kind == disbelief.Service {
			owners = []string{scope.Name}
			if len(inScope) == 0 {
				// Not held: say whether the service exists at all, as the
				// lease gate does.
				if _, err := q.ServiceGet(ctx, scope.Name); notFound(err) {
					return newRefusal(ErrNotFound, "no service named %s", scope.Name), nil
				} else if err != nil {
					return nil, fmt.Errorf("read service %s: %w", scope.Name, err)
				}
			}
		}
		var notOwned []string
		for _, svc := range owners {
			row, err := q.ServiceGet(ctx, svc)
			switch {
			case notFound(err):
				// A service deleted since: its instances are gone anyway,
				// but only an admin vouches for what no team owns.
				if !actor.IsAdmin() {
					notOwned = append(notOwned, svc+" (no longer registered)")
				}
			case err != nil:
				return nil, fmt.Errorf("read service %s: %w", svc, err)
			case !CanManage(actor, r.ownerOf(row)):
				notOwned = append(notOwned, svc+" (owned by "+ownerName(r.ownerOf(row))+")")
			}
		}
		if len(notOwned) > 0 {
			if scope.Kind == disbelief.Service {
				return newRefusal(ErrForbidden, "confirming the removals %s holds in %s needs an operator of the team that owns it, or an admin; %s is neither: %s",
					gate, scope, actor, strings.Join(notOwned, ", ")), nil
			}
			return newRefusal(ErrForbidden, "the removals held from %s include services %s does not operate: %s; their owning team's operator confirms each (scope \"service <name>\"), or an admin the source",
				source, actor, strings.Join(notOwned, ", ")), nil
		}
		if len(inScope) == 0 {
			what := "nothing"
			if len(outside) > 0 {
				what = "only " + describeCounts(countByService(outside))
			}
			return newRefusal(ErrConflict, "%s holds no removals in %s (it holds %s): there is nothing to confirm (a confirmation vouches for the instances held now)",
				gate, scope, what), nil
		}
		reason = strings.TrimSpace(reason)
		if reason == "" {
			return invalid("a confirmation needs a reason", []FieldError{{Field: "reason", Message: "say why these instances are known to be gone"}}), nil
		}
		if len(reason) > 1000 {
			return invalid("the reason is too long", []FieldError{{Field: "reason", Message: "at most 1000 characters"}}), nil
		}
		ids := slices.SortedFunc(maps.Keys(inScope), func(a, b uuid.UUID) int { return bytes.Compare(a[:], b[:]) })
		now := r.now()
		sig, kid, err := r.sealConfirmation(ctx, reconcileConfirmationDomain, reconcileConfirmationSealOf(source, now, actor.String(), reason, ids))
		if err != nil {
			return nil, err
		}
		row, err := q.ReconcileConfirmationInsert(ctx, db.ReconcileConfirmationInsertParams{
			Source: source, ConfirmedAt: now, ConfirmedBy: actor.String(), Reason: reason, Instances: ids, Seal: sig, SealKey: kid,
		})
		if err != nil {
			return nil, fmt.Errorf("record confirmation: %w", err)
		}
		out = confirmationOf(row)
		out.Gate, out.Scope, out.Services = gate, scope, services
		out.Released, out.ReleasedByService = len(ids), countByService(inScope)
		if len(outside) > 0 {
			out.StillHeld = countByService(outside)
		}
		_, err = audit.Append(ctx, q, now, audit.Entry{
			ActorKind: actorKind(actor), Actor: actor.String(), Action: action,
			TargetKind: "reconcile-source", Target: source, Outcome: audit.Accepted, Reason: reason, After: out,
		})
		return nil, err
	})
	return out, err
}

// splitHeld parts held into the removals scope covers and the rest.
func splitHeld(scope disbelief.Scope, held map[uuid.UUID]string) (in, out map[uuid.UUID]string) {
	in, out = map[uuid.UUID]string{}, map[uuid.UUID]string{}
	for id, svc := range held {
		if scope.Kind == disbelief.Source || (scope.Kind == disbelief.Service && svc == scope.Name) {
			in[id] = svc
		} else {
			out[id] = svc
		}
	}
	return in, out
}

// servicesOf lists the services of held, sorted.
func servicesOf(held map[uuid.UUID]string) []string {
	set := make(map[string]bool, len(held))
	for _, svc := range held {
		set[svc] = true
	}
	return slices.Sorted(maps.Keys(set))
}

// countByService counts held by service.
func countByService(held map[uuid.UUID]string) map[string]int {
	n := map[string]int{}
	for _, svc := range held {
		n[svc]++
	}
	return n
}

// describeCounts says "api (3), db (1)".
func describeCounts(n map[string]int) string {
	var parts []string
	for _, svc := range slices.Sorted(maps.Keys(n)) {
		parts = append(parts, fmt.Sprintf("%s (%d)", svc, n[svc]))
	}
	return strings.Join(parts, ", ")
}

// ownerName names a sealed owner for a refusal: none verifies when the
// service row was changed outside muster.
func ownerName(owner string) string {
	if owner == "" {
		return "no team muster can verify"
	}
	return owner
}

func confirmationOf(row db.ReconcileConfirmation) ReconcileConfirmation {
	ids := row.Instances
	if ids == nil {
		ids = []uuid.UUID{}
	}
	return ReconcileConfirmation{ID: row.ID, Gate: GatePrefixReconcile + row.Source, Scope: disbelief.Scope{Kind: disbelief.Source, Name: row.Source},
		Source: row.Source, ConfirmedAt: row.ConfirmedAt, ConfirmedBy: row.ConfirmedBy, Reason: row.Reason, Instances: ids, Released: len(ids)}
}

// SourceConfirmationsSince lists the confirmations of source given at
// or after since (the start of the hold they may release), newest first,
// at most MaxReconcileConfirmations: a hold is released service by
// service, so a confirmation of one service and a later one of another
// both count.
func (r *Registry) SourceConfirmationsSince(ctx context.Context, source string, since time.Time) ([]ReconcileConfirmation, error) {
	rows, err := db.New(r.cfg.Pool).ReconcileConfirmationsSince(ctx, db.ReconcileConfirmationsSinceParams{Source: source, Since: since, Max: MaxReconcileConfirmations})
	if err != nil {
		return nil, fmt.Errorf("read the confirmations of %s: %w", source, err)
	}
	out := make([]ReconcileConfirmation, 0, len(rows))
	for _, row := range rows {
		if r.believeReconcileConfirmation(row) { // one written by hand releases nothing
			out = append(out, confirmationOf(row))
		}
	}
	return out, nil
}

// MaxReconcileConfirmations bounds the confirmations a pass reads (they
// are rate-limited writes; a hold gathers a handful).
const MaxReconcileConfirmations = 1000
