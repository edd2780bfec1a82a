package ownership

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/seal"
	"github.com/musterhq/muster/internal/worker"
)

// Defaults of Config (see doc.go, "Timing", for why these).
const (
	DefaultTTL      = 7 * time.Second
	DefaultInterval = 2 * time.Second
	DefaultMargin   = time.Second
	// DefaultOfferPoll is how often a replica looks, between rounds, for
	// shards offered to it and for the takes of those it offered: a
	// handover then costs a fraction of a second, not a round.
	DefaultOfferPoll = 250 * time.Millisecond

	// ShareTakenWithin bounds, at the defaults, how long a replica that
	// has become ready (Config.Ready) waits for its share of the shards:
	// its next round's heartbeat tells the others it is ready (within an
	// Interval), each holder's next round after that offers it their
	// excess (within another), and its next look at the offers takes them
	// (within an OfferPoll); each round's own database work comes on top.
	// A rolling restart that moves to the next replica sooner may stop a
	// replica before the shards it would hand over have anywhere to go
	// but the replicas left: the chart's minReadySeconds exceeds this
	// with a margin.
	ShareTakenWithin = 2*DefaultInterval + DefaultOfferPoll
)

// pruneAfter is how long a replica's row outlives its last heartbeat, for
// the operators' view of recent replicas.
const pruneAfter = time.Hour

// stale stands, in what Balance is given, for this replica's own name on
// a lease it did not take in this process (an earlier process under the
// same id, or a tenure it has dropped): held by someone who is not live,
// so nobody's to take until the database's clock frees it. A NUL byte
// never appears in a replica id (PostgreSQL text cannot hold one).
const stale = "\x00"

// ErrNotOwner is returned by Fence when this replica does not hold the
// shard under the given epoch: it never took it, it lost it, or a newer
// owner has taken it since.
var ErrNotOwner = errors.New("not the shard's owner")

// Config configures a Manager.
type Config struct {
	Pool *pgxpool.Pool
	// ID names this replica in the region. It must be unique among the
	// running processes: two processes under one id never hold one
	// tenure (every change names its epoch), but each counts the other's
	// shards as its own in the balance.
	ID string
	// Address is where peers reach this replica (for relaying, later);
	// Region names its region. Both are informational here.
	Address, Region string
	// TTL is how long a lease lasts past its last renewal, by the
	// database's clock (DefaultTTL). A dead replica's shards are free
	// after at most TTL and taken within one Interval after that.
	TTL time.Duration
	// Interval between rounds: renew, heartbeat, balance (DefaultInterval).
	Interval time.Duration
	// Margin is how much sooner than the database this replica gives up
	// a lease it cannot renew (DefaultMargin): its local deadline is the
	// time it sent the last renewal that landed, plus TTL, minus Margin.
	// It absorbs the local clock's drift over a TTL, how late the
	// deadline is noticed (Margin/4 at most), and the OnChange callbacks.
	Margin time.Duration
	Logger *slog.Logger
	// Registerer receives the manager's metrics; nil registers nowhere.
	Registerer prometheus.Registerer
	// Now is the local clock (time.Now): local deadlines only, never
	// compared with a time the database wrote.
	Now func() time.Time
	// Ready says whether this replica can publish what it would be dealt
	// (rebuilt, its publisher prepared, its peers' views relayed). Until
	// it does, its heartbeat says so and the balance deals it nothing,
	// so a starting replica never holds shards it cannot publish. nil is
	// always ready.
	Ready func() bool
	// OfferPoll is how often offers are looked at between rounds
	// (DefaultOfferPoll).
	OfferPoll time.Duration
	// OfferTimeout is how long an offer may stay untaken before its
	// replica is dealt nothing for UnresponsiveFor (3 Intervals by
	// default): a replica that cannot or will not take offers (an earlier
	// release, a row with no process behind it) must not keep shards
	// offered, and so without an owner's writes, for long.
	OfferTimeout time.Duration
	// UnresponsiveFor is how long such a replica is dealt nothing (one
	// minute by default).
	UnresponsiveFor time.Duration
	// Sealer seals this replica's row of table replicas (its id,
	// address, region and incarnation) with the region's key, and Trust
	// is what the rows' seals are believed from (members.go): a row whose
	// seal does not verify is not believed. Without a Sealer rows are
	// written unsealed, and with a nil Trust every row is believed (a
	// keyless region).
	Sealer seal.Signer
	Trust  *seal.Trust
	// BelieveUnsealed also believes rows that carry no seal at all
	// (MUSTER_PEER_TRUST=upgrade: a replica of the release before seals
	// nothing). A seal that does not verify is never believed.
	BelieveUnsealed bool
	// AllowHTTP believes rows whose address is plain http on a host that
	// is not loopback (MUSTER_PEER_ALLOW_HTTP; a lab).
	AllowHTTP bool
	// HandoverGrace is how long a replica goes on publishing a shard it
	// handed over after the taker took it (Publishes), unless the
	// publisher sees the new owner's publication first (DefaultTTL: the
	// time a killed owner's shards take to move, so a new owner that
	// fails to publish is no worse than a killed one). 0 means TTL.
	HandoverGrace time.Duration
}

