package app

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/refusal"
	"github.com/musterhq/muster/internal/routingcontrol"
	"github.com/musterhq/muster/internal/shift"
	bgworker "github.com/musterhq/muster/internal/worker"
)

// WorkerRoutingControl reads the out-of-band region routing controls
// (internal/routingcontrol; ADR-14, issue 29).
const WorkerRoutingControl = "routing-control"

// buildRoutingControl builds the routing controls' reader from
// Config.RoutingControl: its Audit, Logger, Registerer and Replica are
// the app's, its clock the app's unless set, and this muster's region
// and its configured ones count as known regions.
func (a *App) buildRoutingControl(cfg Config, auditLog *audit.Log) error {
	if cfg.RoutingControl == nil {
		return nil
	}
	rc := *cfg.RoutingControl
	rc.Audit, rc.Logger, rc.Registerer, rc.Replica = auditLog, a.log, a.Metrics, cfg.Replica
	// One audit row per change in the region, by the owner of its key.
	if rc.Owns == nil && a.Ownership != nil {
		rc.Owns = func(key string) bool { _, ok := a.Ownership.Owns(key); return ok }
	}
	rc.Now = orNow(rc.Now, cfg.Now)
	if cfg.Region != "" && routingcontrol.ValidRegion(cfg.Region) {
		rc.Regions = append(rc.Regions[:len(rc.Regions):len(rc.Regions)], cfg.Region)
	}
	var err error
	a.RoutingControls, err = routingcontrol.New(rc)
	return err
}

// routingControlActor is who drains and steps back this region when the
// routing control says so: a system identity with the admin role a region
// drain takes, named in every audit row it writes.
var routingControlActor = identity.Principal{Kind: identity.KindTool, Subject: "system:routing-control", Role: identity.RoleAdmin}

// RoutingControlOwnershipKey is what this region's routing control hashes
// onto the region's shards as: the replica owning it acts on the control
// (every replica reads the source; one drains and steps back).
func RoutingControlOwnershipKey(region string) string { return "routing-control:" + region }

// actOnRoutingControl moves this region's clients when the routing
// control turns the region off, and brings them back when it turns it on
// (ADR-13, ADR-14, issue 29), through the shift-backs:
//
//   - Off: a region drain as system:routing-control, declared manual (the
//     routing control is how people declare a regional failover). Clients
//     with fallback regions (resolver.Config.Regions) move to them; a
//     region with none to take its traffic is not drained (the refusal is
//     audited with its reason).
//   - On again: each step back of that drain as its dwell elapses, while
//     the control stays On, up to the last: the return to full traffic
//     waits for an operator's confirmation (POST /v1/shifts/{id}/confirm;
//     shiftback_pending is raised if it waits long), as for any manual
//     failover. A region drain an operator started is theirs to step.
//
// Only the replica owning the region's key acts; a change it sees while
// another owns it is that one's to act on (it reads the same source).
func (a *App) actOnRoutingControl(region string) {
	if a.RoutingControls == nil || region == "" {
		return
	}
	a.RoutingControls.OnChange(func(ch routingcontrol.Change) {
		if ch.Region == region {
			a.actOnControl(region, ch.To, ch.Revision)
		}
	})
}

// routingControlRetry is how soon an action the routing control asked for
// is tried again when it could not be taken (PostgreSQL away), while the
// control still says so.
const routingControlRetry = 5 * time.Second

