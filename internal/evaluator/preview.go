package evaluator

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/eligibility"
	"github.com/musterhq/muster/internal/preview"
	"github.com/musterhq/muster/internal/registry"
)

// PreviewSpan is how far back a contract preview replays at least: the
// last 10 minutes, or the windows retained (twice Retention, the prune
// horizon) when that is longer.
const PreviewSpan = 10 * time.Minute

// PreviewContract replays the observed windows retained for a service
// through fresh engines, under the contract this evaluator applies to it
// and under p.Proposed, and returns the two side by side (package
// preview). It only reads: the live engine, its verdicts, the views and
// the stored windows are left as they are. The caller has authorised and
// validated the preview (registry.PreviewContract).
//
// The windows are the ones written to PostgreSQL since the span began
// plus those counted since the last flush, stamped now. The contract in
// force is the one the evaluator applied (p.Current, the stored one, if
// it has applied none for the service yet: a stored contract whose seal
// does not verify is not applied, and the preview compares against what
// actually judges the service).
func (e *Evaluator) PreviewContract(ctx context.Context, p registry.ContractPreview) (preview.Result, error) {
	if !e.ready.Load() {
		return preview.Result{}, ErrNotReady
	}
	name := p.Service.Name
	now := e.cfg.Now()
	since := now.Add(-max(PreviewSpan, 2*e.cfg.Retention))
	current := registry.ServiceContract{Service: p.Service, Contract: p.Current.Contract, ContractVersion: p.Current.Version}

	e.mu.Lock()
	if si := e.services[name]; si != nil && si.applied.Service.Name == name {
		current = si.applied
	}
	ins := make([]preview.Instance, 0, len(e.byService[name]))
	for id := range e.byService[name] {
		r, ok := e.engine.Routing(eligibility.InstanceID(id), now)
		if !ok {
			continue
		}
		ins = append(ins, preview.Instance{ID: id, Zone: e.instances[id].zone, Awaiting: r.Awaiting})
	}
	var unflushed []preview.Window
	for _, x := range ins {
		iw := e.instances[x.ID].win
		if iw == nil || iw.gen != e.winGen {
			continue // nothing counted since the flush
		}
		for cl := range eligibility.Class(3) {
			if w := &iw.counts[cl]; w.nrep > 0 {
				unflushed = append(unflushed, preview.Window{Instance: x.ID, Class: cl, End: now,
					Successes: w.successes, Failures: w.failures, HardFailures: w.hard, Unobservable: w.unobservable, Reporters: int(w.nrep)})
			}
		}
	}
	opts := e.engine.Options()
	e.mu.Unlock()

	rows, err := e.windowsOf(ctx, ins, since)
	if err != nil {
		return preview.Result{}, err
	}
	windows := make([]preview.Window, 0, len(rows)+len(unflushed))
	for _, w := range rows {
		windows = append(windows, preview.Window{Instance: w.InstanceID, Class: eligibility.Class(w.Class), End: w.WindowEnd,
			Successes: uint32(max(w.Successes, 0)), Failures: uint32(max(w.Failures, 0)), HardFailures: uint32(max(w.HardFailures, 0)),
			Unobservable: uint32(max(w.Unobservable, 0)), Reporters: int(w.Reporters)})
	}
	windows = append(windows, unflushed...)

	proposed := registry.ServiceContract{Service: p.Service, Contract: p.Proposed}
	in := preview.Input{
		Service: name, Instances: ins, Windows: windows,
		Current:  preview.Contract{Eligibility: contractOf(current), MinHealthyFraction: current.Contract.MinHealthyFraction},
		Proposed: preview.Contract{Eligibility: contractOf(proposed), MinHealthyFraction: p.Proposed.MinHealthyFraction},
		To:       now, Options: opts,
	}
	if len(windows) == 0 {
		in.From = since
	}
	res, err := preview.Run(in)
	if err != nil {
		return preview.Result{}, fmt.Errorf("preview the contract of %s: %w", name, err)
	}
	return res, nil
}

// windowsOf reads the windows of ins retained since, bounded by DBTimeout.
func (e *Evaluator) windowsOf(ctx context.Context, ins []preview.Instance, since time.Time) ([]db.ObservedWindowsForInstancesRow, error) {
	if len(ins) == 0 {
		return nil, nil
	}
	ids := make([]uuid.UUID, len(ins))
	for i, x := range ins {
		ids[i] = x.ID
	}
	ctx, cancel := context.WithTimeout(ctx, e.cfg.DBTimeout)
	defer cancel()
	rows, err := db.New(e.cfg.Pool).ObservedWindowsForInstances(ctx, db.ObservedWindowsForInstancesParams{Since: since, Ids: ids})
	if err != nil {
		return nil, fmt.Errorf("read the observed windows of %d instances: %w", len(ids), err)
	}
	return rows, nil
}