// Validate checks the configuration and fills defaults.
func (c *Config) Validate() error {
	switch {
	case c.Pool == nil:
		return errors.New("ownership: Pool is required")
	case c.ID == "":
		return errors.New("ownership: ID is required")
	case strings.ContainsRune(c.ID, 0):
		return errors.New("ownership: ID must not contain a NUL byte")
	case c.TTL < 0 || c.Interval < 0 || c.Margin < 0:
		return errors.New("ownership: TTL, Interval and Margin must not be negative")
	}
	if c.TTL == 0 {
		c.TTL = DefaultTTL
	}
	if c.Interval == 0 {
		c.Interval = DefaultInterval
	}
	if c.Margin == 0 {
		c.Margin = DefaultMargin
	}
	if c.OfferPoll <= 0 {
		c.OfferPoll = DefaultOfferPoll
	}
	if c.OfferTimeout <= 0 {
		c.OfferTimeout = 3 * c.Interval
	}
	if c.UnresponsiveFor <= 0 {
		c.UnresponsiveFor = time.Minute
	}
	if c.HandoverGrace <= 0 {
		c.HandoverGrace = c.TTL
	}
	// Two renewals must fit before the local deadline, so that one
	// failed round never costs a shard.
	if 2*c.Interval > c.TTL-c.Margin {
		return fmt.Errorf("ownership: TTL (%s) must be at least twice Interval (%s) plus Margin (%s)", c.TTL, c.Interval, c.Margin)
	}
	if c.TTL%time.Millisecond != 0 {
		return fmt.Errorf("ownership: TTL (%s) must be whole milliseconds", c.TTL)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return nil
}

// offer is one shard this replica offers, to whom and since when (local
// clock).
type offer struct {
	to    string
	since time.Time
}

// tenure is one shard this process took and holds.
type tenure struct {
	epoch    uint64
	since    time.Time // acquired_at: the database's clock
	expires  time.Time // expires_at after the last renewal: the database's clock
	renewed  time.Time // local: when the last renewal that landed was sent
	deadline time.Time // local: renewed + TTL - Margin
}

// Manager keeps this replica's share of the shards: it heartbeats,
// renews what it holds, takes what the balance gives it and releases the
// excess, every Interval. See doc.go for the protocol and its fencing
// argument.
type Manager struct {
	cfg  Config
	log  *slog.Logger
	met  *metrics
	loop worker.Runner // the rounds
	dog  worker.Runner // the local deadlines, apart from the rounds
	poll worker.Runner // the offers, between rounds

	runMu  sync.Mutex // serialises rounds and Release
	joined bool       // a heartbeat since the start (or the last Release); under runMu

	emitMu sync.Mutex // serialises state changes with their callbacks

	mu        sync.Mutex
	shards    int // 0 until the first read of shard_leases
	held      map[int]*tenure
	abandoned map[int]uint64 // tenures this process took and dropped locally, perhaps still named in the database
	// lapsed holds the shards whose local deadline passed with no
	// reading of the leases since: nobody is known to have taken them
	// (see Publishes).
	lapsed    map[int]struct{}
	callbacks []func(gained, lost []int)
	// lapseEnds are told of lapsed shards that ended (see Publishes).
	lapseEnds []func(shards []int)
	lastRenew time.Time
	// region is the last round's reading of the region; unownedSince
	// says since when (local clock) each unowned shard has been so.
	region       RegionStatus
	unownedSince map[int]time.Time
	// others are the shards another replica held at the last reading.
	others map[int]string
	// seen are the replicas any reading since start showed live
	// (Seen, owner.go).
	seen map[string]bool
	// routes are where evidence goes, by shard (route.go); read
	// without mu.
	routes routeTable
	// offered are the shards this replica offers: to whom, since when
	// (local clock).
	offered map[int]offer
	// unresponsive are replicas that left an offer untaken for
	// OfferTimeout, until when (local clock) they are dealt nothing: a
	// replica of an earlier release that does not take offers, or a row
	// in the replicas table no process stands behind.
	unresponsive map[string]time.Time
	// handed are the shards this replica handed over, each with the
	// local time until which it goes on publishing them (Publishes).
	handed map[int]time.Time
	// leaving is set by Handover: the replica is ready for nothing and
	// offers everything it holds.
	leaving bool
	// dealt are the free shards the last round's balance dealt to
	// another replica, and since when (local clock): one that leaves
	// them untaken for OfferTimeout is unresponsive, as for an offer.
	dealt map[int]offer
	// unbelieved are the live rows of table replicas not believed at
	// the last reading, by id (members.go).
	unbelieved map[string]UnbelievedReplica

	// incarnation names this process in its sealed row; ownSeal and
	// ownKey are the seal, made once (under runMu).
	incarnation string
	ownSeal     []byte
	ownKey      *string
}

// New returns a stopped Manager.
func New(cfg Config) (*Manager, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	met, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	m := &Manager{
		cfg:          cfg,
		log:          cfg.Logger.With("worker", "ownership", "replica", cfg.ID),
		met:          met,
		held:         map[int]*tenure{},
		abandoned:    map[int]uint64{},
		lapsed:       map[int]struct{}{},
		offered:      map[int]offer{},
		unresponsive: map[string]time.Time{},
		handed:       map[int]time.Time{},
		dealt:        map[int]offer{},
		unbelieved:   map[string]UnbelievedReplica{},
		incarnation:  newIncarnation(),
	}
	m.logTrust(m.log)
	return m, nil
}

// ID is this replica's id.
func (m *Manager) ID() string { return m.cfg.ID }

// OnChange registers fn to be told, in order, of the shards this replica
// starts and stops holding. A shard given up is reported before the
// database lets anyone else take it: before the release statement, and
// by the local deadline, which falls at least Margin before the lease's
// expiry. fn runs on the manager's goroutine and must return quickly
// (it eats into Margin); it may call Owns, Owned, Shards and Status, but
// not RunOnce, Release or Stop. A tenure that ends and a new one of the
// same shard begun in one change appear in both lost and gained.
func (m *Manager) OnChange(fn func(gained, lost []int)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.callbacks = append(m.callbacks, fn)
}

// Start runs a round now and then every Interval, and watches the local
// deadlines, until ctx ends or Stop is called. Either way the manager
// releases what it holds as it ends (Release).
func (m *Manager) Start(ctx context.Context) error {
	if err := m.dog.Start(ctx, m.watch); err != nil {
		return err
	}
	if err := m.loop.Start(ctx, m.run); err != nil {
		m.dog.Stop()
		return err
	}
	if err := m.poll.Start(ctx, m.pollOffers); err != nil {
		m.loop.Stop()
		m.dog.Stop()
		return err
	}
	return nil
}

// Stop ends the rounds, releasing every shard held (Release), and then
// the deadline watch. Safe to call twice or before Start (when it does
// nothing: a manager driven by RunOnce alone releases with Release).
func (m *Manager) Stop() {
	m.poll.Stop()
	m.loop.Stop()
	m.dog.Stop()
}

func (m *Manager) run(ctx context.Context) {
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.Interval)
		defer cancel()
		if err := m.Release(rctx); err != nil {
			m.log.Warn("shards not released at stop: they move when their leases expire", "err", err)
		}
	}()
	m.tick(ctx)
	worker.Every(ctx, m.cfg.Interval, m.tick)
}

func (m *Manager) tick(ctx context.Context) {
	// A round never runs into the next one's turn: a renewal stuck on an
	// unresponsive database is given up and the next round sends another.
	ctx, cancel := context.WithTimeout(ctx, m.cfg.Interval)
	defer cancel()
	if err := m.RunOnce(ctx); err != nil {
		m.log.Warn("ownership round failed", "err", err)
	}
}

// watch checks the local deadlines on its own goroutine, so a round
// stuck on an unreachable database never keeps a lease counted as held
// past its deadline.
func (m *Manager) watch(ctx context.Context) {
	worker.Every(ctx, max(m.cfg.Margin/4, time.Millisecond), func(context.Context) {
		now := m.cfg.Now()
		m.expire(now)
		m.endHandovers(now, false)
	})
}

// pollOffers looks at the offers between rounds (HandoverOnce).
func (m *Manager) pollOffers(ctx context.Context) {
	worker.Every(ctx, m.cfg.OfferPoll, func(ctx context.Context) {
		ctx, cancel := context.WithTimeout(ctx, m.cfg.Interval)
		defer cancel()
		if err := m.HandoverOnce(ctx); err != nil {
			m.log.Debug("look at shard offers", "err", err)
		}
	})
}

