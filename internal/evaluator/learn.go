package evaluator

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/registry"
)

// Bounds on the on-demand load of instances that reports name (see doc.go).
const (
	// maxLookupIDs is the most unknown ids of one batch looked up in
	// PostgreSQL; the rest are refused as unverified_instance.
	maxLookupIDs = 100
	// maxLookupWait bounds one lookup (less if DBTimeout is shorter), the
	// wait for a lookup slot included.
	maxLookupWait = 500 * time.Millisecond
	// lookupSlots is how many lookups may run at once across all
	// requests, so that reports naming made-up ids cannot take more than
	// that many of the pool's connections.
	lookupSlots = 4
	// missTTL and missCapacity bound the memory of ids found missing or
	// ended. Both facts are permanent (ids are never reused), so the TTL
	// only bounds how long an entry takes room.
	missTTL      = time.Minute
	missCapacity = 16384
)

// Sources of instances loaded outside the registry refresh: the label of
// muster_evaluator_instances_loaded_on_demand_total.
const (
	sourceRegistration = "registration"
	sourceReport       = "report"
)

// InstancesRegistered is the registration hand-off (registry.Config's
// Registered): it applies what a registration on this process just
// committed, as the next registry refresh would, so that the instance is
// known before its workload's first report arrives. Instances it
// replaced are retired in the same step, so a new registration of an
// endpoint never shows beside the old one. A service met for the first
// time is read from PostgreSQL on ctx; if that fails the instance waits
// for the refresh (or the on-demand load of its first report). Before the
// rebuild is done it does nothing: the rebuild or the next refresh reads
// the row.
func (e *Evaluator) InstancesRegistered(ctx context.Context, ins []registry.Instance) {
	if !e.ready.Load() {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, min(maxLookupWait, e.cfg.DBTimeout))
	defer cancel()
	if _, err := e.learn(ctx, ins, sourceRegistration); err != nil {
		e.log.Warn("registration hand-off; the next refresh applies it", "err", err)
	}
}

// learn applies instance rows read outside the refresh, loading the
// contracts of services the evaluator does not know yet. It returns the
// ids of the active rows it could not apply because their service could
// not be read. It must be called without e.mu.
func (e *Evaluator) learn(ctx context.Context, ins []registry.Instance, source string) ([]uuid.UUID, error) {
	var missing []string
	e.mu.Lock()
	for _, in := range ins {
		if _, ok := e.services[in.Service]; in.State == registry.StateActive && !ok && !slices.Contains(missing, in.Service) {
			missing = append(missing, in.Service)
		}
	}
	e.mu.Unlock()
	var (
		scs    []registry.ServiceContract
		svcErr error
	)
	if len(missing) > 0 {
		scs, svcErr = e.cfg.Registry.ServiceContractsNamed(ctx, missing)
	}

	// A row a report names may be an ended one written back to 'active'
	// (a registration's rows are muster's own, just written).
	var replays map[uuid.UUID]audit.End
	var replayErr error
	if source != sourceRegistration {
		replays, replayErr = e.replayCheck(ctx, ins, nil)
	}

	now := e.cfg.Now()
	var skipped []uuid.UUID
	loaded := 0
	e.mu.Lock()
	e.replayChecked = replays
	for _, sc := range scs {
		// A refresh may have applied a newer contract meanwhile.
		if _, ok := e.services[sc.Service.Name]; !ok {
			e.applyService(sc)
		}
	}
	for _, in := range ins {
		_, known := e.instances[in.ID]
		switch {
		case in.State != registry.StateActive:
			e.applyInstance(in, now)
			e.misses.add(in.ID, in.State, now)
		case known:
		case e.misses.ended(in.ID, now) != "":
			// Retired since this row was read: the row is stale.
		case e.services[in.Service] == nil, replayErr != nil:
			skipped = append(skipped, in.ID)
		default:
			e.applyInstance(in, now)
			if _, ok := e.instances[in.ID]; ok {
				loaded++
			}
		}
	}
	e.replayChecked = nil
	e.mu.Unlock()
	e.metrics.loadedOnDemand.WithLabelValues(source).Add(float64(loaded))
	if err := errors.Join(svcErr, replayErr); err != nil {
		return skipped, err
	}
	if len(skipped) > 0 {
		return skipped, fmt.Errorf("services of instances %v not found", skipped)
	}
	return nil, nil
}

// unknownAnswer says why an id a report names stays unknown.
type unknownAnswer struct {
	code, reason string
}

// Results of looking up an unknown id: the label of
// muster_evaluator_instance_lookup_ids_total.
const (
	lookupActive    = "active"
	lookupEnded     = "ended"
	lookupMissing   = "missing"
	lookupCached    = "cached"
	lookupUnchecked = "unchecked"
)

