package relay

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/musterhq/muster/internal/assembler"
)

// Report is what one replica last said, through PostgreSQL, about the
// peers it hears and the shards it owns.
type Report struct {
	Replica string
	// Heard is, per peer, how long before the report that replica last
	// read a line of that peer's stream (its own monotonic clock). A peer
	// never heard is absent.
	Heard map[string]time.Duration
	// Shards are the shards it owned at the report.
	Shards []int
	// Age is how old the report is, by the database's clock.
	Age time.Duration
}

// Reports is where replicas tell each other what they hear. It is the
// one channel a replica cut off from its peers (but not from PostgreSQL)
// still shares with them: the peers' streams are exactly what it cannot
// read.
type Reports interface {
	// Put records this replica's report (the database stamps its time).
	Put(ctx context.Context, r Report) error
	// Fresh lists the reports made within the last within, by the
	// database's clock, newest first.
	Fresh(ctx context.Context, within time.Duration) ([]Report, error)
	// Forget removes replica's report (it stops).
	Forget(ctx context.Context, replica string) error
}

// AlarmRelayCutOff is raised, per peer, while this replica has stopped
// serving that peer's services as current: it has not heard the peer
// for Config.Stale while another replica demonstrably still does. The
// subscribers of those services were told to drain and are refused
// (503 not-current) until this replica hears the peer again; when it
// hears none of its peers, /readyz says not ready as well.
const AlarmRelayCutOff = "relay_cut_off"

// judgement is the last reading of what this replica serves as current.
type judgement struct {
	// at is when it was made from the reports (local clock); zero:
	// never, or last made without them.
	at time.Time
	// stale maps each service not served as current to its owner.
	stale map[string]string
	// lost maps each peer not followed while another replica follows it
	// to the replicas that do (sorted), and since when (local clock).
	lost map[string]lostPeer
	// cutOff: every live peer is lost here, and at least one of them is
	// followed by another replica.
	cutOff bool
	// readErr is why the reports could not be read (nothing is judged
	// stale then).
	readErr string
}

type lostPeer struct {
	by    []string
	since time.Time
	heard time.Duration // how long since this replica heard it
}

// heardAgo is how long ago (local clock) this replica last heard c's
// peer: the last line read, or when it began following it when no line
// has arrived since. Called with r.mu held.
func (c *conn) heardAgo(now time.Time) time.Duration {
	last := c.added
	if c.status.LastRecordAt.After(last) {
		last = c.status.LastRecordAt
	}
	return now.Sub(last)
}

