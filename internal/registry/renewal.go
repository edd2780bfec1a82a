package registry

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/refusal"
)

// Renewals at scale: a renewal is never lost to a limit.
//
//   - Lease renewals are limited per identity on each replica (the
//     server's Limits.LeaseRenewals), and the limit grows with the live
//     leases the identity registered (LeasesRegisteredBy), so a fleet
//     renewing under one identity at the client's cadence is never
//     refused for its size.
//   - RenewBatch renews up to MaxRenewalBatch leases in one transaction,
//     each decided exactly as a single renewal is.
//   - A renewal refused by a rate limit all the same is noted in memory
//     (NoteRefusedRenewals) and applied later in one statement
//     (FlushRefusedRenewals), as a renewal made when it was refused, once
//     it is checked as a renewal would have been: the refusal shed the
//     request's transaction, not the instance's lease. The lease reaper
//     flushes before each sweep; since the renewal is written to the
//     database, every replica's reaper sees it.

// MaxRenewalBatch bounds the leases one batch renews.
const MaxRenewalBatch = 1000

// LeaseRenewal is one lease a batch renews: the instance and the
// credential presented for it (the zero Credential: none), as a single
// renewal presents it in CredentialHeader.
type LeaseRenewal struct {
	ID         uuid.UUID
	Credential Credential
}

// The outcomes of one renewal of a batch.
const (
	RenewalRenewed = "renewed"
	// RenewalNotFound: no such instance, or one the caller may not see.
	RenewalNotFound  = "not_found"
	RenewalForbidden = "forbidden"
	// RenewalEnded: the instance has ended; register again.
	RenewalEnded = "ended"
	// RenewalNoLease: the instance is reconciled and has no lease.
	RenewalNoLease = "no_lease"
)

// RenewalResult is what became of one renewal of a batch.
type RenewalResult struct {
	InstanceID uuid.UUID `json:"instance_id"`
	Outcome    string    `json:"outcome"`
	// LeaseExpiresAt is the renewed lease's new expiry.
	LeaseExpiresAt *time.Time `json:"lease_expires_at,omitempty"`
	// Detail says why the lease was not renewed.
	Detail string `json:"detail,omitempty"`
}

// CheckRenewalBatch refuses a batch that is empty, holds more than
// MaxRenewalBatch renewals, or names an instance twice, reading nothing.
// Fields are named as in the body of POST /v1/leases/renewals.
func CheckRenewalBatch(renewals []LeaseRenewal) error {
	if len(renewals) == 0 || len(renewals) > MaxRenewalBatch {
		return invalid(fmt.Sprintf("a batch renews 1 to %d leases, got %d", MaxRenewalBatch, len(renewals)),
			[]FieldError{{Field: "renewals", Message: "wrong number of items"}})
	}
	seen := make(map[uuid.UUID]int, len(renewals))
	var fe []FieldError
	for i, rn := range renewals {
		if j, dup := seen[rn.ID]; dup {
			fe = append(fe, FieldError{Field: fmt.Sprintf("renewals[%d].instance_id", i), Message: fmt.Sprintf("instance %s is renewed by renewals[%d] already", rn.ID, j)})
			continue
		}
		seen[rn.ID] = i
	}
	if len(fe) > 0 {
		return invalid("a batch renews each lease once", fe)
	}
	return nil
}

// renewalDecision is what a batch (or a flush of refused renewals)
// decided about one lease.
type renewalDecision struct {
	at              time.Time // the renewal's moment: the lease runs LeaseTTL from it
	proven, without bool
	refused         *refusal.Error // nil: renew
}

// decideRenewal decides a renewal of the lease of cur (nil: no such
// instance), an instance of svc, by actor presenting cred, in the order
// and with the refusals of a single renewal (changeInstance, then
// RenewWithCredential).
func decideRenewal(actor identity.Principal, id uuid.UUID, cur *Instance, svc Service, cred Credential) renewalDecision {
	if cur == nil {
		return renewalDecision{refused: newRefusal(ErrNotFound, "no instance %s", id)}
	}
	if rerr := instanceAccess(actor, *cur, svc); rerr != nil {
		return renewalDecision{refused: rerr}
	}
	if cur.State != StateActive {
		return renewalDecision{refused: newRefusal(ErrGone, "instance %s has ended (%s); register again to get a new instance", id, cur.State)}
	}
	proven, without, rerr := leaseCheck(actor, *cur, cred)
	return renewalDecision{proven: proven, without: without, refused: rerr}
}