// RunOnce runs one round: heartbeat, renew what is held, release tenures
// dropped locally, read the region, then release the excess and take the
// shards the balance deals to this replica. Local deadlines are checked
// first, so a round also ends the tenures whose deadline passed.
func (m *Manager) RunOnce(ctx context.Context) error {
	m.runMu.Lock()
	defer m.runMu.Unlock()
	return m.round(ctx)
}

// round is RunOnce's body, under runMu.
func (m *Manager) round(ctx context.Context) error {
	m.expire(m.cfg.Now())
	q := db.New(m.cfg.Pool)
	// The heartbeat goes first: a replica is live while its last heartbeat
	// is within a TTL, and a lease expires a TTL after its last renewal,
	// which comes after the heartbeat; so by the time a dead replica's
	// leases expire, the others no longer count it and their targets
	// already include its share.
	if !m.joined {
		// A start under the id of a killed process: its tenures are freed
		// at once rather than after their TTL, so a restarted replica
		// publishes again within a round, unless a process under this id
		// heartbeated within the last round and a half (it may be alive).
		m.mu.Lock()
		fresh := len(m.held) == 0
		m.mu.Unlock()
		if fresh {
			quiet := m.cfg.Interval + m.cfg.Interval/2
			freed, err := q.ShardLeaseReleaseOwner(ctx, db.ShardLeaseReleaseOwnerParams{Owner: m.cfg.ID, QuietMs: quiet.Milliseconds()})
			if err != nil {
				m.met.renewFailures.Inc()
				return fmt.Errorf("free the shards of %s's previous process: %w", m.cfg.ID, err)
			}
			if len(freed) > 0 {
				m.log.Info("freed the shards a killed process of this replica held", "shards", len(freed))
			}
		}
	}
	ready := m.ready()
	sig, kid, err := m.sealOwn(ctx)
	if err != nil {
		m.met.renewFailures.Inc()
		return err
	}
	if _, err := q.ReplicaHeartbeat(ctx, db.ReplicaHeartbeatParams{
		ID: m.cfg.ID, Address: m.cfg.Address, Region: m.cfg.Region, Restart: !m.joined, Ready: ready,
		Incarnation: m.incarnation, Seal: sig, SealKey: kid,
	}); err != nil {
		m.met.renewFailures.Inc()
		return fmt.Errorf("heartbeat of replica %s: %w", m.cfg.ID, err)
	}
	m.joined = true
	if err := m.renew(ctx, q); err != nil {
		m.met.renewFailures.Inc()
		return err
	}
	if err := m.releaseAbandoned(ctx, q); err != nil {
		return err
	}
	rows, err := q.ShardLeaseList(ctx)
	if err != nil {
		return fmt.Errorf("read shard leases: %w", err)
	}
	all, err := q.ReplicaListLive(ctx, m.cfg.TTL.Milliseconds())
	if err != nil {
		return fmt.Errorf("read live replicas: %w", err)
	}
	// The one reading of the membership: every reader (the balance
	// below, the relay, the forwarder, the census, GET /v1/replicas)
	// sees only the rows believed here.
	replicas, sealed := m.believe(m.cfg.Now(), all)
	for i, r := range rows {
		if int(r.Shard) != i {
			return fmt.Errorf("shard_leases holds shard %d where %d belongs: the shards must be 0..n-1", r.Shard, i)
		}
	}
	if len(rows) == 0 {
		return errors.New("shard_leases is empty: migration 000026 seeds the shards")
	}
	if n := m.Shards(); n != 0 && n != len(rows) {
		// Every service would hash elsewhere: holding on would make two
		// owners. Give everything up and take nothing.
		m.change(func(ev *event) {
			for s, t := range m.held {
				m.drop(ev, s, t, changeReleased)
			}
		})
		err := fmt.Errorf("the region's shard count changed from %d to %d under a running replica: restart every replica", n, len(rows))
		return errors.Join(err, m.releaseAbandoned(ctx, q))
	}
	leases := m.leases(rows)
	m.noteRegion(m.cfg.Now(), replicas, sealed, rows)
	live := make([]Member, 0, len(replicas)+1)
	m.mu.Lock()
	leaving := m.leaving
	now := m.cfg.Now()
	for s, o := range m.offered {
		if now.Sub(o.since) > m.cfg.OfferTimeout {
			if _, known := m.unresponsive[o.to]; !known {
				m.log.Warn("a replica left a shard offered to it untaken; it is dealt nothing for a while",
					"replica", o.to, "shard", s, "offered_for", now.Sub(o.since).Round(time.Millisecond), "for", m.cfg.UnresponsiveFor)
			}
			m.unresponsive[o.to] = now.Add(m.cfg.UnresponsiveFor)
		}
	}
	// The same for free shards dealt to a replica that does not take
	// them (a row no process stands behind: a dead replica's, kept live
	// by hand): they would stay without an owner.
	for s, d := range m.dealt {
		if s < len(leases) && leases[s].Owner == "" && now.Sub(d.since) > m.cfg.OfferTimeout {
			if _, known := m.unresponsive[d.to]; !known {
				m.log.Warn("a replica left a free shard dealt to it untaken; it is dealt nothing for a while",
					"replica", d.to, "shard", s, "dealt_for", now.Sub(d.since).Round(time.Millisecond), "for", m.cfg.UnresponsiveFor)
			}
			m.unresponsive[d.to] = now.Add(m.cfg.UnresponsiveFor)
		}
	}
	for id, until := range m.unresponsive {
		if !now.Before(until) {
			delete(m.unresponsive, id)
		}
	}
	for _, r := range replicas {
		if r.ID != m.cfg.ID {
			_, shy := m.unresponsive[r.ID]
			live = append(live, Member{ID: r.ID, Ready: r.Ready && !shy})
		}
	}
	m.mu.Unlock()
	live = append(live, Member{ID: m.cfg.ID, Ready: ready, Leaving: leaving})
	plan := Balance(m.cfg.ID, live, leases)
	m.noteDealt(now, plan.Dealt)
	if len(plan.Take) > 0 {
		if err := m.take(ctx, q, plan.Take); err != nil {
			return err
		}
	}
	if len(plan.Accept) > 0 {
		if err := m.takeOffered(ctx, q, plan.Accept); err != nil {
			return err
		}
	}
	offers, err := m.offer(ctx, q, rows, plan.Offer)
	if err != nil {
		return err
	}
	if len(plan.Take)+len(plan.Accept)+offers > 0 {
		// The region as it stands after this round's moves.
		if rows, err = q.ShardLeaseList(ctx); err != nil {
			return fmt.Errorf("read shard leases: %w", err)
		}
		m.noteRegion(m.cfg.Now(), replicas, sealed, rows)
	}
	// The lapsed tenures were released and the leases read since: those
	// the balance did not deal back (as a gain, under a new epoch) are
	// lost now.
	m.endLapses()
	if _, err := q.ReplicaPrune(ctx, pruneAfter.Milliseconds()); err != nil {
		return fmt.Errorf("prune replicas: %w", err)
	}
	return nil
}

