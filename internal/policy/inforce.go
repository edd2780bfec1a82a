package policy

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/evaluator"
	"github.com/musterhq/muster/internal/seal"
	"github.com/musterhq/muster/internal/worker"
)

// InForce is this process's copy of the overrides in force: the one
// place the rest of muster reads them from. Policy's table is the truth;
// InForce follows it and feeds the assembler's input directly (Applied,
// which the publisher and the drain budget read), and the evaluator reads
// it for what it shows and counts (evaluator.OverrideSource).
//
// It refreshes on its own worker: every RefreshEvery (other replicas'
// changes), at once when this process's policy Service committed a change
// (signal), and it drops an override whose time is up on the next tick
// (or the next ServicesChangedSince) even before the sweeper has marked it
// expired. While PostgreSQL is away it keeps the copy it has: an outage
// never lifts or imposes an override. It is built before the evaluator,
// the policy Service and the publisher, and calls none of them.
//
// With seal keys configured (Keys) it applies only the rows whose seal
// verifies (seal.go): a row muster did not put in force is left out of
// the copy, listed by Unsealed and counted in muster_overrides_unsealed.
// A sealed row muster has a record of ending (lifted or expired, then
// written back by hand) is left out too, listed by Replayed and counted
// in muster_overrides_replayed (seal.go).
type InForce struct {
	cfg InForceConfig
	log *slog.Logger

	local   chan struct{} // this process committed a change
	updated chan struct{} // the copy changed (the publisher listens)
	runner  worker.Runner
	// refreshing serialises Refresh (the worker's and a committing
	// request's): each read is applied after the one started before it,
	// so an older read can never overwrite a newer one.
	refreshing sync.Mutex

	mu         sync.RWMutex
	loaded     bool
	byInstance map[uuid.UUID]evaluator.Override
	rev        uint64
	// changedAt is, per service, the revision at which its overrides
	// last changed.
	changedAt map[string]uint64
	// unsealed are the rows in force at the last read whose seal did
	// not verify, by override id.
	unsealed map[uuid.UUID]Unsealed
	// replays are the rows in force at the last read, sealed, that muster
	// has a record of ending (seal.go): written back by hand.
	replays map[uuid.UUID]Unsealed
	// seals remembers the seals that verified at the last read, so a
	// refresh (every second) verifies only rows that changed.
	seals seal.Memo
}

// Unsealed is a row of the overrides table in force by its state but not
// applied: its seal does not verify, so muster did not put it there.
type Unsealed struct {
	ID         uuid.UUID `json:"id"`
	InstanceID uuid.UUID `json:"instance_id"`
	Service    string    `json:"service"`
	Action     string    `json:"action"`
	Actor      string    `json:"actor"` // as the row claims
	Reason     string    `json:"reason"`
	// Kept: muster applied this override verified before its row stopped
	// verifying, and keeps applying the copy it verified.
	Kept bool `json:"kept,omitempty"`
	// Since is when this process first read it.
	Since time.Time `json:"since"`
}

// AlarmOverrideUnsealed is open while a row of the overrides table is in
// force by its state but not applied, because its seal does not verify.
const AlarmOverrideUnsealed = "override_unsealed"

// InForceConfig configures an InForce.
type InForceConfig struct {
	Pool *pgxpool.Pool
	// Now is the clock overrides expire on; time.Now when nil.
	Now func() time.Time
	// RefreshEvery is how often the copy is re-read: 1 s, as the
	// evaluator follows the registry.
	RefreshEvery time.Duration
	// Timeout bounds each read: 5 s.
	Timeout time.Duration
	// DatabaseUp, when set, says whether a read is worth trying.
	DatabaseUp func() bool
	// Keys are the keys seals are trusted from (SealKeys.With the
	// Sealer). Empty: every row in force is applied, as the database says.
	Keys SealKeys
	// Trust, when set, is verified against instead of Keys (seal.Trust:
	// a keyless replica's is sealed once the region's rows are).
	Trust  *seal.Trust
	Logger *slog.Logger
	// Registerer, when set, receives muster_overrides_unsealed.
	Registerer prometheus.Registerer
}