// judge reports what this replica hears, reads what the others report,
// and decides which services it no longer serves as current (see
// docs/replicas.md, "A replica that cannot follow an owner"):
//
//   - a peer is lost here when no line of its stream has arrived for
//     Config.Stale (5 s: one missed heartbeat leaves a gap of 4 s, so a
//     peer slow for a moment is not lost);
//   - a lost peer's services are stale here only when another replica,
//     neither this one nor the peer, reported hearing the peer more than
//     Config.Margin after this replica last did: the peer is alive and
//     talking, this replica is the one that cannot hear it. A peer that
//     died (SIGKILL) went quiet for everyone at once, so nobody is
//     moved for it (its shards move instead);
//   - this replica is cut off (not ready) when it hears none of its live
//     peers and at least one of them is vouched for so. A replica that
//     vouches for a peer hears that peer, so it is never cut off itself:
//     whatever the partition, the replicas do not all go unready.
//
// With no reports (no store, PostgreSQL unreachable) nothing is stale:
// muster must never be the reason traffic stops, and without evidence
// that another replica is current, moving subscribers helps nobody.
func (r *Relay) judge(ctx context.Context, live map[string]Peer) {
	if r.cfg.Reports == nil {
		return
	}
	now := r.cfg.Now()
	// A replica that was itself frozen (a pause, CPU starvation) has
	// lines waiting unread: judging now would take its own silence for
	// the peers'. It waits for the next round.
	heard := map[string]time.Duration{}
	r.mu.Lock()
	frozen := !r.lastJudge.IsZero() && now.Sub(r.lastJudge) > 2*r.cfg.Refresh+r.cfg.Stale/2
	r.lastJudge = now
	for id, c := range r.conns {
		if c.status.LastRecordAt.IsZero() {
			continue
		}
		heard[id] = c.heardAgo(now)
	}
	r.mu.Unlock()
	var shards []int
	if r.cfg.Owned != nil {
		shards = r.cfg.Owned()
	}
	rctx, cancel := context.WithTimeout(ctx, r.cfg.Refresh)
	defer cancel()
	if err := r.cfg.Reports.Put(rctx, Report{Replica: r.cfg.Signer.ID, Heard: heard, Shards: shards}); err != nil && ctx.Err() == nil {
		r.log.Debug("report what this replica hears", "err", err)
	}
	reports, err := r.cfg.Reports.Fresh(rctx, r.cfg.ReportFresh)
	if ctx.Err() != nil {
		return
	}
	if frozen {
		return
	}
	next := judgement{at: now, stale: map[string]string{}, lost: map[string]lostPeer{}}
	if err != nil {
		r.mu.Lock()
		last := r.judged.at
		r.mu.Unlock()
		if !last.IsZero() && now.Sub(last) <= r.cfg.ReportFresh {
			// One slow reading (a loaded database) keeps the last
			// judgement rather than flap subscribers back and forth.
			return
		}
		next.readErr, next.at = err.Error(), time.Time{}
		r.adopt(next)
		return
	}
	own := map[int]bool{}
	for _, s := range shards {
		own[s] = true
	}
	// The newest report naming a shard names its owner (reports come
	// newest first; during a move two may name it for a second).
	owner := map[int]string{}
	for _, rep := range reports {
		if _, ok := live[rep.Replica]; !ok {
			continue
		}
		for _, s := range rep.Shards {
			if _, taken := owner[s]; !taken && !own[s] {
				owner[s] = rep.Replica
			}
		}
	}
	r.mu.Lock()
	for id, c := range r.conns {
		ago := c.heardAgo(now)
		if ago <= r.cfg.Stale {
			continue
		}
		var by []string
		for _, rep := range reports {
			if rep.Replica == id || rep.Replica == r.cfg.Signer.ID {
				continue
			}
			if _, ok := live[rep.Replica]; !ok {
				continue
			}
			h, ok := rep.Heard[id]
			if !ok {
				continue
			}
			// How long ago, now, that replica heard the peer (ages
			// only: the two replicas' clocks are never compared).
			theirs := rep.Age + h
			if theirs <= r.cfg.Stale && theirs+r.cfg.Margin < ago && !slices.Contains(by, rep.Replica) {
				by = append(by, rep.Replica)
			}
		}
		if len(by) == 0 {
			continue
		}
		slices.Sort(by)
		since := now
		if prev, ok := r.judged.lost[id]; ok {
			since = prev.since
		}
		next.lost[id] = lostPeer{by: by, since: since, heard: ago}
	}
	heardAny := false
	for id := range live {
		if c, ok := r.conns[id]; ok && c.heardAgo(now) <= r.cfg.Stale {
			heardAny = true
		}
	}
	r.mu.Unlock()
	next.cutOff = len(live) > 0 && !heardAny && len(next.lost) > 0
	if len(next.lost) > 0 && r.cfg.ShardOf != nil {
		for _, name := range r.cfg.Hub.Services() {
			s, ok := r.cfg.ShardOf(name)
			if !ok {
				continue
			}
			if o, ok := owner[s]; ok {
				if _, lost := next.lost[o]; lost {
					next.stale[name] = o
				}
			}
		}
	}
	r.adopt(next)
}

