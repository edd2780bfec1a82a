package evaluator

import (
	"cmp"
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/registry"
)

// AlarmInstanceUnsealed is open while an instance row fails its seal
// (registry/seal.go): one inserted or re-pointed outside muster gets no
// traffic, and one ended outside muster keeps its traffic.
const AlarmInstanceUnsealed = "instance_unsealed"

// AlarmContractUnsealed is open while a service's stored health contract
// fails its seal: it is not applied.
const AlarmContractUnsealed = "contract_unsealed"

// unsealedContract is a stored contract not applied for its seal.
type unsealedContract struct {
	version int64 // the version muster applies instead (0: the defaults)
	reason  string
	since   time.Time
}

// contractSealed reports whether sc may be applied: its stored contract
// is muster's, or (when it is not, and sc carries the platform defaults)
// the service has no contract applied yet. Called with e.mu held.
func (e *Evaluator) contractSealed(sc registry.ServiceContract) bool {
	name := sc.Service.Name
	if sc.SealErr == nil {
		delete(e.unsealedContracts, name)
		return true
	}
	si, known := e.services[name]
	u := unsealedContract{reason: sc.SealErr.Error(), since: e.cfg.Now()}
	if known {
		u.version = si.version
	}
	if old, seen := e.unsealedContracts[name]; seen {
		u.since = old.since
	} else {
		e.log.Error("a health contract is not applied: its seal does not verify, so muster did not write it",
			"service", name, "reason", sc.SealErr, "applied_version", u.version)
	}
	e.unsealedContracts[name] = u
	return !known
}

// partRepointed is the unsealedInstance part of a row whose columns were
// changed outside muster but whose sealed identity verifies: it is routed
// as muster sealed it.
const partRepointed = "repointed"

// unsealedInstance is an instance row the evaluator did not act on as it
// stands, because muster did not write it so.
type unsealedInstance struct {
	service, zone, address string
	port                   int
	state                  string
	part                   string // "identity" or "end"
	reason                 string
	since                  time.Time
}

// sealed decides, by the row's seals, what applyInstance may do with in:
// it returns the row to apply (an end muster did not write is read away:
// the instance stays, or is read as active at a rebuild), and false when
// the row must be ignored (an identity muster did not write: never
// routed to). Called with e.mu held.
func (e *Evaluator) sealed(in registry.Instance, known bool, now time.Time) (registry.Instance, bool) {
	clean := true
	if !known {
		// Muster ended it, and the row says otherwise: it reads active,
		// or ended by an end muster did not write (which would otherwise
		// be read away as active, below).
		if end, ok := e.replayChecked[in.ID]; ok && (in.State == registry.StateActive || e.verifyEnd(in) != nil) {
			e.noteReplayed(in, end, now)
			return in, false
		}
	}
	delete(e.replays, in.ID) // ended by muster again, or in rotation all along
	if in.State != registry.StateActive {
		if err := e.verifyEnd(in); err != nil {
			e.noteUnsealed(in, "end", err, now)
			if known {
				return in, false // it stays in rotation as it is
			}
			in.State, in.EndedAt, clean = registry.StateActive, nil, false
		}
	}
	if in.State == registry.StateActive && !known {
		if err := e.verifyIdentity(in); err != nil {
			// Re-pointed by hand: routed as muster sealed it, if the
			// identity kept beside the row verifies; otherwise never
			// routed.
			fixed, ferr := e.cfg.Registry.SealedIdentity(in)
			if ferr != nil {
				e.noteUnsealed(in, "identity", err, now)
				return in, false
			}
			e.noteUnsealed(fixed, partRepointed, fmt.Errorf("its row reads %s:%d in %s of %s, but %v", in.Address, in.Port, in.Zone, in.Service, err), now)
			in, clean = fixed, false
		}
	}
	if u, ok := e.unsealed[in.ID]; ok && clean && known && u.part == partRepointed && in.State == registry.StateActive {
		// Routed where muster sealed it: the alarm stays until the row
		// reads so again.
		clean = e.cfg.Registry.VerifyIdentity(in) == nil
	}
	if clean {
		delete(e.unsealed, in.ID) // the row, as it stands, is muster's
	}
	return in, true
}