// NewInForce returns an InForce that has loaded nothing yet.
func NewInForce(cfg InForceConfig) *InForce {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.RefreshEvery <= 0 {
		cfg.RefreshEvery = time.Second
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 5 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	f := &InForce{
		cfg: cfg, log: cfg.Logger.With("component", "overrides-in-force"),
		local: make(chan struct{}, 1), updated: make(chan struct{}, 1),
		byInstance: map[uuid.UUID]evaluator.Override{}, changedAt: map[string]uint64{},
		unsealed: map[uuid.UUID]Unsealed{}, replays: map[uuid.UUID]Unsealed{},
	}
	if cfg.Registerer != nil {
		// A second registration (two InForce on one registry) keeps the first.
		_ = cfg.Registerer.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "muster_overrides_unsealed",
			Help: "Rows of the overrides table in force by their state that muster does not apply because their seal does not verify: written outside muster (docs/overrides.md: what muster writes is sealed). Anything above 0 deserves a look.",
		}, func() float64 {
			f.mu.RLock()
			defer f.mu.RUnlock()
			return float64(len(f.unsealed))
		}))
		_ = cfg.Registerer.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "muster_overrides_replayed",
			Help: "Rows of the overrides table in force by their state, sealed, that muster does not apply because it has a record of ending them (the audit log's end.record): a lifted or expired override written back outside muster (docs/keys.md: replays). Anything above 0 deserves a look.",
		}, func() float64 {
			f.mu.RLock()
			defer f.mu.RUnlock()
			return float64(len(f.replays))
		}))
	}
	return f
}

// Start loads the copy once before it returns (so the first views after
// a restart already carry every override), then refreshes it in the
// background. A failed first load is retried by the worker: until one
// succeeds, Loaded is false and the publisher assembles nothing.
func (f *InForce) Start(ctx context.Context) error {
	if err := f.Refresh(ctx); err != nil {
		f.log.Warn("first load of the overrides in force failed; retrying", "err", err)
	}
	return f.runner.Start(ctx, f.run)
}

// Stop stops the worker.
func (f *InForce) Stop() { f.runner.Stop() }

func (f *InForce) run(ctx context.Context) {
	tick := time.NewTicker(f.cfg.RefreshEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-f.local:
		}
		if f.cfg.DatabaseUp != nil && !f.cfg.DatabaseUp() && f.Loaded() {
			f.expire(f.cfg.Now())
			continue // the copy stands until PostgreSQL answers again
		}
		if err := f.Refresh(ctx); err != nil && ctx.Err() == nil {
			f.log.Warn("refresh the overrides in force", "err", err)
			f.expire(f.cfg.Now())
		}
	}
}

// Refresh re-reads the overrides in force and records which services'
// overrides changed. On an error the copy is kept as it was.
func (f *InForce) Refresh(ctx context.Context) error {
	f.refreshing.Lock()
	defer f.refreshing.Unlock()
	ctx, cancel := context.WithTimeout(ctx, f.cfg.Timeout)
	defer cancel()
	now := f.cfg.Now()
	rows, err := db.New(f.cfg.Pool).OverrideListInForce(ctx, now)
	if err != nil {
		return fmt.Errorf("list overrides in force: %w", err)
	}
	ended, forged, err := replayed(ctx, db.New(f.cfg.Pool), f.keys(), rows)
	if err != nil {
		return err
	}
	if forged > 0 {
		f.log.Error("records of override ends in the audit log do not verify and are not believed: they were appended outside muster", "records", forged)
	}
	next := make(map[uuid.UUID]evaluator.Override, len(rows))
	unsealed := map[uuid.UUID]Unsealed{}
	// What this process applied, verified, by override id: a row of one
	// of those that stops verifying (changed outside muster, or re-sealed
	// by a key this replica does not trust) keeps the copy muster
	// verified, until it expires by that copy or leaves the table's
	// overrides in force (lifted, expired).
	f.mu.RLock()
	applied := make(map[uuid.UUID]evaluator.Override, len(f.byInstance))
	for _, o := range f.byInstance {
		applied[o.ID] = o
	}
	f.mu.RUnlock()
	replays := map[uuid.UUID]Unsealed{}
	f.seals.Next()
	for _, r := range rows {
		if err := f.seals.Verify(f.keysFor(r.Seal, r.SealKey), sealDomain, sealedOf(r), r.Seal, r.SealKey); err != nil {
			u := Unsealed{ID: r.ID, InstanceID: r.InstanceID, Service: r.Service,
				Action: r.Action, Actor: r.Actor, Reason: err.Error(), Since: now}
			if o, ok := applied[r.ID]; ok && now.Before(o.ExpiresAt) && !isEnded(ended, r.ID) {
				u.InstanceID, u.Service, u.Action, u.Actor = o.InstanceID, o.Service, o.Action, o.Actor
				u.Kept = true
				next[o.InstanceID] = o
			}
			unsealed[r.ID] = u
			continue
		}
		if end, ok := ended[r.ID]; ok {
			replays[r.ID] = Unsealed{ID: r.ID, InstanceID: r.InstanceID, Service: r.Service, Action: r.Action, Actor: r.Actor,
				Reason: fmt.Sprintf("muster ended it (%s at %s, on record in the audit log)", end.State, end.EndedAt.Format(time.RFC3339)), Since: now}
			continue
		}
		o := evaluator.Override{
			ID: r.ID, InstanceID: r.InstanceID, Service: r.Service, Action: r.Action,
			Actor: r.Actor, Justification: r.Justification, ExpiresAt: r.ExpiresAt,
		}
		if r.Cosigner != nil {
			o.Cosigner = *r.Cosigner
		}
		next[o.InstanceID] = o
	}
	f.mu.Lock()
	changed := map[string]struct{}{}
	for id, o := range f.byInstance {
		if n, ok := next[id]; !ok || n != o {
			changed[o.Service] = struct{}{}
		}
	}
	for id, o := range next {
		if old, ok := f.byInstance[id]; !ok || old != o {
			changed[o.Service] = struct{}{}
		}
	}
	f.byInstance = next
	for id, u := range unsealed {
		if old, seen := f.unsealed[id]; seen {
			u.Since = old.Since
			unsealed[id] = u
		} else {
			f.log.Error("an override in force by the table is not applied: its seal does not verify, so muster did not put it there",
				"override", id, "instance", u.InstanceID, "service", u.Service, "action", u.Action, "claimed_actor", u.Actor, "reason", u.Reason)
		}
	}
	f.unsealed = unsealed
	for id, u := range replays {
		if old, seen := f.replays[id]; seen {
			u.Since = old.Since
			replays[id] = u
		} else {
			f.log.Error("an override in force by the table is not applied: muster ended it, so its row was written back outside muster",
				"override", id, "instance", u.InstanceID, "service", u.Service, "action", u.Action, "claimed_actor", u.Actor, "reason", u.Reason)
		}
	}
	f.replays = replays
	first := !f.loaded
	f.loaded = true
	f.note(changed)
	f.mu.Unlock()
	if len(changed) > 0 || first {
		f.notify()
	}
	return nil
}

