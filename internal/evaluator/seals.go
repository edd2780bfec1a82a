package evaluator

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"

	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/registry"
)

// AlarmInstanceUnsealed is open while an instance row fails its seal
// (registry/seal.go): one inserted or re-pointed outside muster gets no
// traffic, and one ended outside muster keeps its traffic.
const AlarmInstanceUnsealed = "instance_unsealed"

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
	if in.State != registry.StateActive {
		if err := e.cfg.Registry.VerifyEnd(in); err != nil {
			e.noteUnsealed(in, "end", err, now)
			if known {
				return in, false // it stays in rotation as it is
			}
			in.State, in.EndedAt, clean = registry.StateActive, nil, false
		}
	}
	if in.State == registry.StateActive && !known {
		if err := e.cfg.Registry.VerifyIdentity(in); err != nil {
			e.noteUnsealed(in, "identity", err, now)
			return in, false
		}
	}
	if clean {
		delete(e.unsealed, in.ID) // the row, as it stands, is muster's
	}
	return in, true
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

// InstanceAlarms lists an instance_unsealed alarm per instance row the
// evaluator did not act on for its seal, by service and instance.
func (e *Evaluator) InstanceAlarms() []assembler.Alarm {
	e.mu.Lock()
	ids := make([]uuid.UUID, 0, len(e.unsealed))
	for id := range e.unsealed {
		ids = append(ids, id)
	}
	out := make([]assembler.Alarm, 0, len(ids))
	for _, id := range ids {
		u := e.unsealed[id]
		what := fmt.Sprintf("its %s is not muster's (%s), so it gets no traffic", u.part, u.reason)
		if u.part == "end" {
			what = fmt.Sprintf("it reads %s but its end is not muster's (%s), so it keeps its traffic until muster ends it", u.state, u.reason)
		}
		out = append(out, assembler.Alarm{Kind: AlarmInstanceUnsealed, Service: u.service, Zone: u.zone, Since: u.since,
			Detail: fmt.Sprintf("instance %s (%s:%d): %s; the instances table was written outside muster", id, u.address, u.port, what)})
	}
	e.mu.Unlock()
	slices.SortFunc(out, func(a, b assembler.Alarm) int {
		return cmp.Or(cmp.Compare(a.Service, b.Service), cmp.Compare(a.Detail, b.Detail))
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