// noteDealt records the free shards this round dealt to other replicas,
// keeping since when each has been dealt to the same one.
func (m *Manager) noteDealt(now time.Time, dealt map[int]string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	next := make(map[int]offer, len(dealt))
	for s, to := range dealt {
		if d, ok := m.dealt[s]; ok && d.to == to {
			next[s] = d
		} else {
			next[s] = offer{to: to, since: now}
		}
	}
	m.dealt = next
}

// leases converts what the database says into Balance's input, and
// records the shard count.
func (m *Manager) leases(rows []db.ShardLeaseListRow) []Lease {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.shards = len(rows)
	out := make([]Lease, len(rows))
	for i, r := range rows {
		out[i].Shard = int(r.Shard)
		if r.OfferedTo != nil {
			out[i].OfferedTo = *r.OfferedTo
		}
		if !r.Held || r.Owner == nil {
			continue
		}
		out[i].Owner = *r.Owner
		if out[i].Owner == m.cfg.ID {
			if t := m.held[i]; t == nil || t.epoch != uint64(r.Epoch) {
				out[i].Owner = stale
			}
		}
	}
	return out
}

// renew extends every tenure held, in one statement. The local deadline
// counts from the moment before the statement was sent, which is before
// the database stamps the new expiry.
func (m *Manager) renew(ctx context.Context, q *db.Queries) error {
	m.mu.Lock()
	shards, epochs := tenures(m.heldEpochs())
	m.mu.Unlock()
	sent := m.cfg.Now()
	if len(shards) == 0 {
		m.mu.Lock()
		m.lastRenew = sent
		m.mu.Unlock()
		return nil
	}
	rows, err := q.ShardLeaseRenew(ctx, db.ShardLeaseRenewParams{
		TtlMs: m.cfg.TTL.Milliseconds(), Shards: shards, Epochs: epochs, Owner: m.cfg.ID,
	})
	if err != nil {
		return fmt.Errorf("renew %d shard leases: %w", len(shards), err)
	}
	var deposed []int
	m.change(func(ev *event) {
		now := m.cfg.Now()
		deadline := sent.Add(m.cfg.TTL - m.cfg.Margin)
		renewed := map[int]bool{}
		for _, r := range rows {
			s, e := int(r.Shard), uint64(r.Epoch)
			renewed[s] = true
			t := m.held[s]
			switch {
			case t == nil || t.epoch != e:
				// Dropped locally while the statement ran (its deadline
				// passed): the database still names it, so release it.
				m.abandoned[s] = e
			case !now.Before(deadline):
				m.drop(ev, s, t, changeExpired)
			default:
				t.renewed, t.deadline, t.expires = sent, deadline, r.ExpiresAt
			}
		}
		for i, s32 := range shards {
			s := int(s32)
			if t := m.held[s]; !renewed[s] && t != nil && t.epoch == uint64(epochs[i]) {
				// The database refused the renewal: the lease expired by
				// its clock, or a newer tenure exists. Nothing to release.
				// A shard this replica offered was most likely taken by
				// the replica it was offered to: handed over.
				if _, ok := m.offered[s]; ok {
					m.handOff(s, now)
					continue
				}
				delete(m.held, s)
				ev.lost = append(ev.lost, s)
				deposed = append(deposed, s)
				m.met.changes.WithLabelValues(changeDeposed).Inc()
			}
		}
		m.lastRenew = sent
	})
	if len(deposed) > 0 {
		m.log.Warn("shards lost: the database refused their renewal (expired by its clock, or taken)", "shards", deposed)
	}
	return nil
}

// take takes the shards the balance dealt to this replica.
func (m *Manager) take(ctx context.Context, q *db.Queries, shards []int) error {
	ids := make([]int32, len(shards))
	for i, s := range shards {
		ids[i] = int32(s)
	}
	sent := m.cfg.Now()
	rows, err := q.ShardLeaseTake(ctx, db.ShardLeaseTakeParams{Owner: m.cfg.ID, TtlMs: m.cfg.TTL.Milliseconds(), Shards: ids})
	if err != nil {
		return fmt.Errorf("take %d shards: %w", len(shards), err)
	}
	return m.tookRows(ctx, q, sent, rows)
}

// tookRows records the tenures a take (sent at sent, local clock)
// returned.
func (m *Manager) tookRows(ctx context.Context, q *db.Queries, sent time.Time, rows []db.ShardLeaseTakeRow) error {
	late := false
	m.change(func(ev *event) {
		now := m.cfg.Now()
		deadline := sent.Add(m.cfg.TTL - m.cfg.Margin)
		for _, r := range rows {
			s, e := int(r.Shard), uint64(r.Epoch)
			delete(m.abandoned, s)
			if !now.Before(deadline) {
				m.abandoned[s], late = e, true
				continue
			}
			var since time.Time
			if r.AcquiredAt != nil {
				since = *r.AcquiredAt
			}
			m.held[s] = &tenure{epoch: e, since: since, expires: r.ExpiresAt, renewed: sent, deadline: deadline}
			delete(m.handed, s)
			ev.gained = append(ev.gained, s)
			m.met.changes.WithLabelValues(changeGained).Inc()
		}
	})
	if late {
		return m.releaseAbandoned(ctx, q)
	}
	return nil
}

// ready says whether this replica can publish what it would be dealt:
// Config.Ready, and not leaving.
func (m *Manager) ready() bool {
	m.mu.Lock()
	leaving := m.leaving
	m.mu.Unlock()
	return !leaving && (m.cfg.Ready == nil || m.cfg.Ready())
}

// takeOffered takes the shards their owners offer to this replica.
func (m *Manager) takeOffered(ctx context.Context, q *db.Queries, shards []int) error {
	ids := make([]int32, len(shards))
	for i, s := range shards {
		ids[i] = int32(s)
	}
	sent := m.cfg.Now()
	rows, err := q.ShardLeaseTakeOffered(ctx, db.ShardLeaseTakeOfferedParams{Taker: m.cfg.ID, TtlMs: m.cfg.TTL.Milliseconds(), Shards: ids})
	if err != nil {
		return fmt.Errorf("take %d offered shards: %w", len(shards), err)
	}
	taken := make([]db.ShardLeaseTakeRow, len(rows))
	for i, r := range rows {
		taken[i] = db.ShardLeaseTakeRow(r)
	}
	if len(rows) > 0 {
		m.log.Info("took shards handed over by their owner", "shards", len(rows))
	}
	return m.tookRows(ctx, q, sent, taken)
}