// lockForRenewal reads and locks the instances among ids and their
// services, with q (the renewal's transaction).
func (r *Registry) lockForRenewal(ctx context.Context, q *db.Queries, ids []uuid.UUID) (map[uuid.UUID]Instance, map[string]Service, error) {
	rows, err := q.InstanceListByIDsForUpdate(ctx, ids)
	if err != nil {
		return nil, nil, fmt.Errorf("read %d instances to renew: %w", len(ids), err)
	}
	ins := make(map[uuid.UUID]Instance, len(rows))
	names := map[string]bool{}
	for _, row := range rows {
		ins[row.ID] = instanceFromRow(row)
		names[row.Service] = true
	}
	svcRows, err := q.ServiceListByNames(ctx, slices.Collect(maps.Keys(names)))
	if err != nil {
		return nil, nil, fmt.Errorf("read the services of %d instances to renew: %w", len(ids), err)
	}
	svcs := make(map[string]Service, len(svcRows))
	for _, row := range svcRows {
		svcs[row.Name] = r.service(row)
	}
	for name := range names {
		if _, ok := svcs[name]; !ok {
			return nil, nil, fmt.Errorf("read service %s: it has instances but no row", name)
		}
	}
	return ins, svcs, nil
}

// renewDecided renews, in one statement with q, the leases decided
// renewable, each to LeaseTTL from its decision's moment, and returns
// each renewed instance's new expiry. The moments are this replica's
// (now among them), so only their distance from now travels: the lease
// runs what is left of LeaseTTL from the lease clock's now (PostgreSQL's),
// and this replica's skew does not move it.
func (r *Registry) renewDecided(ctx context.Context, q *db.Queries, now time.Time, ids []uuid.UUID, ds []renewalDecision) (map[uuid.UUID]time.Time, error) {
	p := db.LeaseRenewManyParams{At: r.leaseAt()}
	for i, d := range ds {
		if d.refused == nil {
			p.Ids = append(p.Ids, ids[i])
			p.LifetimeUs = append(p.LifetimeUs, (r.cfg.LeaseTTL - max(now.Sub(d.at), 0)).Microseconds())
			p.Proven = append(p.Proven, d.proven)
		}
	}
	out := make(map[uuid.UUID]time.Time, len(p.Ids))
	if len(p.Ids) == 0 {
		return out, nil
	}
	rows, err := q.LeaseRenewMany(ctx, p)
	if err != nil {
		return nil, fmt.Errorf("renew %d leases: %w", len(p.Ids), err)
	}
	for _, row := range rows {
		out[row.ID] = *row.LeaseExpiresAt
	}
	return out, nil
}