// adopt makes a judgement this replica's: the hub refuses and drains
// the stale services, the hook drains them elsewhere (xDS), the peers'
// status and the metrics say so, and each change is logged once.
func (r *Relay) adopt(next judgement) {
	prev := r.judged
	names := slices.Sorted(maps.Keys(next.stale))
	// The hub is told only of a change: the same judgement a second
	// later drains nobody, and the hub's set is left as it stands.
	drained := 0
	if !r.adopted || !slices.Equal(names, slices.Sorted(maps.Keys(prev.stale))) {
		drained = r.cfg.Hub.SetStale(names)
		r.adopted = true
	}
	if drained > 0 {
		r.metrics.staleDrained.Add(float64(drained))
	}
	var added []string
	for _, name := range names {
		if _, was := prev.stale[name]; !was {
			added = append(added, name)
		}
	}
	if len(added) > 0 && r.cfg.OnStale != nil {
		r.cfg.OnStale(added)
	}
	for id, lp := range next.lost {
		if _, was := prev.lost[id]; !was {
			n := 0
			for _, o := range next.stale {
				if o == id {
					n++
				}
			}
			r.log.Warn("not serving a peer's services as current: this replica has not heard it while another replica does; their subscribers are moved",
				"peer", id, "heard_ago", lp.heard.Round(time.Millisecond), "heard_by", lp.by, "services", n, "subscribers_drained", drained)
		}
	}
	for id := range prev.lost {
		if _, still := next.lost[id]; !still {
			r.log.Info("serving a peer's services as current again", "peer", id)
		}
	}
	if next.cutOff != prev.cutOff {
		if next.cutOff {
			r.log.Warn("cut off from every peer while other replicas follow them: reporting not ready")
		} else {
			r.log.Info("following peers again: ready as far as the relay is concerned")
		}
	}
	if next.readErr != "" && prev.readErr == "" && len(prev.stale)+len(prev.lost) > 0 {
		r.log.Warn("cannot read what the other replicas hear: every view held is served as current", "err", next.readErr)
	}
	cut := 0.0
	if next.cutOff {
		cut = 1
	}
	r.metrics.cutOff.Set(cut)
	r.metrics.stale.Set(float64(len(next.stale)))
	now := r.cfg.Now()
	r.mu.Lock()
	r.judged = next
	for id, c := range r.conns {
		lp, lost := next.lost[id]
		c.status.Heard = c.heardAgo(now) <= r.cfg.Stale
		c.status.Stale = lost
		c.status.HeardBy = lp.by
		n := 0
		if lost {
			for _, o := range next.stale {
				if o == id {
					n++
				}
			}
		}
		c.status.StaleServices = n
	}
	r.mu.Unlock()
}

// Ready is this replica's readiness as far as the relay can tell: an
// error while it is cut off from every live peer that another replica
// demonstrably follows (it is then behind on every service it does not
// own, and a load balancer should send its clients elsewhere). Never an
// error when no other replica is known to be current: a replica never
// goes unready for a partition that leaves nobody better.
func (r *Relay) Ready() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.judged.cutOff {
		return nil
	}
	var parts []string
	for _, id := range slices.Sorted(maps.Keys(r.judged.lost)) {
		parts = append(parts, fmt.Sprintf("%s (heard by %s)", id, strings.Join(r.judged.lost[id].by, ", ")))
	}
	return fmt.Errorf("this replica hears none of its peers while other replicas do: %s; it cannot serve their services as current", strings.Join(parts, "; "))
}

// cutOffAlarms lists AlarmRelayCutOff, one per peer whose services are
// not served as current here.
func (r *Relay) cutOffAlarms() []assembler.Alarm {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []assembler.Alarm
	for _, id := range slices.Sorted(maps.Keys(r.judged.lost)) {
		lp := r.judged.lost[id]
		n := 0
		for _, o := range r.judged.stale {
			if o == id {
				n++
			}
		}
		detail := fmt.Sprintf("this replica has not heard replica %s for more than %s while %s still does: its %d services are not served as current here (their subscribers were told to reconnect elsewhere and are refused 503 not-current until this replica hears it again)",
			id, r.cfg.Stale, strings.Join(lp.by, ", "), n)
		if r.judged.cutOff {
			detail += "; this replica hears no peer at all and reports not ready"
		}
		out = append(out, assembler.Alarm{Kind: AlarmRelayCutOff, Since: lp.since, Detail: detail})
	}
	return out
}