// offer sets the offers of this replica's tenures to plan (shard → to):
// a tenure not in plan is offered to nobody. A shard offered stops being
// this replica's (Owns, Owned and Fence say no, the OnChange callbacks
// hear of it as lost) before the offer is written, so nothing is done as
// its owner once another replica may take it; but it is still renewed,
// and published (Publishes) until the taker has published. A withdrawn
// offer is written first, and the shard is this replica's again (a gain)
// only if the database still names its tenure. Only the offers that
// differ from what rows (this round's reading) say are written. It
// returns how many changed.
func (m *Manager) offer(ctx context.Context, q *db.Queries, rows []db.ShardLeaseListRow, plan map[int]string) (int, error) {
	var shards []int32
	var epochs []int64
	var to []string
	withdrawn := map[int]bool{}
	m.change(func(ev *event) {
		for _, s := range slices.Sorted(maps.Keys(m.held)) {
			t := m.held[s]
			want, have := plan[s], ""
			if s < len(rows) && rows[s].OfferedTo != nil && rows[s].Owner != nil && *rows[s].Owner == m.cfg.ID && uint64(rows[s].Epoch) == t.epoch {
				have = *rows[s].OfferedTo
			}
			o, was := m.offered[s]
			switch {
			case want != "" && !was:
				m.offered[s] = offer{to: want, since: m.cfg.Now()}
				ev.lost = append(ev.lost, s)
			case want != "" && o.to != want:
				m.offered[s] = offer{to: want, since: m.cfg.Now()}
			case want != "":
			case was:
				withdrawn[s] = true
			}
			if want != have || withdrawn[s] {
				shards, epochs, to = append(shards, int32(s)), append(epochs, int64(t.epoch)), append(to, want)
			}
		}
	})
	if len(shards) == 0 {
		return 0, nil
	}
	back, err := q.ShardLeaseOffer(ctx, db.ShardLeaseOfferParams{OfferedTo: to, Shards: shards, Epochs: epochs, Owner: m.cfg.ID})
	if err != nil {
		// Withdrawals stay offered: the next round writes them again.
		return 0, fmt.Errorf("offer %d shards: %w", len(shards), err)
	}
	if len(withdrawn) > 0 {
		still := map[int]bool{}
		for _, r := range back {
			still[int(r.Shard)] = true
		}
		m.change(func(ev *event) {
			now := m.cfg.Now()
			for s := range withdrawn {
				if _, ok := m.offered[s]; !ok || m.held[s] == nil {
					continue
				}
				if still[s] {
					delete(m.offered, s)
					ev.gained = append(ev.gained, s)
				} else {
					m.handOff(s, now) // taken before the withdrawal landed
				}
			}
		})
	}
	return len(shards), nil
}

// handOff ends a tenure this replica offered and another replica took.
// The callbacks heard of the loss when the offer was made; the replica
// goes on publishing the shard's services for HandoverGrace (Publishes)
// so that they are never unpublished between the two owners: a new
// owner's versions are above every one of this replica's, so the overlap
// costs nothing but duplicate work. Under mu, within change.
func (m *Manager) handOff(s int, now time.Time) {
	delete(m.held, s)
	delete(m.offered, s)
	m.handed[s] = now.Add(m.cfg.HandoverGrace)
	m.met.changes.WithLabelValues(changeHanded).Inc()
}

// HandoverOnce does between rounds what handovers need, in one cheap
// read: it notices which of the shards this replica offered were taken
// (they are handed over), and when a shard is offered to it, it runs a
// round at once, which accepts what the balance says it is short. The
// offer poll calls it every OfferPoll; Handover and tests call it too.
func (m *Manager) HandoverOnce(ctx context.Context) error {
	m.runMu.Lock()
	defer m.runMu.Unlock()
	m.mu.Lock()
	joined := m.joined
	offered := make([]int32, 0, len(m.offered))
	for _, s := range slices.Sorted(maps.Keys(m.offered)) {
		offered = append(offered, int32(s))
	}
	m.mu.Unlock()
	if !joined {
		return nil
	}
	q := db.New(m.cfg.Pool)
	rows, err := q.ShardLeaseHandovers(ctx, db.ShardLeaseHandoversParams{Replica: m.cfg.ID, Shards: offered})
	if err != nil {
		return fmt.Errorf("read shard offers: %w", err)
	}
	toMe := false
	var taken []int
	for _, r := range rows {
		if r.OfferedTo != nil && *r.OfferedTo == m.cfg.ID && r.Held && r.Owner != nil && *r.Owner != m.cfg.ID {
			toMe = true
		}
		if slices.Contains(offered, r.Shard) && (r.Owner == nil || *r.Owner != m.cfg.ID || !r.Held) {
			taken = append(taken, int(r.Shard))
		}
	}
	if len(taken) > 0 {
		m.change(func(ev *event) {
			now := m.cfg.Now()
			for _, s := range taken {
				if _, ok := m.offered[s]; ok && m.held[s] != nil {
					m.handOff(s, now)
				}
			}
		})
	}
	if toMe && m.ready() {
		return m.round(ctx)
	}
	return nil
}

// Handover hands every shard this replica holds to the other ready
// replicas before it stops (make before break): from now on it is ready
// for nothing, a round offers what it holds to those the balance deals
// it to, and Handover waits, looking every OfferPoll, until each offer
// was taken or ctx ends. It goes on publishing what it handed over
// (Publishes) until the new owners have published. What nobody took is
// released when the manager stops (Release), as before. It returns how
// many shards are still held.
func (m *Manager) Handover(ctx context.Context) int {
	m.mu.Lock()
	m.leaving = true
	m.mu.Unlock()
	// The round that makes the offers is tried again, every OfferPoll,
	// until one succeeds or ctx ends: a round slower than its Interval
	// (a loaded database at the moment of a deploy) must not send every
	// shard the slow way, released at stop and taken only when found
	// free, while the caller's budget for the handover still runs.
	for {
		rctx, cancel := context.WithTimeout(ctx, m.cfg.Interval)
		err := m.RunOnce(rctx)
		cancel()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			m.log.Warn("hand over shards: the round failed; what is held is released at stop", "err", err)
			return len(m.Owned())
		}
		m.log.Warn("hand over shards: the round failed; trying again", "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(m.cfg.OfferPoll):
		}
	}
	tick := time.NewTicker(max(m.cfg.OfferPoll/2, 10*time.Millisecond))
	defer tick.Stop()
	for n := 1; ; n++ {
		m.mu.Lock()
		left, offered := len(m.held), len(m.offered)
		m.mu.Unlock()
		if left == 0 || offered == 0 {
			return left
		}
		select {
		case <-ctx.Done():
			return left
		case <-tick.C:
		}
		var err error
		if n%8 == 0 {
			// A round now and then: a replica offered to may have
			// stopped being ready (the whole region stopping at once);
			// the round withdraws such offers, and Handover ends when
			// none is left to wait for.
			rctx, cancel := context.WithTimeout(ctx, m.cfg.Interval)
			err = m.RunOnce(rctx)
			cancel()
		} else {
			err = m.HandoverOnce(ctx)
		}
		if err != nil && ctx.Err() == nil {
			m.log.Warn("hand over shards", "err", err)
		}
	}
}