// expire drops the overrides whose time is up at now.
func (f *InForce) expire(now time.Time) {
	f.mu.Lock()
	changed := map[string]struct{}{}
	for id, o := range f.byInstance {
		if !now.Before(o.ExpiresAt) {
			delete(f.byInstance, id)
			changed[o.Service] = struct{}{}
		}
	}
	f.note(changed)
	f.mu.Unlock()
	if len(changed) > 0 {
		f.notify()
	}
}

// note records services whose overrides changed at a new revision.
// Called with f.mu held.
func (f *InForce) note(changed map[string]struct{}) {
	if len(changed) == 0 {
		return
	}
	f.rev++
	for s := range changed {
		f.changedAt[s] = f.rev
	}
}

func (f *InForce) notify() {
	select {
	case f.updated <- struct{}{}:
	default:
	}
}

// signal tells the worker that this process committed a change: it
// re-reads at once.
func (f *InForce) signal() {
	select {
	case f.local <- struct{}{}:
	default:
	}
}

// Loaded reports whether the copy has been read at least once.
func (f *InForce) Loaded() bool {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.loaded
}

// Unsealed returns the rows in force by the table at the last read that
// are not applied because their seal does not verify, oldest first.
func (f *InForce) Unsealed() []Unsealed {
	f.mu.RLock()
	out := slices.Collect(maps.Values(f.unsealed))
	f.mu.RUnlock()
	slices.SortFunc(out, func(a, b Unsealed) int { return strings.Compare(a.ID.String(), b.ID.String()) })
	return out
}

// Replayed returns the rows in force by the table at the last read that
// are not applied because muster has a record of ending them, oldest
// first; Reason says how they ended.
func (f *InForce) Replayed() []Unsealed {
	f.mu.RLock()
	out := slices.Collect(maps.Values(f.replays))
	f.mu.RUnlock()
	slices.SortFunc(out, func(a, b Unsealed) int { return strings.Compare(a.ID.String(), b.ID.String()) })
	return out
}

// AlarmOverrideReplayed is open while a row of the overrides table is in
// force by its state, with a seal that verifies, but not applied because
// muster has a record of ending it: its earlier bytes were written back.
const AlarmOverrideReplayed = "override_replayed"

// Alarms returns an override_unsealed alarm for each row Unsealed lists
// and an override_replayed alarm for each row Replayed lists: someone
// wrote the overrides table outside muster.
func (f *InForce) Alarms() []assembler.Alarm {
	var out []assembler.Alarm
	for _, u := range f.Replayed() {
		out = append(out, assembler.Alarm{Kind: AlarmOverrideReplayed, Service: u.Service, Since: u.Since,
			Detail: fmt.Sprintf("override %s (%s of instance %s, in the name of %s) is in force by the overrides table but not applied: %s; the table was written back outside muster",
				u.ID, u.Action, u.InstanceID, u.Actor, u.Reason)})
	}
	for _, u := range f.Unsealed() {
		d := fmt.Sprintf("override %s (%s of instance %s, in the name of %s) is in force by the overrides table but not applied: %s; the table was written outside muster",
			u.ID, u.Action, u.InstanceID, u.Actor, u.Reason)
		if u.Kept {
			d = fmt.Sprintf("override %s (%s of instance %s, in the name of %s) no longer verifies (%s), but muster applied it verified, so that copy stays applied until it expires or is lifted; the table was written outside muster, or re-sealed by a key this replica does not trust",
				u.ID, u.Action, u.InstanceID, u.Actor, u.Reason)
		}
		out = append(out, assembler.Alarm{Kind: AlarmOverrideUnsealed, Service: u.Service, Since: u.Since, Detail: d})
	}
	return out
}