// RenewBatch renews many leases at once for actor: each is decided
// exactly as RenewWithCredential decides a single renewal (who may renew,
// the instance's state and lease, its credential), and those let through
// are renewed in one statement, all in one transaction. The results are
// in the order of renewals. As for single renewals, those renewed are not
// audited and each refused one is, as lease.renew on its instance (an
// instance that does not exist is only answered); an instance the caller
// may not see is answered as not found. A batch CheckRenewalBatch refuses
// changes nothing.
func (r *Registry) RenewBatch(ctx context.Context, actor identity.Principal, renewals []LeaseRenewal) ([]RenewalResult, error) {
	if err := CheckRenewalBatch(renewals); err != nil {
		return nil, err
	}
	ids := make([]uuid.UUID, len(renewals))
	for i, rn := range renewals {
		ids[i] = rn.ID
	}
	var (
		ds      []renewalDecision
		renewed map[uuid.UUID]time.Time
	)
	err := r.withTx(ctx, func(q *db.Queries) error {
		ins, svcs, err := r.lockForRenewal(ctx, q, ids)
		if err != nil {
			return err
		}
		now := r.now()
		ds = make([]renewalDecision, len(renewals))
		for i, rn := range renewals {
			var cur *Instance
			if in, ok := ins[rn.ID]; ok {
				cur = &in
			}
			ds[i] = decideRenewal(actor, rn.ID, cur, svcs[ins[rn.ID].Service], rn.Credential)
			ds[i].at = now
		}
		renewed, err = r.renewDecided(ctx, q, now, ids, ds)
		return err
	})
	if err != nil {
		return nil, err
	}
	out := make([]RenewalResult, len(renewals))
	var refused []audit.Entry
	for i, d := range ds {
		res := RenewalResult{InstanceID: ids[i]}
		switch exp, ok := renewed[ids[i]]; {
		case d.refused == nil && ok:
			res.Outcome, res.LeaseExpiresAt = RenewalRenewed, &exp
			if d.without {
				r.metrics.renewalsWithoutCredential.Inc()
			}
		case d.refused == nil:
			// Cannot happen while the row is locked; were it to, the
			// lease was not renewed, and the answer must not say so.
			res.Outcome, res.Detail = RenewalEnded, fmt.Sprintf("instance %s has ended; register again to get a new instance", ids[i])
		default:
			res.Outcome, res.Detail = renewalOutcome(d.refused), d.refused.Detail
			if res.Outcome == RenewalNotFound {
				res.Detail = fmt.Sprintf("no instance %s", ids[i])
			}
			if d.refused.Kind != ErrNotFound { // no such instance: answered, not audited
				r.metrics.refusals.WithLabelValues("lease.renew", d.refused.Kind.Error()).Inc()
				refused = append(refused, audit.Entry{
					ActorKind: actorKind(actor), Actor: actor.String(), Action: "lease.renew",
					TargetKind: "instance", Target: ids[i].String(), Outcome: audit.Refused, Reason: d.refused.Detail,
				})
			}
		}
		out[i] = res
	}
	if len(refused) > 0 {
		// In a transaction of their own, as a single renewal's refusal:
		// the renewals stand whatever becomes of it, and a caller told
		// of a failure retries the batch, which renews again.
		err := r.withTx(ctx, func(q *db.Queries) error {
			now := r.now()
			for _, e := range refused {
				if _, err := audit.Append(ctx, q, now, e); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("audit %d refused renewals: %w", len(refused), err)
		}
	}
	return out, nil
}

// renewalOutcome names a refused renewal's outcome.
func renewalOutcome(rerr *refusal.Error) string {
	if rerr.Kind == errHidden {
		return RenewalNotFound
	}
	switch rerr.Kind.Broad() {
	case ErrNotFound:
		return RenewalNotFound
	case ErrGone:
		return RenewalEnded
	case ErrConflict:
		return RenewalNoLease
	}
	return RenewalForbidden
}

// LeasesRegisteredBy counts the live leases registeredBy (an identity,
// as Principal.String names it) registered: the server sizes the
// identity's renewal limit by it.
func (r *Registry) LeasesRegisteredBy(ctx context.Context, registeredBy string) (int, error) {
	n, err := db.New(r.cfg.Pool).LeaseCountRegisteredBy(ctx, registeredBy)
	if err != nil {
		return 0, fmt.Errorf("count the leases %s registered: %w", registeredBy, err)
	}
	return int(n), nil
}

// LeaseTTL is how long a registration lives without renewal.
func (r *Registry) LeaseTTL() time.Duration { return r.cfg.LeaseTTL }

// Refused renewals are kept per instance, one per identity that asked
// (its latest), for at most maxRefusedActors identities (the oldest
// gives way): one identity getting itself refused for others' instances
// cannot push an instance's own refused renewal out. At most
// maxRefusedRenewals are kept in all; past that, those older than a TTL
// make room. When none is that old, the table is shared between the
// identities that fill it: an identity keeping fewer than the one
// keeping most takes that one's oldest place, and the one keeping most
// gets no more (its refused renewal is not kept, and counted). One
// identity refused for a storm of made-up instance ids therefore fills
// only what the others leave: it never pushes out, nor keeps out, the
// refused renewals of identities holding less than it does, and an
// identity with a large fleet keeps at least an even share against it.
const (
	maxRefusedRenewals = 200_000
	maxRefusedActors   = 4
	// pruneEvery bounds how often a full table is scanned for expired
	// refused renewals: once per second of their age at most.
	pruneEvery = time.Second
)

// refusedRenewal is one renewal a rate limit refused: who asked, with
// what credential, when.
type refusedRenewal struct {
	actor identity.Principal
	key   string // actor.String()
	cred  Credential
	at    time.Time
}

// refusedRenewals are the refused renewals not yet flushed.
type refusedRenewals struct {
	mu   sync.Mutex
	byID map[uuid.UUID][]refusedRenewal
	n    int
	// byActor is each identity's share: how many it keeps, and the
	// instances it noted, oldest first, to give way from.
	byActor map[string]*actorShare
	// pruneAfter: the cutoff a prune waits for, a second past the
	// oldest refused renewal kept at the last one. Before it a prune
	// would find nothing (or next to nothing); without it a full table
	// would be scanned whole for every renewal refused, under the lock
	// every refusal takes. A refused renewal may so be kept up to a
	// second past its TTL, which the flush drops as expired.
	pruneAfter time.Time
}

// actorShare is one identity's part of the refused renewals.
type actorShare struct {
	n int
	// ids are the instances noted, oldest first; an entry whose note
	// has gone since (replaced, pruned) is skipped when giving way.
	ids []uuid.UUID
}

// NoteRefusedRenewals records that a rate limit refused actor's renewal
// of renewals now, before anything was read or checked: the request was
// shed, not the lease. FlushRefusedRenewals applies them once it has
// checked each as a renewal would be. It reads nothing and writes only
// memory; safe for concurrent use.
func (r *Registry) NoteRefusedRenewals(actor identity.Principal, renewals []LeaseRenewal) {
	r.metrics.renewalsRefused.Add(float64(len(renewals)))
	key := actor.String()
	at := r.now()
	rr := &r.refused
	rr.mu.Lock()
	defer rr.mu.Unlock()
	if rr.byID == nil {
		rr.byID = map[uuid.UUID][]refusedRenewal{}
		rr.byActor = map[string]*actorShare{}
	}
	var largest string // the identity keeping most, found when full
	dropped := 0
	for _, rn := range renewals {
		note := refusedRenewal{actor: actor, key: key, cred: rn.Credential, at: at}
		notes := rr.byID[rn.ID]
		if i := slices.IndexFunc(notes, func(n refusedRenewal) bool { return n.key == key }); i >= 0 {
			notes[i] = note // the latest, with the credential it presented
			continue
		}
		if len(notes) >= maxRefusedActors {
			oldest := 0
			for i, n := range notes {
				if n.at.Before(notes[oldest].at) {
					oldest = i
				}
			}
			rr.forget(notes[oldest].key)
			notes[oldest] = note
			rr.push(key, rn.ID)
			continue
		}
		if rr.n >= maxRefusedRenewals && rr.prune(at.Add(-r.cfg.LeaseTTL)) == 0 {
			mine := 0
			if s := rr.byActor[key]; s != nil {
				mine = s.n
			}
			if s := rr.byActor[largest]; s == nil || s.n <= mine+1 {
				largest = rr.largest()
			}
			if s := rr.byActor[largest]; largest == key || s == nil || s.n <= mine+1 {
				dropped++ // it keeps as many as anyone: no more
				continue
			}
			rr.giveWay(largest)
			notes = rr.byID[rn.ID] // giving way may have taken from this instance's
		}
		rr.byID[rn.ID] = append(notes, note)
		rr.n++
		rr.push(key, rn.ID)
	}
	if dropped > 0 {
		r.metrics.refusedRenewals.WithLabelValues("dropped").Add(float64(dropped))
	}
}

// share is key's share, made when it has none. rr.mu is held.
func (rr *refusedRenewals) share(key string) *actorShare {
	s := rr.byActor[key]
	if s == nil {
		s = &actorShare{}
		rr.byActor[key] = s
	}
	return s
}

// forget uncounts a note of key's that has gone. rr.mu is held.
func (rr *refusedRenewals) forget(key string) {
	if s := rr.byActor[key]; s != nil {
		if s.n--; s.n <= 0 {
			delete(rr.byActor, key)
		}
	}
}

// push counts a note of key's on id. rr.mu is held.
func (rr *refusedRenewals) push(key string, id uuid.UUID) {
	s := rr.share(key)
	s.n++
	s.ids = append(s.ids, id)
	if len(s.ids) > 2*s.n+64 {
		rr.compact(key, s)
	}
}

// compact drops the entries of s.ids whose note has gone, and repeats.
// rr.mu is held.
func (rr *refusedRenewals) compact(key string, s *actorShare) {
	seen := make(map[uuid.UUID]bool, s.n)
	s.ids = slices.DeleteFunc(s.ids, func(id uuid.UUID) bool {
		if seen[id] || !slices.ContainsFunc(rr.byID[id], func(x refusedRenewal) bool { return x.key == key }) {
			return true
		}
		seen[id] = true
		return false
	})
}

// largest names the identity keeping most refused renewals. rr.mu is
// held.
func (rr *refusedRenewals) largest() string {
	best, n := "", -1
	for k, s := range rr.byActor {
		if s.n > n {
			best, n = k, s.n
		}
	}
	return best
}

// giveWay drops key's oldest kept refused renewal. rr.mu is held.
func (rr *refusedRenewals) giveWay(key string) {
	s := rr.byActor[key]
	for len(s.ids) > 0 {
		id := s.ids[0]
		s.ids = s.ids[1:]
		notes := rr.byID[id]
		i := slices.IndexFunc(notes, func(x refusedRenewal) bool { return x.key == key })
		if i < 0 {
			continue // gone since
		}
		if notes = slices.Delete(notes, i, i+1); len(notes) == 0 {
			delete(rr.byID, id)
		} else {
			rr.byID[id] = notes
		}
		rr.n--
		rr.forget(key)
		return
	}
}

// prune drops the refused renewals made by cutoff (they could no longer
// keep their lease) and returns how many. rr.mu is held.
func (rr *refusedRenewals) prune(cutoff time.Time) int {
	if cutoff.Before(rr.pruneAfter) {
		return 0 // none kept is that old
	}
	n := 0
	var oldest time.Time
	for id, notes := range rr.byID {
		kept := slices.DeleteFunc(notes, func(x refusedRenewal) bool {
			if !x.at.After(cutoff) {
				rr.forget(x.key)
				return true
			}
			return false
		})
		for _, x := range kept {
			if oldest.IsZero() || x.at.Before(oldest) {
				oldest = x.at
			}
		}
		n += len(notes) - len(kept)
		if len(kept) == 0 {
			delete(rr.byID, id)
		} else {
			rr.byID[id] = kept
		}
	}
	for k, s := range rr.byActor {
		if len(s.ids) > 2*s.n+64 {
			rr.compact(k, s)
		}
	}
	rr.n -= n
	rr.pruneAfter = time.Time{}
	if !oldest.IsZero() {
		rr.pruneAfter = oldest.Add(pruneEvery)
	}
	return n
}

// take removes and returns every refused renewal kept.
func (rr *refusedRenewals) take() map[uuid.UUID][]refusedRenewal {
	rr.mu.Lock()
	defer rr.mu.Unlock()
	out := rr.byID
	rr.byID, rr.byActor, rr.n, rr.pruneAfter = nil, nil, 0, time.Time{}
	return out
}

// putBack keeps again the refused renewals a failed flush took.
func (rr *refusedRenewals) putBack(notes map[uuid.UUID][]refusedRenewal) {
	rr.mu.Lock()
	defer rr.mu.Unlock()
	if rr.byID == nil {
		rr.byID = map[uuid.UUID][]refusedRenewal{}
		rr.byActor = map[string]*actorShare{}
	}
	rr.pruneAfter = time.Time{} // older ones are back
	for id, ns := range notes {
		for _, n := range ns {
			cur := rr.byID[id]
			if len(cur) >= maxRefusedActors || slices.ContainsFunc(cur, func(x refusedRenewal) bool { return x.key == n.key }) {
				continue // a newer one arrived meanwhile
			}
			rr.byID[id] = append(cur, n)
			rr.n++
			rr.push(n.key, id)
		}
	}
}

// RefusedRenewalsPending counts the refused renewals kept and not yet
// flushed.
func (r *Registry) RefusedRenewalsPending() int {
	r.refused.mu.Lock()
	defer r.refused.mu.Unlock()
	return r.refused.n
}

// FlushRefusedRenewals applies the renewals a rate limit refused
// (NoteRefusedRenewals) and returns how many leases it renewed. Each is
// decided as a renewal by its identity with its credential would have
// been (RenewWithCredential's rules, so a refused request for someone
// else's instance keeps nothing) and renews its lease to LeaseTTL from
// the moment it was refused, never shortening one renewed since; of the
// refused renewals of one instance, the latest that is allowed counts.
// Those that are not allowed are dropped and counted, not audited (they
// were never read, and a flood of them must not become audit rows).
// Refused renewals older than LeaseTTL are dropped: they could no
// longer have kept their lease. All in one transaction; when it fails,
// the refused renewals are kept for the next flush.
//
// The lease reaper calls it at the start of each sweep, on every
// replica: each flushes its own.
func (r *Registry) FlushRefusedRenewals(ctx context.Context) (int, error) {
	notes := r.refused.take()
	if len(notes) == 0 {
		return 0, nil
	}
	now := r.now()
	stale := 0
	ids := make([]uuid.UUID, 0, len(notes))
	for id, ns := range notes {
		kept := slices.DeleteFunc(ns, func(x refusedRenewal) bool { return !x.at.Add(r.cfg.LeaseTTL).After(now) })
		stale += len(ns) - len(kept)
		if len(kept) == 0 {
			delete(notes, id)
			continue
		}
		// The latest first: it is the one that counts when allowed.
		slices.SortFunc(kept, func(a, b refusedRenewal) int { return b.at.Compare(a.at) })
		notes[id] = kept
		ids = append(ids, id)
	}
	if stale > 0 {
		r.metrics.refusedRenewals.WithLabelValues("expired").Add(float64(stale))
	}
	if len(ids) == 0 {
		return 0, nil
	}
	slices.SortFunc(ids, func(a, b uuid.UUID) int { return slices.Compare(a[:], b[:]) })
	var (
		ds      []renewalDecision
		renewed map[uuid.UUID]time.Time
	)
	err := r.withTx(ctx, func(q *db.Queries) error {
		ins, svcs, err := r.lockForRenewal(ctx, q, ids)
		if err != nil {
			return err
		}
		ds = make([]renewalDecision, len(ids))
		for i, id := range ids {
			var cur *Instance
			if in, ok := ins[id]; ok {
				cur = &in
			}
			for _, n := range notes[id] {
				d := decideRenewal(n.actor, id, cur, svcs[ins[id].Service], n.cred)
				d.at = n.at
				if ds[i] = d; d.refused == nil {
					break
				}
			}
		}
		renewed, err = r.renewDecided(ctx, q, r.now(), ids, ds)
		return err
	})
	if err != nil {
		r.refused.putBack(notes)
		return 0, fmt.Errorf("apply %d refused renewals: %w", len(ids), err)
	}
	for i, d := range ds {
		if _, ok := renewed[ids[i]]; ok && d.without {
			r.metrics.renewalsWithoutCredential.Inc()
		}
	}
	r.metrics.refusedRenewals.WithLabelValues("renewed").Add(float64(len(renewed)))
	r.metrics.refusedRenewals.WithLabelValues("refused").Add(float64(len(ids) - len(renewed)))
	return len(renewed), nil
}