// endHandovers ends the handovers whose grace has passed (all of them
// with force) and tells OnLapseEnd: the publisher stops publishing them.
func (m *Manager) endHandovers(now time.Time, force bool) {
	m.stopPublishing(func() (ended []int) {
		for s, until := range m.handed {
			if force || !now.Before(until) {
				delete(m.handed, s)
				if m.held[s] == nil {
					ended = append(ended, s)
				}
			}
		}
		return ended
	})
}

// stopPublishing runs take under mu, within the callbacks' order
// (emitMu), and tells OnLapseEnd of the shards it returns: those this
// replica no longer publishes (a lapse or a handover ended).
func (m *Manager) stopPublishing(take func() []int) {
	m.emitMu.Lock()
	defer m.emitMu.Unlock()
	m.mu.Lock()
	ended := take()
	slices.Sort(ended)
	cbs := slices.Clone(m.lapseEnds)
	m.mu.Unlock()
	if len(ended) == 0 {
		return
	}
	for _, fn := range cbs {
		fn(ended)
	}
}

// HandingOver reports whether service belongs to a shard this replica
// handed over and still publishes (Publishes): its publisher stops as soon
// as it sees the new owner's publication of it.
func (m *Manager) HandingOver(service string) bool {
	now := m.cfg.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.shards == 0 {
		return false
	}
	until, ok := m.handed[ShardOf(service, m.shards)]
	return ok && now.Before(until)
}

// releaseAbandoned releases in the database the tenures this process
// dropped locally. A tenure the database no longer names (expired and
// taken, or released already) is simply forgotten.
func (m *Manager) releaseAbandoned(ctx context.Context, q *db.Queries) error {
	m.mu.Lock()
	shards, epochs := tenures(m.abandoned)
	m.mu.Unlock()
	if len(shards) == 0 {
		return nil
	}
	if _, err := q.ShardLeaseRelease(ctx, db.ShardLeaseReleaseParams{Shards: shards, Epochs: epochs, Owner: m.cfg.ID}); err != nil {
		return fmt.Errorf("release %d shard leases: %w", len(shards), err)
	}
	m.mu.Lock()
	for i, s := range shards {
		if e, ok := m.abandoned[int(s)]; ok && e == uint64(epochs[i]) {
			delete(m.abandoned, int(s))
		}
	}
	m.mu.Unlock()
	return nil
}

// Release gives up every shard this replica holds, telling the callbacks
// first, then frees the leases and removes the replica from the region,
// so the others take its shards at their next round instead of a TTL
// later. A later RunOnce joins the region again.
func (m *Manager) Release(ctx context.Context) error {
	m.runMu.Lock()
	defer m.runMu.Unlock()
	m.change(func(ev *event) {
		for s, t := range m.held {
			m.drop(ev, s, t, changeReleased)
		}
	})
	m.endLapses()
	m.endHandovers(m.cfg.Now(), true)
	m.mu.Lock()
	m.leaving = false
	clear(m.offered)
	clear(m.unresponsive)
	m.mu.Unlock()
	q := db.New(m.cfg.Pool)
	err := m.releaseAbandoned(ctx, q)
	if ferr := q.ReplicaForget(ctx, m.cfg.ID); ferr != nil {
		err = errors.Join(err, fmt.Errorf("forget replica %s: %w", m.cfg.ID, ferr))
	}
	m.joined = false
	return err
}

// expire ends the tenures whose local deadline has passed.
func (m *Manager) expire(now time.Time) {
	var lost []int
	m.change(func(ev *event) {
		for s, t := range m.held {
			if !now.Before(t.deadline) {
				m.drop(ev, s, t, changeExpired)
				m.lapsed[s] = struct{}{}
			}
		}
		lost = slices.Clone(ev.lost)
	})
	if len(lost) > 0 {
		slices.Sort(lost)
		m.log.Warn("shards given up: no renewal landed before their local deadline", "shards", lost)
	}
}

// drop ends a tenure locally and keeps it for release in the database.
// Under mu, within change.
func (m *Manager) drop(ev *event, s int, t *tenure, why string) {
	delete(m.held, s)
	m.abandoned[s] = t.epoch
	if _, offered := m.offered[s]; offered {
		delete(m.offered, s) // its loss was told when it was offered
	} else {
		ev.lost = append(ev.lost, s)
	}
	m.met.changes.WithLabelValues(why).Inc()
}

// event is what one change gained and lost.
type event struct{ gained, lost []int }

// change applies fn to the state and then tells the callbacks, all
// before another change may begin: callbacks see the changes in the
// order they happened.
func (m *Manager) change(fn func(ev *event)) {
	m.emitMu.Lock()
	defer m.emitMu.Unlock()
	var ev event
	m.mu.Lock()
	fn(&ev)
	m.met.owned.Set(float64(len(m.held)))
	cbs := slices.Clone(m.callbacks)
	m.mu.Unlock()
	if len(ev.gained) == 0 && len(ev.lost) == 0 {
		return
	}
	slices.Sort(ev.gained)
	slices.Sort(ev.lost)
	for _, fn := range cbs {
		fn(ev.gained, ev.lost)
	}
}

// tenures lists shard → epoch as the parallel arrays the queries take.
func tenures(from map[int]uint64) (shards []int32, epochs []int64) {
	for _, s := range slices.Sorted(maps.Keys(from)) {
		shards = append(shards, int32(s))
		epochs = append(epochs, int64(from[s]))
	}
	return shards, epochs
}

// heldEpochs is the tenures held, shard → epoch. Under mu.
func (m *Manager) heldEpochs() map[int]uint64 {
	out := make(map[int]uint64, len(m.held))
	for s, t := range m.held {
		out[s] = t.epoch
	}
	return out
}

// Shards is how many shards the region has: 0 until the first round has
// read them.
func (m *Manager) Shards() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.shards
}