// loadUnknown looks up in PostgreSQL the ids that reports name and the
// evaluator does not know, loads the active ones, and returns why each of
// the others stays unknown. ids are distinct and unknown at the time of
// the call. It must be called without e.mu.
func (e *Evaluator) loadUnknown(ctx context.Context, ids []uuid.UUID) map[uuid.UUID]unknownAnswer {
	now := e.cfg.Now()
	answers := make(map[uuid.UUID]unknownAnswer, len(ids))
	count := func(result string, n int) {
		if n > 0 {
			e.metrics.lookupIDs.WithLabelValues(result).Add(float64(n))
		}
	}
	unchecked := func(ids []uuid.UUID, why string) {
		for _, id := range ids {
			answers[id] = unknownAnswer{codeUnverifiedInstance, fmt.Sprintf("instance %s is not known to this muster yet and could not be looked up (%s); if it was registered a moment ago, report again shortly", id, why)}
		}
		count(lookupUnchecked, len(ids))
	}

	var ask []uuid.UUID
	cached := 0
	for _, id := range ids {
		if state, ok := e.misses.get(id, now); ok {
			answers[id] = missAnswer(id, state)
			cached++
			continue
		}
		ask = append(ask, id)
	}
	count(lookupCached, cached)
	if len(ask) > maxLookupIDs {
		unchecked(ask[maxLookupIDs:], fmt.Sprintf("more than %d unknown instances in one batch", maxLookupIDs))
		ask = ask[:maxLookupIDs]
	}
	if len(ask) == 0 {
		return answers
	}
	if !e.cfg.DatabaseUp() {
		unchecked(ask, "the database is unreachable")
		return answers
	}

	lctx, cancel := context.WithTimeout(ctx, min(maxLookupWait, e.cfg.DBTimeout))
	defer cancel()
	select {
	case e.lookupSlots <- struct{}{}:
		defer func() { <-e.lookupSlots }()
	case <-lctx.Done():
		unchecked(ask, "too many lookups at once")
		return answers
	}
	rows, err := e.cfg.Registry.InstancesByID(lctx, ask)
	if err != nil {
		e.metrics.lookups.WithLabelValues("error").Inc()
		e.log.Debug("look up instances named in a report", "ids", len(ask), "err", err)
		unchecked(ask, "the lookup failed")
		return answers
	}
	e.metrics.lookups.WithLabelValues("ok").Inc()

	found := make(map[uuid.UUID]bool, len(rows))
	ended := 0
	for _, in := range rows {
		found[in.ID] = true
		if in.State != registry.StateActive {
			answers[in.ID] = missAnswer(in.ID, in.State)
			ended++
		}
	}
	count(lookupEnded, ended)
	missing := 0
	for _, id := range ask {
		if !found[id] {
			e.misses.add(id, "", now)
			answers[id] = missAnswer(id, "")
			missing++
		}
	}
	count(lookupMissing, missing)
	skipped, err := e.learn(lctx, rows, sourceReport)
	if err != nil {
		e.log.Debug("load instances named in a report", "err", err)
		unchecked(skipped, "its service could not be read")
	}
	count(lookupActive, len(rows)-ended-len(skipped))
	return answers
}

// missAnswer is the refusal of an id with no instance (state "") or whose
// instance ended.
func missAnswer(id uuid.UUID, state string) unknownAnswer {
	if state == "" {
		return unknownAnswer{codeUnknownInstance, fmt.Sprintf("no instance %s", id)}
	}
	return unknownAnswer{codeUnknownInstance, fmt.Sprintf("instance %s ended (%s); a new registration gets a new id", id, state)}
}

// missCache remembers, for a while, ids that have no instance or whose
// instance ended, so that reports naming them again cost no lookup. It is
// bounded: the oldest entry makes room for a new one.
type missCache struct {
	mu    sync.Mutex
	ttl   time.Duration
	byID  map[uuid.UUID]missEntry
	ring  []uuid.UUID // insertion order; next is the oldest slot
	next  int
	limit int
}

type missEntry struct {
	state string // "" for no instance, else the ended state
	until time.Time
}

func newMissCache(limit int, ttl time.Duration) *missCache {
	return &missCache{ttl: ttl, byID: make(map[uuid.UUID]missEntry), ring: make([]uuid.UUID, 0, limit), limit: limit}
}

// add remembers id as missing (state "") or ended in state.
func (c *missCache) add(id uuid.UUID, state string, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.byID[id]; ok {
		c.byID[id] = missEntry{state: state, until: now.Add(c.ttl)}
		return
	}
	if len(c.ring) < c.limit {
		c.ring = append(c.ring, id)
	} else {
		delete(c.byID, c.ring[c.next])
		c.ring[c.next] = id
		c.next = (c.next + 1) % c.limit
	}
	c.byID[id] = missEntry{state: state, until: now.Add(c.ttl)}
}

// get returns what is remembered of id, if it is still fresh.
func (c *missCache) get(id uuid.UUID, now time.Time) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	m, ok := c.byID[id]
	if !ok || now.After(m.until) {
		return "", false
	}
	return m.state, true
}

// ended returns the state id is remembered to have ended in, or "".
func (c *missCache) ended(id uuid.UUID, now time.Time) string {
	state, _ := c.get(id, now)
	return state
}
