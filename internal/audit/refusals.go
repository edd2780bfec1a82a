package audit

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

	"github.com/prometheus/client_golang/prometheus"

	"github.com/musterhq/muster/internal/worker"
)

// RefusedItem is one report item refused for want of authority.
type RefusedItem struct {
	Target  string // the instance it was about
	Code    string // not_granted, not_own_instance, wrong_identity_kind, not_assigned
	Class   string
	Outcome string
	Reason  string
}

// Appender appends one entry in a transaction of its own (Log.Append).
type Appender interface {
	Append(ctx context.Context, now time.Time, e Entry) (Event, error)
}

// RefusalSummariesConfig configures RefusalSummaries.
type RefusalSummariesConfig struct {
	Log Appender
	// Every bounds the summaries: at most one per identity per Every
	// (1 minute).
	Every time.Duration
	// Tick is how often due summaries are written (1 s): a summary is
	// written at most Tick after it is due.
	Tick time.Duration
	// MaxIdentities bounds the identities summarised at once (100,000);
	// refusals by more are counted, not summarised.
	MaxIdentities int
	// FirstTargets is how many refused items a summary lists (10).
	FirstTargets int
	Logger       *slog.Logger
	Registerer   prometheus.Registerer
	Now          func() time.Time
	// Entry makes a summary's audit row; nil: the refused-evidence row
	// ("evidence.report"). NewAuthFailureSummaries sets its own.
	Entry func(Summary) Entry
	// Unaudited and Rows name the metrics (counters) of what no summary
	// will carry and of the rows written; empty Names: the refused
	// evidence's.
	Unaudited, Rows prometheus.CounterOpts
}

// Summary is what one summary row is made of: an identity's (or a
// source's) refusals since its last row.
type Summary struct {
	ActorKind, Actor string
	First, Last      time.Time
	Total, Batches   int
	Codes            map[string]int // counts by refusal code
	Items            []RefusedItem  // the first few
}

// RefusalSummaries puts refused evidence on the record without flooding
// it: refused report items are gathered in memory per identity
// and written as one "evidence.report" refused audit row per identity per
// Every at most, with the identity, the counts by refusal code, and the
// first few items. An identity's first refusal after a quiet Every is
// written within a Tick; those that follow within Every are written when
// it ends, in the next row; at shutdown whatever is pending is written,
// due or not. Recording takes no database round trip, so
// a flood of refused items costs the hot path a map update each; rows
// that cannot be written (PostgreSQL away) are kept and retried, merged
// with what came since.
type RefusalSummaries struct {
	cfg    RefusalSummariesConfig
	log    *slog.Logger
	runner worker.Runner

	// running serialises RunOnce (the loop's and a caller's), so that
	// when RunOnce returns, what was due is written.
	running sync.Mutex
	mu      sync.Mutex
	pending map[string]*refusalSummary
	lastRow map[string]time.Time // by identity: when its last summary was written

	unaudited prometheus.Counter
	rows      prometheus.Counter
}

type refusalSummary struct {
	actorKind, actor string
	first, last      time.Time
	total, batches   int
	codes            map[string]int
	items            []RefusedItem
}