// Owned returns the shards this replica holds now, with the epoch of
// each tenure. A tenure past its local deadline is not held, whether or
// not the deadline watch has noticed yet.
func (m *Manager) Owned() map[int]uint64 {
	now := m.cfg.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[int]uint64, len(m.held))
	for s, t := range m.held {
		if _, offered := m.offered[s]; now.Before(t.deadline) && !offered {
			out[s] = t.epoch
		}
	}
	return out
}

// Owns reports whether this replica owns service now, and under which
// epoch of its shard. Whoever acts for a service asks before acting (it
// costs a lock and a hash), so a tenure is never acted on past its local
// deadline even between the deadline and its callback.
func (m *Manager) Owns(service string) (epoch uint64, ok bool) {
	now := m.cfg.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.shards == 0 {
		return 0, false
	}
	s := ShardOf(service, m.shards)
	t := m.held[s]
	if _, offered := m.offered[s]; t == nil || offered || !now.Before(t.deadline) {
		return 0, false
	}
	return t.epoch, true
}

// OnLapseEnd registers fn to be told of shards whose lapse ended (see
// Publishes): this replica no longer publishes their services. It is
// called from a round (or Release) after the lapsed tenures were released
// in the database, so a new owner may already hold them; its versions are
// above the lapsed ones, so nothing regresses.
func (m *Manager) OnLapseEnd(fn func(shards []int)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lapseEnds = append(m.lapseEnds, fn)
}

// endLapses ends every lapse and tells OnLapseEnd.
func (m *Manager) endLapses() {
	m.stopPublishing(func() (ended []int) {
		for s := range m.lapsed {
			if m.held[s] == nil {
				ended = append(ended, s)
			}
		}
		clear(m.lapsed)
		return ended
	})
}

// Publishes reports whether this replica goes on publishing service's
// views: it owns it (Owns); it offers the shard and the taker has not
// taken it yet; it handed the shard over less than HandoverGrace ago
// (make before break: the new owner may not have published yet); or its
// tenure lapsed (the local deadline
// passed without a renewal landing, PostgreSQL unreachable) and no
// reading of the leases has happened since. A lapsed owner keeps
// publishing so that a replica cut off from its database goes on serving
// its subscribers (muster must never be the reason traffic stops), and
// this is harmless to the others: a new owner publishes under a version
// epoch taken after it gained the shard, above every version the lapsed
// one can issue, and every hub keeps the higher version (see
// docs/replicas.md, "Publication follows ownership"). Everything that
// writes or ends something (lease expiry, window flushes) asks Owns.
func (m *Manager) Publishes(service string) bool {
	now := m.cfg.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.shards == 0 {
		return false
	}
	s := ShardOf(service, m.shards)
	if t := m.held[s]; t != nil && now.Before(t.deadline) {
		return true // owned, or offered and not yet taken
	}
	if until, ok := m.handed[s]; ok && now.Before(until) {
		return true
	}
	_, ok := m.lapsed[s]
	return ok
}

// OwnedElsewhere reports whether the last reading of the leases showed
// another replica holding service's shard. Whoever writes what every
// replica observes (the evaluator's windows and transitions) leaves it to
// that replica, and writes it otherwise: alone, while a shard moves, or
// while the leases cannot be read, so nothing observed is lost for want
// of an owner (a move may write a few seconds twice).
func (m *Manager) OwnedElsewhere(service string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.shards == 0 {
		return false
	}
	_, ok := m.others[ShardOf(service, m.shards)]
	return ok
}

// Fence checks, inside the caller's transaction (q from db.WithTx), that
// this replica still holds shard under epoch, and keeps it so until the
// transaction ends: the lease row is locked FOR SHARE, so a takeover
// waits (or, in ShardLeaseTake, skips the shard) until the writer has
// committed or rolled back. A deposed owner's write therefore fails
// with ErrNotOwner, and a write that passed commits before any new
// tenure begins. Transactions that fence must be short: the owner's own
// renewal waits for them too.
func (m *Manager) Fence(ctx context.Context, q *db.Queries, shard int, epoch uint64) error {
	now := m.cfg.Now()
	m.mu.Lock()
	t := m.held[shard]
	_, offered := m.offered[shard]
	local := t != nil && t.epoch == epoch && now.Before(t.deadline) && !offered
	m.mu.Unlock()
	if !local {
		return fmt.Errorf("fence shard %d at epoch %d: %w", shard, epoch, ErrNotOwner)
	}
	_, err := q.ShardLeaseFence(ctx, db.ShardLeaseFenceParams{Shard: int32(shard), Epoch: int64(epoch), Owner: m.cfg.ID})
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("fence shard %d at epoch %d: the database names another tenure: %w", shard, epoch, ErrNotOwner)
	case err != nil:
		return fmt.Errorf("fence shard %d at epoch %d: %w", shard, epoch, err)
	}
	return nil
}

// HeldByAnother reports, inside the caller's transaction (q from
// db.WithTx), whether a replica other than this one holds shard now by
// the database's clock, and keeps the row so (FOR SHARE) until the
// transaction ends. A writer of records decided under a tenure that has
// since ended (Fence refused it) writes them unless another replica
// holds the shard: then that replica makes its own; otherwise nobody
// else made them (the tenure lapsed through a database outage, or this
// replica took the shard back under a new epoch).
func (m *Manager) HeldByAnother(ctx context.Context, q *db.Queries, shard int) (bool, error) {
	row, err := q.ShardLeaseHolder(ctx, int32(shard))
	if err != nil {
		return false, fmt.Errorf("read the holder of shard %d: %w", shard, err)
	}
	return row.Held && row.Owner != nil && *row.Owner != m.cfg.ID, nil
}

// Status is one replica's ownership, for GET /v1/replicas.
type Status struct {
	Replica, Address, Region string
	// Shards is how many shards the region has (0 before the first read).
	Shards int
	// Owned lists the tenures held now, by shard.
	Owned []ShardStatus
	// LastRenew is when (local clock) the last round whose renewal
	// landed sent it (a round with nothing to renew counts); zero before
	// the first.
	LastRenew time.Time
}

// ShardStatus is one tenure held.
type ShardStatus struct {
	Shard int    `json:"shard"`
	Epoch uint64 `json:"epoch"`
	// Since is when the tenure began and Expires when the lease runs
	// out unless renewed, both by the database's clock.
	Since   time.Time `json:"since"`
	Expires time.Time `json:"expires"`
	// Deadline is when (local clock) this replica stops counting the
	// shard as its own unless a renewal lands first.
	Deadline time.Time `json:"deadline"`
}

// Status reports this replica's ownership now.
func (m *Manager) Status() Status {
	now := m.cfg.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	st := Status{Replica: m.cfg.ID, Address: m.cfg.Address, Region: m.cfg.Region, Shards: m.shards, LastRenew: m.lastRenew}
	for _, s := range slices.Sorted(maps.Keys(m.held)) {
		t := m.held[s]
		if !now.Before(t.deadline) {
			continue
		}
		st.Owned = append(st.Owned, ShardStatus{Shard: s, Epoch: t.epoch, Since: t.since, Expires: t.expires, Deadline: t.deadline})
	}
	return st
}