// actOnControl drains the region (Off) or starts its return (On), as the
// owner of its key; an attempt that fails for want of the database is
// tried again while the control still says the same.
//
// It reports whether a drain was refused (its reason audited), as when no
// region can take the traffic.
func (a *App) actOnControl(region string, to routingcontrol.State, revision string) (refused bool) {
	if _, ok := a.Ownership.Owns(RoutingControlOwnershipKey(region)); !ok {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	retry := func(err error) {
		if re := (*refusal.Error)(nil); errors.As(err, &re) {
			return // refused, with its reason audited: not the database
		}
		time.AfterFunc(routingControlRetry, func() {
			if on := a.RoutingControls.On(region); on == (to == routingcontrol.On) {
				a.actOnControl(region, to, revision)
			}
		})
	}
	switch to {
	case routingcontrol.Off:
		yes := true
		sh, err := a.Shifts.Drain(ctx, routingControlActor, shift.Request{
			Scope: shift.ScopeRegion, Target: region, Manual: &yes,
			Reason: fmt.Sprintf("the routing control turned region %s off (revision %s)", region, revision),
		})
		re := (*refusal.Error)(nil)
		if errors.As(err, &re) && re.Check == "conflict" {
			// A drain of the region is active: one whose traffic is
			// returning goes back to 0 at once.
			a.redrainReturning(ctx, region, revision)
			return false
		}
		if err != nil {
			a.log.Warn("the routing control turned this region off, but it is not drained", "err", err)
			retry(err)
			return re != nil
		}
		a.log.Info("the routing control turned this region off: region drained", "shift", sh.ID)
	case routingcontrol.On:
		all, err := a.Shifts.List(ctx, routingControlActor, shift.Filter{Limit: 100})
		if err != nil {
			a.log.Warn("the routing control turned this region on; its drain could not be read", "err", err)
			retry(err)
			return false
		}
		for _, sh := range all {
			if sh.Scope == shift.ScopeRegion && sh.Target == region && sh.StartedBy == routingControlActor.String() &&
				(sh.State == shift.Draining || sh.State == shift.Returning) {
				a.stepBackWhileOn(ctx, region, sh.ID)
			}
		}
	}
	return false
}

// redrainReturning drains again the region shift of region whose traffic
// is returning (the routing control turned the region off during the
// return).
func (a *App) redrainReturning(ctx context.Context, region, revision string) {
	all, err := a.Shifts.List(ctx, routingControlActor, shift.Filter{Limit: 100})
	if err != nil {
		a.log.Warn("the routing control turned this region off again; its drain could not be read", "err", err)
		return
	}
	for _, sh := range all {
		if sh.Scope != shift.ScopeRegion || sh.Target != region || (sh.State != shift.Returning && sh.State != shift.PendingConfirmation) {
			continue
		}
		if _, err := a.Shifts.Redrain(ctx, routingControlActor, sh.ID, fmt.Sprintf("the routing control turned region %s off again (revision %s)", region, revision)); err != nil {
			a.log.Warn("the routing control turned this region off again, but its return is not drained", "shift", sh.ID, "err", err)
			continue
		}
		a.log.Info("the routing control turned this region off again: its return drained back to 0", "shift", sh.ID)
	}
}

// stepBackWhileOn takes the next step back of a region drain the routing
// control started, now or once the dwell allows, and the ones after it
// at each dwell, while the control still says On, until the shift waits
// for its final confirmation.
func (a *App) stepBackWhileOn(ctx context.Context, region string, id uuid.UUID) {
	later := func(d time.Duration) {
		time.AfterFunc(d, func() {
			if !a.RoutingControls.On(region) {
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			a.stepBackWhileOn(ctx, region, id)
		})
	}
	sh, err := a.Shifts.StepBack(ctx, routingControlActor, id)
	var re *refusal.Error
	switch {
	case err == nil && sh.State == shift.Returning && sh.NextStepAt != nil:
		a.log.Info("the routing control says this region is on: traffic returns in capped steps", "shift", id, "weight", sh.TrafficWeight)
		later(max(time.Until(*sh.NextStepAt), 0) + 50*time.Millisecond)
	case err == nil:
		a.log.Info("the routing control says this region is on: the return waits for an operator's confirmation", "shift", id, "state", sh.State, "weight", sh.TrafficWeight)
	case errors.As(err, &re) && errors.Is(err, shift.ErrDwell) && re.RetryAfter > 0:
		later(re.RetryAfter)
	case errors.As(err, &re):
		a.log.Warn("the routing control says this region is on; the step back is refused", "shift", id, "err", err)
	default:
		// PostgreSQL away: tried again while the control says On.
		a.log.Warn("the routing control says this region is on; the step back is not taken yet", "shift", id, "err", err)
		later(routingControlRetry)
	}
}

// fallbackRegions names the peer regions that can take this region's
// traffic now, in configuration order: followed, reached within the stale
// threshold and not turned off by the routing control; else says why
// none can (shift.Config.Fallback).
func (a *App) fallbackRegions() ([]string, string) {
	if a.Federation == nil {
		return nil, "this muster follows no peer region (--peer), so its clients have nowhere to go"
	}
	var out, why []string
	for _, st := range a.Federation.Aggregate.Regions() {
		switch {
		case st.Stale:
			why = append(why, fmt.Sprintf("region %s is stale (not reached for %.0f s)", st.Region, st.AgeSeconds))
		case a.RoutingControls != nil && !a.RoutingControls.On(st.Region):
			why = append(why, fmt.Sprintf("region %s is turned off by the routing control", st.Region))
		default:
			out = append(out, st.Region)
		}
	}
	return out, strings.Join(why, "; ")
}

// WorkerRoutingControlReconcile checks, as the owner of the region's
// routing-control key, that a region the control says is Off is drained:
// the actuator acts on the control's changes, and a change seen while no
// replica owned the key yet (at a start) or by an owner that died before
// acting would otherwise leave the region serving.
const WorkerRoutingControlReconcile = "routing-control-reconcile"

// routingControlReconcileEvery is how often the owner checks; a drain
// refused for want of a fallback region is tried again at most every
// routingControlRefusedRetry (each attempt is audited).
const (
	routingControlReconcileEvery = 5 * time.Second
	routingControlRefusedRetry   = time.Minute
)

// routingControlReconciler is WorkerRoutingControlReconcile.
type routingControlReconciler struct {
	a       *App
	region  string
	runner  bgworker.Runner
	refused time.Time // the last attempt refused (no fallback region)
}

func (r *routingControlReconciler) Start(ctx context.Context) error {
	return r.runner.Start(ctx, func(ctx context.Context) {
		bgworker.Every(ctx, routingControlReconcileEvery, r.once)
	})
}

func (r *routingControlReconciler) Stop() { r.runner.Stop() }

// once drains the region when the control says Off, this replica owns
// the key, and no drain of the region is active (one whose traffic is
// returning is drained again, as on a change).
func (r *routingControlReconciler) once(ctx context.Context) {
	a := r.a
	if a.RoutingControls.On(r.region) {
		return
	}
	if _, ok := a.Ownership.Owns(RoutingControlOwnershipKey(r.region)); !ok {
		return
	}
	if !r.refused.IsZero() && time.Since(r.refused) < routingControlRefusedRetry {
		return
	}
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	all, err := a.Shifts.List(lctx, routingControlActor, shift.Filter{Limit: 100})
	if err != nil {
		return // PostgreSQL away: next time
	}
	for _, sh := range all {
		if sh.Scope == shift.ScopeRegion && sh.Target == r.region && sh.State == shift.Draining {
			return
		}
	}
	a.log.Warn("the routing control says this region is off and it is not drained: draining it", "region", r.region)
	if a.actOnControl(r.region, routingcontrol.Off, a.RoutingControls.Status().Revision) {
		r.refused = time.Now()
	} else {
		r.refused = time.Time{}
	}
}
