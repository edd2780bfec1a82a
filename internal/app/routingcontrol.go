package app

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/fence"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/refusal"
	"github.com/musterhq/muster/internal/routingcontrol"
	"github.com/musterhq/muster/internal/shift"
	bgworker "github.com/musterhq/muster/internal/worker"
)

// WorkerRoutingControl reads the out-of-band region routing controls
// (internal/routingcontrol; ADR-14).
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
	// One audit row per change in the region, by the owner of its key,
	// under its tenure.
	if rc.Owns == nil && a.Ownership != nil {
		rc.Owns = func(key string) bool { _, ok := a.Ownership.Owns(key); return ok }
		rc.Audit = ownerAudit{pool: cfg.Pool, fence: a.Fence, writer: "routing-control-audit",
			key: func(audit.Entry) string { return routingcontrol.AuditOwnershipKey }}
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
// (ADR-13, ADR-14), through the shift-backs:
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

// actOnControl drains the region (Off) or takes its first step back (On),
// as the owner of its key, under the tenure it holds now: a deposed
// owner (a pause outlived its tenure) writes nothing, neither the move
// nor its audit row, and the drop is counted. Whatever it could not do
// now (PostgreSQL away, a step not due yet) the reconciler does from the
// database's state (RoutingControlReconciler).
//
// It reports whether a drain was refused (its reason audited), as when no
// region can take the traffic.
func (a *App) actOnControl(region string, to routingcontrol.State, revision string) (refused bool) {
	tenure, ok := a.Fence.Claim(RoutingControlOwnershipKey(region))
	if !ok {
		return false
	}
	shifts := a.Shifts.Guarded(func(ctx context.Context, q *db.Queries) error { return a.Fence.Check(ctx, q, tenure) })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	switch to {
	case routingcontrol.Off:
		yes := true
		sh, err := shifts.Drain(ctx, routingControlActor, shift.Request{
			Scope: shift.ScopeRegion, Target: region, Manual: &yes,
			Reason: fmt.Sprintf("the routing control turned region %s off (revision %s)", region, revision),
		})
		re := (*refusal.Error)(nil)
		switch {
		case errors.As(err, &re) && re.Check == "conflict":
			// A drain of the region is active: one whose traffic is
			// returning goes back to 0 at once.
			a.redrainReturning(ctx, shifts, region, revision)
			return false
		case fence.IsNotOwner(err):
			a.Fence.Dropped(fenceWriterRoutingControl, 1)
			return false
		case err != nil:
			// The reconciler tries again while the control says Off.
			a.log.Warn("the routing control turned this region off, but it is not drained", "err", err)
			return re != nil
		}
		a.log.Info("the routing control turned this region off: region drained", "shift", sh.ID)
	case routingcontrol.On:
		drains, err := a.routingControlDrains(ctx, region)
		if err != nil {
			// The reconciler reads them again at its next round.
			a.log.Warn("the routing control turned this region on; its drain could not be read", "err", err)
		}
		for _, sh := range drains {
			a.stepBackIfDue(ctx, shifts, sh)
		}
	}
	return false
}

// fenceWriterRoutingControl labels the routing control's moves in
// muster_fenced_writes_dropped_total.
const fenceWriterRoutingControl = "routing-control"

// routingControlDrains reads from the database the drains of region the
// routing control started that are still on their way back (draining or
// returning): what the next step is, and when, is there (the shift's
// last move and the dwell), not in any replica's memory.
func (a *App) routingControlDrains(ctx context.Context, region string) ([]shift.Shift, error) {
	var out []shift.Shift
	for _, state := range []string{shift.Draining, shift.Returning} {
		all, err := a.Shifts.List(ctx, routingControlActor, shift.Filter{State: state, Limit: 100})
		if err != nil {
			return nil, fmt.Errorf("read the routing control's drains of %s: %w", region, err)
		}
		for _, sh := range all {
			if sh.Scope == shift.ScopeRegion && sh.Target == region && sh.StartedBy == routingControlActor.String() {
				out = append(out, sh)
			}
		}
	}
	return out, nil
}

// redrainReturning drains again the region shift of region whose traffic
// is returning (the routing control turned the region off during the
// return).
func (a *App) redrainReturning(ctx context.Context, shifts shift.Guarded, region, revision string) {
	for _, state := range []string{shift.Returning, shift.PendingConfirmation} {
		all, err := a.Shifts.List(ctx, routingControlActor, shift.Filter{State: state, Limit: 100})
		if err != nil {
			a.log.Warn("the routing control turned this region off again; its drain could not be read", "err", err)
			return
		}
		for _, sh := range all {
			if sh.Scope != shift.ScopeRegion || sh.Target != region {
				continue
			}
			_, err := shifts.Redrain(ctx, routingControlActor, sh.ID, fmt.Sprintf("the routing control turned region %s off again (revision %s)", region, revision))
			switch {
			case fence.IsNotOwner(err):
				a.Fence.Dropped(fenceWriterRoutingControl, 1)
			case err != nil:
				a.log.Warn("the routing control turned this region off again, but its return is not drained", "shift", sh.ID, "err", err)
			default:
				a.log.Info("the routing control turned this region off again: its return drained back to 0", "shift", sh.ID)
			}
		}
	}
}

// stepBackIfDue takes the next step back of a routing-control drain when
// its dwell has elapsed (by the shift's last move, as the database has
// it); one not yet due is left to a later round of the reconciler, so no
// attempt is refused (and audited) for want of dwell.
func (a *App) stepBackIfDue(ctx context.Context, shifts shift.Guarded, sh shift.Shift) {
	if sh.NextStepAt == nil || a.clock().Before(*sh.NextStepAt) {
		return
	}
	next, err := shifts.StepBack(ctx, routingControlActor, sh.ID)
	var re *refusal.Error
	switch {
	case err == nil && next.State == shift.Returning:
		a.log.Info("the routing control says this region is on: traffic returns in capped steps", "shift", sh.ID, "weight", next.TrafficWeight)
	case err == nil:
		a.log.Info("the routing control says this region is on: the return waits for an operator's confirmation", "shift", sh.ID, "state", next.State, "weight", next.TrafficWeight)
	case fence.IsNotOwner(err):
		a.Fence.Dropped(fenceWriterRoutingControl, 1)
	case errors.As(err, &re):
		a.log.Warn("the routing control says this region is on; the step back is refused", "shift", sh.ID, "err", err)
	default:
		// PostgreSQL away: the reconciler's next round tries again.
		a.log.Warn("the routing control says this region is on; the step back is not taken yet", "shift", sh.ID, "err", err)
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

// WorkerRoutingControlReconcile keeps this region's drain in step with
// its routing control, from the database's state, as the owner of the
// region's key: a region the control says is Off is drained (a change
// seen while no replica owned the key yet, at a start, or by an owner
// that died before acting would otherwise leave the region serving), and
// a drain the control started is stepped back as each dwell elapses
// while the control says On (the next step's time is the shift's last
// move plus the dwell, so whichever replica holds the key after a
// restart or a move continues the return within one round). Every
// replica reads the drains each round for the alarm
// routing_control_return_stalled.
const WorkerRoutingControlReconcile = "routing-control-reconcile"

// AlarmRoutingControlReturnStalled is raised while the routing control
// says this region is On and a drain it started has had a step back due
// for longer than routingControlStallAfter without it being taken.
const AlarmRoutingControlReturnStalled = "routing_control_return_stalled"

// routingControlReconcileEvery is how often the reconciler runs (or the
// shifts' dwell, when shorter): a due step is taken at most this long
// after its dwell elapsed (plus a round
// of the ownership worker when the key moves). A drain refused for want
// of a fallback region is tried again at most every
// routingControlRefusedRetry (each attempt is audited). A step due for
// longer than routingControlStallAfter (six rounds) raises
// routing_control_return_stalled.
const (
	routingControlReconcileEvery = 5 * time.Second
	routingControlRefusedRetry   = time.Minute
	routingControlStallAfter     = 30 * time.Second
)

// RoutingControlReconciler is WorkerRoutingControlReconcile.
type RoutingControlReconciler struct {
	a      *App
	region string
	now    func() time.Time
	every  time.Duration
	runner bgworker.Runner

	mu      sync.Mutex
	refused time.Time // the last attempt refused (no fallback region)
	// drains are the routing control's drains on their way back at the
	// last round that read them (every replica reads them).
	drains []shift.Shift
}

// Start runs a round every routingControlReconcileEvery (or dwell, when
// shorter) until ctx ends or Stop is called.
func (r *RoutingControlReconciler) Start(ctx context.Context) error {
	every := routingControlReconcileEvery
	if r.every > 0 && r.every < every {
		every = r.every
	}
	return r.runner.Start(ctx, func(ctx context.Context) {
		bgworker.Every(ctx, every, r.RunOnce)
	})
}

// Stop ends the rounds. Safe to call twice or before Start.
func (r *RoutingControlReconciler) Stop() { r.runner.Stop() }

// RunOnce is one round: it reads the routing control's drains of this
// region (kept for the alarm), and as the owner of the region's key
// drains the region when the control says Off and no drain of it is
// active, or steps back each drain whose dwell has elapsed when the
// control says On (after a good reading: before one, every region is On
// by default, which says nothing about a drain).
func (r *RoutingControlReconciler) RunOnce(ctx context.Context) {
	a := r.a
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	drains, err := a.routingControlDrains(lctx, r.region)
	if err != nil {
		return // PostgreSQL away: the drains kept are the last read
	}
	r.mu.Lock()
	r.drains = drains
	r.mu.Unlock()
	if a.RoutingControls.On(r.region) {
		if a.RoutingControls.Status().LastRead.IsZero() {
			return
		}
		tenure, ok := a.Fence.Claim(RoutingControlOwnershipKey(r.region))
		if !ok {
			return
		}
		shifts := a.Shifts.Guarded(func(ctx context.Context, q *db.Queries) error { return a.Fence.Check(ctx, q, tenure) })
		for _, sh := range drains {
			a.stepBackIfDue(lctx, shifts, sh)
		}
		return
	}
	if _, ok := a.Fence.Claim(RoutingControlOwnershipKey(r.region)); !ok {
		return
	}
	r.mu.Lock()
	wait := !r.refused.IsZero() && r.now().Sub(r.refused) < routingControlRefusedRetry
	r.mu.Unlock()
	if wait {
		return
	}
	all, err := a.Shifts.List(lctx, routingControlActor, shift.Filter{State: shift.Draining, Limit: 100})
	if err != nil {
		return // PostgreSQL away: next time
	}
	for _, sh := range all {
		if sh.Scope == shift.ScopeRegion && sh.Target == r.region {
			return
		}
	}
	a.log.Warn("the routing control says this region is off and it is not drained: draining it", "region", r.region)
	refused := a.actOnControl(r.region, routingcontrol.Off, a.RoutingControls.Status().Revision)
	r.mu.Lock()
	if refused {
		r.refused = r.now()
	} else {
		r.refused = time.Time{}
	}
	r.mu.Unlock()
}

// Alarms returns routing_control_return_stalled for each drain the
// routing control started whose next step back has been due for longer
// than routingControlStallAfter while the control says On: due when its
// dwell elapsed, or when the control turned On, whichever is later. The
// owner of the key takes such a step within a round; one left this long
// means no replica is taking it (the key's owner stopped, is cut off, or
// its steps fail), and the region stays drained at the shift's weight.
func (r *RoutingControlReconciler) Alarms() []assembler.Alarm {
	a := r.a
	if !a.RoutingControls.On(r.region) {
		return nil
	}
	st := a.RoutingControls.Status()
	if st.LastRead.IsZero() {
		return nil
	}
	var on time.Time
	for _, rs := range st.Regions {
		if rs.Region == r.region {
			on = rs.Since
		}
	}
	now := r.now()
	r.mu.Lock()
	drains := r.drains
	r.mu.Unlock()
	var out []assembler.Alarm
	for _, sh := range drains {
		if sh.NextStepAt == nil {
			continue
		}
		due := *sh.NextStepAt
		if on.After(due) {
			due = on
		}
		if now.Sub(due) <= routingControlStallAfter {
			continue
		}
		out = append(out, assembler.Alarm{Kind: AlarmRoutingControlReturnStalled, Since: due.Add(routingControlStallAfter), Detail: fmt.Sprintf(
			"the routing control says region %s is on, but its drain (shift %s, %s at traffic weight %.2f since %s) has had a step back due since %s (%s ago) and none was taken: the replica owning %s is not taking the steps; an operator may step it (POST /v1/shifts/%s/step)",
			r.region, sh.ID, sh.State, sh.TrafficWeight, sh.LastStepAt.UTC().Format(time.RFC3339), due.UTC().Format(time.RFC3339), now.Sub(due).Round(time.Second),
			RoutingControlOwnershipKey(r.region), sh.ID)})
	}
	return out
}

// routingControlsWithReturns is the routing controls as the API and the
// banner show them, with the return's alarm beside the source's.
type routingControlsWithReturns struct {
	*routingcontrol.Controls
	returns *RoutingControlReconciler
}

func (c routingControlsWithReturns) Alarms() []assembler.Alarm {
	return append(c.Controls.Alarms(), c.returns.Alarms()...)
}