// AlarmInstanceReplayed is open while an instance row reads 'active'
// although muster has a record of ending it (audit.Ends): its earlier
// bytes were written back by hand. It is not routed.
const AlarmInstanceReplayed = "instance_replayed"

// replayedInstance is an active row muster ended before: not routed.
type replayedInstance struct {
	service, zone, address string
	port                   int
	end                    audit.End
	since                  time.Time
}

// replayCheck asks the registry, in one query, which of batch's rows
// that sealed would put in rotation muster has a record of ending: those
// are replays (an ended row written back), which sealed keeps out of
// rotation. Only rows not in rotation here that read active, or ended by
// an end muster did not seal, are asked about, so a refresh asks about
// the few new ones and a rebuild about every active row, never about the
// rows muster ended (of which there may be millions). pre holds the
// rebuild's seal checks (nil: checked here). It must be called without
// e.mu.
func (e *Evaluator) replayCheck(ctx context.Context, batch []registry.Instance, pre map[uuid.UUID]precheck) (map[uuid.UUID]audit.End, error) {
	e.mu.Lock()
	var ask []registry.Instance
	for _, in := range batch {
		if _, known := e.instances[in.ID]; !known {
			ask = append(ask, in)
		}
	}
	e.mu.Unlock()
	var ids []uuid.UUID
	for _, in := range ask {
		if in.State != registry.StateActive {
			if p, ok := pre[in.ID]; ok && p.hasEnd {
				if p.end == nil {
					continue
				}
			} else if e.cfg.Registry.VerifyEnd(in) == nil {
				continue
			}
		}
		ids = append(ids, in.ID)
	}
	ends, forged, err := e.cfg.Registry.Replayed(ctx, ids)
	if err != nil {
		return nil, err
	}
	if forged > 0 {
		e.log.Error("records of instance ends in the audit log do not verify and are not believed: they were appended outside muster", "records", forged)
	}
	return ends, nil
}

func (e *Evaluator) noteReplayed(in registry.Instance, end audit.End, now time.Time) {
	r := replayedInstance{service: in.Service, zone: in.Zone, address: in.Address, port: in.Port, end: end, since: now}
	if old, seen := e.replays[in.ID]; seen {
		r.since = old.since
	} else {
		e.log.Error("an instance row reads active but muster ended it: its earlier bytes were written back outside muster, so it is not routed",
			"instance", in.ID, "service", in.Service, "address", in.Address, "ended", end.State, "ended_at", end.EndedAt)
	}
	e.replays[in.ID] = r
}

// precheck is a row's seal checks made ahead of applying it.
type precheck struct {
	identity, end       error
	hasIdentity, hasEnd bool
}

// precheck makes, on every core, the seal checks sealed will ask of each
// row of a rebuild's batch: every row is new to a rebuilding evaluator, so
// an active row needs its identity checked, and an ended one its end
// (and, when the end fails, its identity). One check is one Ed25519
// verification (some 40 us), and the rebuild reads every live row (and
// the recently ended ones: load).
func (e *Evaluator) precheck(batch []registry.Instance) map[uuid.UUID]precheck {
	out := make([]precheck, len(batch))
	workers := max(1, min(runtime.GOMAXPROCS(0), len(batch)/64))
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := w; i < len(batch); i += workers {
				in := batch[i]
				p := &out[i]
				if in.State != registry.StateActive {
					p.end, p.hasEnd = e.cfg.Registry.VerifyEnd(in), true
					if p.end == nil {
						continue
					}
				}
				p.identity, p.hasIdentity = e.cfg.Registry.VerifyIdentity(in), true
			}
		})
	}
	wg.Wait()
	m := make(map[uuid.UUID]precheck, len(batch))
	for i, in := range batch {
		m[in.ID] = out[i]
	}
	return m
}

// verifyIdentity and verifyEnd check in's seals, from the rebuild's
// prechecks when they have them. Called with e.mu held.
func (e *Evaluator) verifyIdentity(in registry.Instance) error {
	if p, ok := e.prechecked[in.ID]; ok && p.hasIdentity {
		return p.identity
	}
	return e.cfg.Registry.VerifyIdentity(in)
}