// AlarmShardUnowned is raised for each shard no live replica has held
// for longer than a move takes (TTL plus two rounds): the services that
// hash to it have no owner.
const AlarmShardUnowned = "shard_unowned"

// RegionStatus is the region's ownership as this replica read it at its
// last round: every live replica, what it holds, and the shards no one
// holds. GET /v1/replicas answers it from memory.
type RegionStatus struct {
	// At is when (local clock) the reading was taken; zero before the
	// first round that read it.
	At time.Time `json:"at"`
	// Self is this replica.
	Self     string          `json:"self"`
	Shards   int             `json:"shards"`
	Replicas []ReplicaStatus `json:"replicas"`
	// Unowned are the shards held by no one at the reading.
	Unowned []int `json:"unowned"`
	// Owned is this replica's own tenures now (Status).
	Owned []ShardStatus `json:"owned"`
	// Offered are this replica's shards offered to another replica and
	// not yet taken (it still publishes them).
	Offered []OfferStatus `json:"offered"`
	// HandedOver are the shards this replica handed over and still
	// publishes until their new owner has.
	HandedOver []int `json:"handed_over"`
	// Unbelieved are the live rows of table replicas this replica does
	// not believe (members.go): not in Replicas, and not followed, dealt
	// shards, sent evidence or counted.
	Unbelieved []UnbelievedReplica `json:"unbelieved"`
}

// OfferStatus is one shard offered.
type OfferStatus struct {
	Shard int    `json:"shard"`
	To    string `json:"to"`
	// Since is when (local clock) the offer was made.
	Since time.Time `json:"since"`
}

// ReplicaStatus is one live replica as the reading saw it.
type ReplicaStatus struct {
	ID        string    `json:"id"`
	Address   string    `json:"address,omitempty"`
	Region    string    `json:"region,omitempty"`
	StartedAt time.Time `json:"started_at"`
	LastSeen  time.Time `json:"last_seen"`
	// Shards counts the shards it held at the reading.
	Shards int `json:"shards"`
	// Ready says it could publish what it is dealt, as it said at its
	// last heartbeat; a replica that is not ready is dealt no shards.
	Ready bool `json:"ready"`
	// Sealed says its row's seal verified. A row believed unsealed is a
	// replica of the release before in upgrade mode (or any row in a
	// region without a signing key).
	Sealed bool `json:"sealed"`
}

// noteRegion records a round's reading of the region, and since when
// (local clock) each shard has been unowned.
func (m *Manager) noteRegion(now time.Time, replicas []db.Replica, sealed map[string]bool, rows []db.ShardLeaseListRow) {
	held := map[string]int{}
	var unowned []int
	for _, r := range rows {
		if r.Held && r.Owner != nil {
			held[*r.Owner]++
			continue
		}
		unowned = append(unowned, int(r.Shard))
	}
	rs := make([]ReplicaStatus, len(replicas))
	for i, r := range replicas {
		rs[i] = ReplicaStatus{ID: r.ID, Address: r.Address, Region: r.Region, StartedAt: r.StartedAt, LastSeen: r.LastSeen, Shards: held[r.ID], Ready: r.Ready, Sealed: sealed[r.ID]}
	}
	others := map[int]string{}
	for _, r := range rows {
		if r.Held && r.Owner != nil && *r.Owner != m.cfg.ID {
			others[int(r.Shard)] = *r.Owner
		}
	}
	m.noteRoutes(replicas, rows)
	m.mu.Lock()
	defer m.mu.Unlock()
	m.others = others
	if m.seen == nil {
		m.seen = map[string]bool{}
	}
	for _, r := range replicas {
		m.seen[r.ID] = true
	}
	since := map[int]time.Time{}
	for _, s := range unowned {
		if t, ok := m.unownedSince[s]; ok {
			since[s] = t
		} else {
			since[s] = now
		}
	}
	m.unownedSince = since
	m.region = RegionStatus{At: now, Self: m.cfg.ID, Shards: len(rows), Replicas: rs, Unowned: unowned}
}

// Region returns the region's ownership as the last round read it, with
// this replica's tenures as they stand now.
func (m *Manager) Region() RegionStatus {
	own := m.Status().Owned
	m.mu.Lock()
	defer m.mu.Unlock()
	r := m.region
	r.Self = m.cfg.ID
	r.Replicas = slices.Clone(r.Replicas)
	r.Unowned = slices.Clone(r.Unowned)
	if r.Replicas == nil {
		r.Replicas = []ReplicaStatus{}
	}
	if r.Unowned == nil {
		r.Unowned = []int{}
	}
	r.Owned = own
	if r.Owned == nil {
		r.Owned = []ShardStatus{}
	}
	r.Offered = []OfferStatus{}
	for _, s := range slices.Sorted(maps.Keys(m.offered)) {
		r.Offered = append(r.Offered, OfferStatus{Shard: s, To: m.offered[s].to, Since: m.offered[s].since})
	}
	r.HandedOver = slices.Sorted(maps.Keys(m.handed))
	if r.HandedOver == nil {
		r.HandedOver = []int{}
	}
	r.Unbelieved = []UnbelievedReplica{}
	for _, id := range slices.Sorted(maps.Keys(m.unbelieved)) {
		r.Unbelieved = append(r.Unbelieved, m.unbelieved[id])
	}
	return r
}

// Alarms lists shard_unowned, one alarm naming every shard that has been
// unowned for longer than a move takes (TTL plus two rounds) at the last
// reading, and replica_unsealed or replica_insecure_address per row of
// table replicas not believed.
func (m *Manager) Alarms() []assembler.Alarm {
	return append(m.unownedAlarms(), m.unbelievedAlarms()...)
}

func (m *Manager) unownedAlarms() []assembler.Alarm {
	m.mu.Lock()
	defer m.mu.Unlock()
	grace := m.cfg.TTL + 2*m.cfg.Interval
	var late []int
	var since time.Time
	for s, t := range m.unownedSince {
		if m.region.At.Sub(t) > grace {
			late = append(late, s)
			if since.IsZero() || t.Before(since) {
				since = t
			}
		}
	}
	if len(late) == 0 {
		return nil
	}
	slices.Sort(late)
	return []assembler.Alarm{{Kind: AlarmShardUnowned, Since: since, Detail: fmt.Sprintf(
		"%d of %d shards have had no owner for more than %s (shards %v): the services that hash to them have no owner; %d replicas are live",
		len(late), m.region.Shards, grace, late, len(m.region.Replicas))}}
}