// NewRefusalSummaries returns a stopped RefusalSummaries.
func NewRefusalSummaries(cfg RefusalSummariesConfig) (*RefusalSummaries, error) {
	switch {
	case cfg.Log == nil:
		return nil, errors.New("refusal summaries: Log is required")
	case cfg.Every < 0 || cfg.Tick < 0 || cfg.MaxIdentities < 0 || cfg.FirstTargets < 0:
		return nil, errors.New("refusal summaries: Every, Tick, MaxIdentities and FirstTargets must not be negative")
	}
	if cfg.Every == 0 {
		cfg.Every = time.Minute
	}
	if cfg.Tick == 0 {
		cfg.Tick = time.Second
	}
	if cfg.MaxIdentities == 0 {
		cfg.MaxIdentities = 100_000
	}
	if cfg.FirstTargets == 0 {
		cfg.FirstTargets = 10
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	s := &RefusalSummaries{cfg: cfg, log: cfg.Logger.With("worker", "refused-evidence-audit"),
		pending: map[string]*refusalSummary{}, lastRow: map[string]time.Time{}}
	if cfg.Entry == nil {
		cfg.Entry = evidenceEntry
	}
	if cfg.Unaudited.Name == "" {
		cfg.Unaudited = prometheus.CounterOpts{Name: "muster_evidence_refusals_unaudited_total",
			Help: "Report items refused for want of authority that no audit summary will carry: more identities refusing at once than summarised (100,000), or summaries still unwritten at shutdown."}
	}
	if cfg.Rows.Name == "" {
		cfg.Rows = prometheus.CounterOpts{Name: "muster_evidence_refusal_summaries_total",
			Help: "Refused-evidence summaries written to the audit log (at most one per identity per minute)."}
	}
	s.cfg = cfg
	s.unaudited = prometheus.NewCounter(cfg.Unaudited)
	s.rows = prometheus.NewCounter(cfg.Rows)
	if cfg.Registerer != nil {
		for _, m := range []prometheus.Collector{s.unaudited, s.rows} {
			if err := cfg.Registerer.Register(m); err != nil {
				return nil, fmt.Errorf("refusal summaries: register metrics: %w", err)
			}
		}
	}
	return s, nil
}

// Record notes items refused to actor in one batch of batchSize reports.
func (s *RefusalSummaries) Record(actorKind, actor string, items []RefusedItem) {
	if len(items) == 0 {
		return
	}
	now := s.cfg.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.pending[actor]
	if p == nil {
		if len(s.pending) >= s.cfg.MaxIdentities {
			s.unaudited.Add(float64(len(items)))
			return
		}
		p = &refusalSummary{actorKind: actorKind, actor: actor, first: now, codes: map[string]int{}}
		s.pending[actor] = p
	}
	p.last = now
	p.total += len(items)
	p.batches++
	for _, it := range items {
		p.codes[it.Code]++
	}
	if n := s.cfg.FirstTargets - len(p.items); n > 0 {
		p.items = append(p.items, items[:min(n, len(items))]...)
	}
}

// Start runs the loop until ctx ends or Stop is called; as it ends, every
// pending summary is written.
func (s *RefusalSummaries) Start(ctx context.Context) error { return s.runner.Start(ctx, s.loop) }

// Stop ends the loop after its last flush. Safe to call twice or before
// Start.
func (s *RefusalSummaries) Stop() { s.runner.Stop() }

func (s *RefusalSummaries) loop(ctx context.Context) {
	defer func() {
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if n := s.RunOnce(fctx, true); n > 0 {
			s.unaudited.Add(float64(n))
		}
	}()
	worker.Every(ctx, s.cfg.Tick, func(ctx context.Context) { s.RunOnce(ctx, false) })
}

// RunOnce writes the summaries that are due (all of them when all is set)
// and returns how many refused items are still pending after it because
// their rows could not be written.
func (s *RefusalSummaries) RunOnce(ctx context.Context, all bool) int {
	s.running.Lock()
	defer s.running.Unlock()
	now := s.cfg.Now()
	var due []*refusalSummary
	s.mu.Lock()
	for actor, p := range s.pending {
		if all || !now.Before(p.first) && !now.Before(s.lastRow[actor].Add(s.cfg.Every)) {
			due = append(due, p)
			delete(s.pending, actor)
		}
	}
	for actor, at := range s.lastRow {
		if now.Sub(at) >= s.cfg.Every && s.pending[actor] == nil {
			delete(s.lastRow, actor)
		}
	}
	s.mu.Unlock()
	slices.SortFunc(due, func(a, b *refusalSummary) int { return strings.Compare(a.actor, b.actor) })
	failed := 0
	for _, p := range due {
		if _, err := s.cfg.Log.Append(ctx, now, s.cfg.Entry(p.summary())); err != nil {
			s.log.Warn("audit refused evidence", "actor", p.actor, "refused", p.total, "err", err)
			s.putBack(p)
			failed += p.total
			continue
		}
		s.rows.Inc()
		s.mu.Lock()
		s.lastRow[p.actor] = now
		s.mu.Unlock()
	}
	return failed
}

// putBack merges an unwritten summary into what came since.
func (s *RefusalSummaries) putBack(p *refusalSummary) {
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.pending[p.actor]
	if q == nil {
		s.pending[p.actor] = p
		return
	}
	p.last, p.total, p.batches = q.last, p.total+q.total, p.batches+q.batches
	for c, n := range q.codes {
		p.codes[c] += n
	}
	if n := s.cfg.FirstTargets - len(p.items); n > 0 {
		p.items = append(p.items, q.items[:min(n, len(q.items))]...)
	}
	s.pending[p.actor] = p
}

func (p *refusalSummary) summary() Summary {
	return Summary{ActorKind: p.actorKind, Actor: p.actor, First: p.first, Last: p.last,
		Total: p.total, Batches: p.batches, Codes: p.codes, Items: p.items}
}

// counts writes codes as "3 expired, 1 malformed", by code.
func counts(codes map[string]int) string {
	var parts []string
	for _, c := range slices.Sorted(maps.Keys(codes)) {
		parts = append(parts, fmt.Sprintf("%d %s", codes[c], c))
	}
	return strings.Join(parts, ", ")
}

// evidenceEntry is the "evidence.report" row of refused evidence.
func evidenceEntry(p Summary) Entry {
	type item struct {
		InstanceID string `json:"instance_id"`
		Class      string `json:"class,omitempty"`
		Outcome    string `json:"outcome,omitempty"`
		Code       string `json:"code"`
		Reason     string `json:"reason"`
	}
	items := make([]item, len(p.Items))
	for i, it := range p.Items {
		items[i] = item{InstanceID: it.Target, Class: Clip(it.Class, 32), Outcome: Clip(it.Outcome, 32), Code: it.Code, Reason: Clip(it.Reason, 200)}
	}
	first := ""
	if len(p.Items) > 0 {
		first = p.Items[0].Target
	}
	return Entry{
		ActorKind: p.ActorKind, Actor: p.Actor, Action: "evidence.report", TargetKind: "instance", Target: first,
		Outcome: Refused,
		Reason: fmt.Sprintf("%d report items in %d batches refused for want of authority from %s to %s (%s)",
			p.Total, p.Batches, p.First.UTC().Format(time.RFC3339), p.Last.UTC().Format(time.RFC3339), counts(p.Codes)),
		After: map[string]any{
			"refused_total": p.Total, "batches": p.Batches, "by_code": p.Codes, "first_refused": items,
			"from": p.First.UTC(), "to": p.Last.UTC(),
		},
	}
}