func (e *Evaluator) verifyEnd(in registry.Instance) error {
	if p, ok := e.prechecked[in.ID]; ok && p.hasEnd {
		return p.end
	}
	return e.cfg.Registry.VerifyEnd(in)
}

func (e *Evaluator) noteUnsealed(in registry.Instance, part string, err error, now time.Time) {
	old, seen := e.unsealed[in.ID]
	u := unsealedInstance{service: in.Service, zone: in.Zone, address: in.Address, port: in.Port,
		state: in.State, part: part, reason: err.Error(), since: now}
	if seen && old.part == part {
		u.since = old.since
	} else {
		e.log.Error("an instance row is not acted on as it stands: its seal does not verify, so muster did not write it so",
			"instance", in.ID, "service", in.Service, "address", in.Address, "state", in.State, "part", part, "reason", err)
	}
	e.unsealed[in.ID] = u
}

// SealAlarms lists an instance_unsealed alarm per instance row the
// evaluator did not act on for its seal, and a contract_unsealed alarm per
// service whose stored contract it does not apply, by service.
func (e *Evaluator) SealAlarms() []assembler.Alarm {
	e.mu.Lock()
	var contracts []assembler.Alarm
	for name, u := range e.unsealedContracts {
		applied := fmt.Sprintf("version %d stays applied", u.version)
		if u.version == 0 {
			applied = "the platform defaults are applied"
		}
		contracts = append(contracts, assembler.Alarm{Kind: AlarmContractUnsealed, Service: name, Since: u.since,
			Detail: fmt.Sprintf("the stored health contract of %s is not muster's (%s), so %s; the health_contracts table was written outside muster", name, u.reason, applied)})
	}
	ids := make([]uuid.UUID, 0, len(e.unsealed))
	for id := range e.unsealed {
		ids = append(ids, id)
	}
	out := make([]assembler.Alarm, 0, len(ids))
	for _, id := range ids {
		u := e.unsealed[id]
		what := fmt.Sprintf("its %s is not muster's (%s), so it gets no traffic", u.part, u.reason)
		switch u.part {
		case partRepointed:
			what = fmt.Sprintf("it was re-pointed outside muster (%s), so it is routed where muster sealed it", u.reason)
		case "end":
			what = fmt.Sprintf("it reads %s but its end is not muster's (%s), so it keeps its traffic until muster ends it", u.state, u.reason)
		}
		out = append(out, assembler.Alarm{Kind: AlarmInstanceUnsealed, Service: u.service, Zone: u.zone, Since: u.since,
			Detail: fmt.Sprintf("instance %s (%s:%d): %s; the instances table was written outside muster", id, u.address, u.port, what)})
	}
	for id, r := range e.replays {
		out = append(out, assembler.Alarm{Kind: AlarmInstanceReplayed, Service: r.service, Zone: r.zone, Since: r.since,
			Detail: fmt.Sprintf("instance %s (%s:%d) reads active, but muster ended it (%s at %s, on record in the audit log), so it gets no traffic; the instances table was written back outside muster",
				id, r.address, r.port, r.end.State, r.end.EndedAt.Format(time.RFC3339))})
	}
	e.mu.Unlock()
	out = append(out, contracts...)
	slices.SortFunc(out, func(a, b assembler.Alarm) int {
		return cmp.Or(cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.Service, b.Service), cmp.Compare(a.Detail, b.Detail))
	})
	return out
}

// UnsealedInstances is how many instance rows are not acted on for their
// seal (muster_instances_unsealed).
func (e *Evaluator) UnsealedInstances() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.unsealed)
}

// ReplayedInstances is how many active instance rows are not routed
// because muster ended them before (muster_instances_replayed).
func (e *Evaluator) ReplayedInstances() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.replays)
}

// UnsealedContracts is how many services' stored contracts are not
// applied for their seal (muster_contracts_unsealed).
func (e *Evaluator) UnsealedContracts() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.unsealedContracts)
}