// Changed receives a value after the copy changed (one value may stand
// for several changes); it never blocks the worker.
func (f *InForce) Changed() <-chan struct{} { return f.updated }

// ServicesChangedSince returns the services whose overrides changed after
// revision rev (expiring those whose time is up first; rev 0 is before
// the first load), and the current revision to pass next time.
func (f *InForce) ServicesChangedSince(rev uint64) ([]string, uint64) {
	f.expire(f.cfg.Now())
	f.mu.RLock()
	defer f.mu.RUnlock()
	if rev >= f.rev {
		return nil, f.rev
	}
	var out []string
	for s, at := range f.changedAt {
		if at > rev {
			out = append(out, s)
		}
	}
	slices.Sort(out)
	return out, f.rev
}

// For returns the override in force for an instance at now.
func (f *InForce) For(id uuid.UUID, now time.Time) (evaluator.Override, bool) {
	f.mu.RLock()
	o, ok := f.byInstance[id]
	f.mu.RUnlock()
	if !ok || !now.Before(o.ExpiresAt) {
		return evaluator.Override{}, false
	}
	return o, true
}

// All returns every override in force at now, by instance.
func (f *InForce) All(now time.Time) map[uuid.UUID]evaluator.Override {
	f.mu.RLock()
	out := maps.Clone(f.byInstance)
	f.mu.RUnlock()
	maps.DeleteFunc(out, func(_ uuid.UUID, o evaluator.Override) bool { return !now.Before(o.ExpiresAt) })
	return out
}

// OverrideCount is how many of a service's instances overrides hold out of
// (Out) or force into (In) rotation.
type OverrideCount struct{ Out, In int }

// Counts returns, per service, how many instances an override in force
// marks ineligible (Out) and eligible (In). Verdicts and their counts stay
// the instances' own; these say how far the views differ from them.
func (f *InForce) Counts() map[string]OverrideCount {
	out := map[string]OverrideCount{}
	for _, o := range f.All(f.cfg.Now()) {
		c := out[o.Service]
		if Action(o.Action) == MarkEligible {
			c.In++
		} else {
			c.Out++
		}
		out[o.Service] = c
	}
	return out
}

// Apply sets each instance's override in force at now on in, the
// assembler's input: this is how overrides reach the views.
func (f *InForce) Apply(in *assembler.ServiceInput, now time.Time) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	for i := range in.Instances {
		x := &in.Instances[i]
		if x.LeaseExpired {
			continue // ended by the registry: kept only by a tripped guard, and no override brings it back
		}
		if o, ok := f.byInstance[x.ID]; ok && now.Before(o.ExpiresAt) {
			x.Override = &assembler.Override{ID: o.ID, Action: o.Action, Reason: o.Reason()}
		}
	}
}

// Applied is a snapshot source with the overrides in force applied: the
// evaluator's verdicts as the assembler takes them. The publisher and the
// drain budget read it, so a view and a budget count the same overrides.
type Applied struct {
	Verdicts Verdicts
	InForce  *InForce
	// Now is the clock overrides expire on.
	Now func() time.Time
}

// Snapshot returns the service's input with the overrides applied; false
// while the evaluator has none, or before the copy has been loaded.
func (a Applied) Snapshot(service string) (assembler.ServiceInput, bool) {
	in, ok := a.Verdicts.Snapshot(service)
	if !ok {
		return in, false
	}
	if !a.InForce.Loaded() {
		return assembler.ServiceInput{}, false
	}
	a.InForce.Apply(&in, a.Now())
	return in, true
}

// isEnded says whether muster's record of ends names override id.
func isEnded[V any](ended map[uuid.UUID]V, id uuid.UUID) bool {
	_, ok := ended[id]
	return ok
}

// keys are the keys to verify with now: Trust's when set.
func (f *InForce) keys() SealKeys {
	if f.cfg.Trust != nil {
		return f.cfg.Trust.Keys()
	}
	return f.cfg.Keys
}

// keysFor are the keys to verify a row sealed by sig and keyID with
// (Trust.For: a sealed row seals a keyless replica's trust).
func (f *InForce) keysFor(sig []byte, keyID *string) SealKeys {
	if f.cfg.Trust != nil {
		return f.cfg.Trust.For(sig, keyID)
	}
	return f.cfg.Keys
}
