package ownerread

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/musterhq/muster/internal/eligibility"
	"github.com/musterhq/muster/internal/evaluator"
	"github.com/musterhq/muster/internal/peer"
)

// Paths of the owner's read endpoints (served by package server, signed
// by the asking replica with the region's key).
const (
	// EligibilityPath is followed by the escaped service name.
	EligibilityPath = "/v1/peer/eligibility/"
	QuarantinesPath = "/v1/peer/quarantines"
	StatsPath       = "/v1/peer/stats"
)

// Defaults of Config.
const (
	// DefaultTimeout bounds one request to an owner: a read an operator
	// waits for, so a dead owner costs a second, not a TCP timeout.
	DefaultTimeout = time.Second
	// DefaultCacheFor is how long a merged list is reused.
	DefaultCacheFor = time.Second
	// DefaultHoldFor is how long QuarantinesHeld uses a replica's last
	// answer while it does not answer: longer than a shard takes to move
	// off a dead replica (9 s) and its new owner to be asked.
	DefaultHoldFor = 30 * time.Second
	// maxBody bounds an owner's answer (a list of every quarantine or
	// every service's counts it owns).
	maxBody = 64 << 20
)

// ErrOwnerUnreachable is wrapped by OwnerUnreachableError.
var ErrOwnerUnreachable = errors.New("the replica that owns the service did not answer")

// OwnerUnreachableError says which replica owns a service and could not
// be asked about it. Nothing is made up in its place: the caller says
// "retry", not "unknown".
type OwnerUnreachableError struct {
	Service, Owner string
	Err            error
}

func (e *OwnerUnreachableError) Error() string {
	return fmt.Sprintf("replica %s owns service %s and did not answer: %v", e.Owner, e.Service, e.Err)
}

// Unwrap returns ErrOwnerUnreachable and the cause.
func (e *OwnerUnreachableError) Unwrap() []error { return []error{ErrOwnerUnreachable, e.Err} }

// Evaluator is the local evaluator's state (evaluator.Evaluator).
type Evaluator interface {
	ServiceEligibility(service string) (evaluator.ServiceEligibility, error)
	QuarantineAlarms() []evaluator.QuarantineAlarm
	AllServiceStats() ([]eligibility.ServiceStats, time.Time, error)
}

// Ownership says who owns a service (ownership.Manager).
type Ownership interface {
	// Owner is this replica's id when it owns service, another live
	// replica's when the last reading showed it holding the shard, ""
	// when the shard has no live owner; known is false before the first
	// reading.
	Owner(service string) (id string, known bool)
	// Publishes is whether this replica still publishes service (it
	// owns it, or hands it over): it answers a peer's list for those.
	Publishes(service string) bool
}

// Peer is another live replica of the region.
type Peer struct {
	ID, Address string
	// Owns is whether it held any shard at the last reading: lists are
	// asked only of those.
	Owns bool
}

// Config configures a Reader.
type Config struct {
	// Self is this replica's id.
	Self      string
	Evaluator Evaluator
	// Ownership, nil, answers everything locally (a replica alone).
	Ownership Ownership
	// Peers lists the other live replicas with their addresses (the
	// forwarder's and the relay's list).
	Peers func() []Peer
	// Signer signs the requests as this replica with the region's key;
	// without a key nothing can be asked and everything is local.
	Signer peer.Signer
	Client *http.Client
	// Timeout bounds one request to an owner: DefaultTimeout.
	Timeout time.Duration
	// CacheFor: DefaultCacheFor; HoldFor: DefaultHoldFor.
	CacheFor, HoldFor time.Duration
	Logger            *slog.Logger
	// Registerer takes the metrics; nil registers none.
	Registerer prometheus.Registerer
	Now        func() time.Time
}

// Validate checks the configuration and fills defaults.
func (c *Config) Validate() error {
	switch {
	case c.Evaluator == nil:
		return errors.New("ownerread: Evaluator is required")
	case c.Ownership != nil && (c.Self == "" || c.Peers == nil):
		return errors.New("ownerread: Self and Peers are required with Ownership")
	case c.Timeout < 0 || c.CacheFor < 0 || c.HoldFor < 0:
		return errors.New("ownerread: Timeout, CacheFor and HoldFor must not be negative")
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.CacheFor == 0 {
		c.CacheFor = DefaultCacheFor
	}
	if c.HoldFor == 0 {
		c.HoldFor = DefaultHoldFor
	}
	if c.Client == nil {
		c.Client = &http.Client{}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return nil
}

// Reader answers reads of evaluator state from the replica that holds
// it. Safe for concurrent use.
type Reader struct {
	cfg     Config
	log     *slog.Logger
	metrics metrics

	mu          sync.Mutex
	quarantines cached[[]evaluator.QuarantineAlarm]
	stats       cached[statsAnswer]
	// lastQuarantines is each peer's last answer, for QuarantinesHeld.
	lastQuarantines map[string]held
}

type cached[T any] struct {
	at         time.Time
	v          T
	unanswered []string
	ok         bool
}

type held struct {
	at time.Time
	qs []evaluator.QuarantineAlarm
}

// New returns a Reader.
func New(cfg Config) (*Reader, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	return &Reader{cfg: cfg, log: cfg.Logger.With("component", "ownerread"), metrics: m, lastQuarantines: map[string]held{}}, nil
}

// local reports whether this replica answers for service itself, and
// otherwise which replica does.
func (r *Reader) local(service string) (owner string, local bool) {
	if r.cfg.Ownership == nil || r.cfg.Signer.Key == nil {
		return "", true
	}
	id, known := r.cfg.Ownership.Owner(service)
	if !known || id == "" || id == r.cfg.Self {
		return id, true
	}
	return id, false
}

// Answers reports whether this replica answers a peer's list for
// service: it would answer it itself, or it still publishes it.
func (r *Reader) Answers(service string) bool {
	if _, local := r.local(service); local {
		return true
	}
	return r.cfg.Ownership.Publishes(service)
}

// Eligibility returns service's verdicts from its owner: this replica's
// evaluator when it answers for the service, else the owner's, asked
// within Timeout. An owner that does not answer is an
// *OwnerUnreachableError.
func (r *Reader) Eligibility(ctx context.Context, service string) (evaluator.ServiceEligibility, error) {
	owner, local := r.local(service)
	if local {
		return r.cfg.Evaluator.ServiceEligibility(service)
	}
	var out evaluator.ServiceEligibility
	err := r.ask(ctx, kindEligibility, owner, EligibilityPath+url.PathEscape(service), &out)
	if err != nil {
		return evaluator.ServiceEligibility{}, &OwnerUnreachableError{Service: service, Owner: owner, Err: err}
	}
	return out, nil
}

// LocalQuarantines are the quarantines in force of the services this
// replica answers a peer for (Answers).
func (r *Reader) LocalQuarantines() []evaluator.QuarantineAlarm {
	qs := r.cfg.Evaluator.QuarantineAlarms()
	return slices.DeleteFunc(qs, func(q evaluator.QuarantineAlarm) bool { return !r.Answers(q.Service) })
}

// LocalStats are the counts of the services this replica answers a peer
// for, with when they were taken.
func (r *Reader) LocalStats() ([]eligibility.ServiceStats, time.Time, error) {
	st, at, err := r.cfg.Evaluator.AllServiceStats()
	if err != nil {
		return nil, at, err
	}
	return slices.DeleteFunc(st, func(s eligibility.ServiceStats) bool { return !r.Answers(s.Service) }), at, nil
}

// Quarantines returns the region's quarantines in force, each from its
// service's owner, and the replicas that did not answer (their
// quarantines are missing).
func (r *Reader) Quarantines(ctx context.Context) (qs []evaluator.QuarantineAlarm, unanswered []string) {
	qs, unanswered, _ = r.quarantinesFrom(ctx, false)
	return qs, unanswered
}

// QuarantinesHeld is Quarantines, but a replica that does not answer is
// stood in for by its last answer while that is younger than HoldFor
// (the notifier: an owner briefly away must not resolve its alerts).
// unanswered names the replicas neither heard nor stood in for.
func (r *Reader) QuarantinesHeld(ctx context.Context) (qs []evaluator.QuarantineAlarm, unanswered []string) {
	qs, unanswered, _ = r.quarantinesFrom(ctx, true)
	return qs, unanswered
}

func (r *Reader) quarantinesFrom(ctx context.Context, hold bool) ([]evaluator.QuarantineAlarm, []string, error) {
	now := r.cfg.Now()
	r.mu.Lock()
	c := r.quarantines
	r.mu.Unlock()
	if !c.ok || now.Sub(c.at) >= r.cfg.CacheFor {
		local := r.cfg.Evaluator.QuarantineAlarms()
		answers, unanswered := fanOut(ctx, r, kindQuarantines, QuarantinesPath, func(b *quarantineList) []evaluator.QuarantineAlarm { return b.Quarantines })
		r.mu.Lock()
		for id, qs := range answers {
			r.lastQuarantines[id] = held{at: now, qs: qs}
		}
		r.mu.Unlock()
		c = cached[[]evaluator.QuarantineAlarm]{at: now, ok: true, unanswered: unanswered,
			v: merge(r, local, answers, func(q evaluator.QuarantineAlarm) string { return q.Service })}
		r.mu.Lock()
		r.quarantines = c
		r.mu.Unlock()
	}
	qs, unanswered := slices.Clone(c.v), slices.Clone(c.unanswered)
	if hold && len(unanswered) > 0 {
		stand := map[string][]evaluator.QuarantineAlarm{}
		var still []string
		r.mu.Lock()
		for _, id := range unanswered {
			if h, ok := r.lastQuarantines[id]; ok && now.Sub(h.at) < r.cfg.HoldFor {
				stand[id] = h.qs
			} else {
				still = append(still, id)
			}
		}
		r.mu.Unlock()
		qs = append(qs, merge(r, nil, stand, func(q evaluator.QuarantineAlarm) string { return q.Service })...)
		sortQuarantines(qs)
		unanswered = still
	}
	if len(unanswered) > 0 {
		r.metrics.incomplete.WithLabelValues(string(kindQuarantines)).Inc()
	}
	return qs, unanswered, nil
}

type statsAnswer struct {
	stats []eligibility.ServiceStats
	at    time.Time
}

// Stats returns every service's counts, each from its owner, the time
// this replica's own were taken, and the replicas that did not answer
// (their services are missing). It fails only when this replica's own
// evaluator does (evaluator.ErrNotReady).
func (r *Reader) Stats(ctx context.Context) ([]eligibility.ServiceStats, time.Time, []string, error) {
	now := r.cfg.Now()
	r.mu.Lock()
	c := r.stats
	r.mu.Unlock()
	if !c.ok || now.Sub(c.at) >= r.cfg.CacheFor {
		local, at, err := r.cfg.Evaluator.AllServiceStats()
		if err != nil {
			return nil, at, nil, err
		}
		answers, unanswered := fanOut(ctx, r, kindStats, StatsPath, func(b *statsList) []eligibility.ServiceStats { return b.Stats })
		merged := merge(r, local, answers, func(s eligibility.ServiceStats) string { return s.Service })
		slices.SortFunc(merged, func(a, b eligibility.ServiceStats) int { return strings.Compare(a.Service, b.Service) })
		c = cached[statsAnswer]{at: now, ok: true, unanswered: unanswered, v: statsAnswer{stats: merged, at: at}}
		r.mu.Lock()
		r.stats = c
		r.mu.Unlock()
	}
	if len(c.unanswered) > 0 {
		r.metrics.incomplete.WithLabelValues(string(kindStats)).Inc()
	}
	return slices.Clone(c.v.stats), c.v.at, slices.Clone(c.unanswered), nil
}

// merge keeps each service's items from one source only: this replica's
// own for the services it answers for, and a peer's for the services this
// replica's reading says that peer owns. A service whose shard moved
// since a peer's reading is thus never listed twice.
func merge[T any](r *Reader, local []T, answers map[string][]T, service func(T) string) []T {
	var out []T
	for _, it := range local {
		if _, ok := r.local(service(it)); ok {
			out = append(out, it)
		}
	}
	for _, id := range slices.Sorted(maps.Keys(answers)) {
		for _, it := range answers[id] {
			if owner, ok := r.local(service(it)); !ok && owner == id {
				out = append(out, it)
			}
		}
	}
	return out
}

func sortQuarantines(qs []evaluator.QuarantineAlarm) {
	slices.SortFunc(qs, func(a, b evaluator.QuarantineAlarm) int {
		if c := strings.Compare(a.Service, b.Service); c != 0 {
			return c
		}
		return slices.Compare(a.InstanceID[:], b.InstanceID[:])
	})
}

// quarantineList is the body of GET /v1/peer/quarantines.
type quarantineList struct {
	Quarantines []evaluator.QuarantineAlarm `json:"quarantines"`
}

// statsList is the body of GET /v1/peer/stats.
type statsList struct {
	Stats []eligibility.ServiceStats `json:"stats"`
	At    time.Time                  `json:"at"`
}

// QuarantineBody and StatsBody are what the owner's endpoints answer.
func QuarantineBody(qs []evaluator.QuarantineAlarm) any {
	if qs == nil {
		qs = []evaluator.QuarantineAlarm{}
	}
	return quarantineList{Quarantines: qs}
}

// StatsBody is the body of GET /v1/peer/stats.
func StatsBody(st []eligibility.ServiceStats, at time.Time) any {
	if st == nil {
		st = []eligibility.ServiceStats{}
	}
	return statsList{Stats: st, At: at}
}

// fanOut asks every live peer that holds shards for path in parallel,
// and returns each answer by peer, and the peers that did not answer.
func fanOut[B any, T any](ctx context.Context, r *Reader, k kind, path string, items func(*B) []T) (map[string][]T, []string) {
	if r.cfg.Ownership == nil || r.cfg.Signer.Key == nil {
		return nil, nil
	}
	var peers []Peer
	for _, p := range r.cfg.Peers() {
		if p.Owns && p.ID != r.cfg.Self {
			peers = append(peers, p)
		}
	}
	type answer struct {
		id    string
		items []T
		err   error
	}
	ch := make(chan answer, len(peers))
	var wg sync.WaitGroup
	for _, p := range peers {
		wg.Go(func() {
			var b B
			err := r.askPeer(ctx, k, p, path, &b)
			ch <- answer{id: p.ID, items: items(&b), err: err}
		})
	}
	wg.Wait()
	close(ch)
	out := map[string][]T{}
	var unanswered []string
	for a := range ch {
		if a.err != nil {
			r.log.Warn("a replica did not answer for the services it owns; they are left out of the list", "kind", k, "peer", a.id, "err", a.err)
			unanswered = append(unanswered, a.id)
			continue
		}
		out[a.id] = a.items
	}
	slices.Sort(unanswered)
	return out, unanswered
}

// ask asks the replica id (by its address in Peers) for path.
func (r *Reader) ask(ctx context.Context, k kind, id, path string, into any) error {
	for _, p := range r.cfg.Peers() {
		if p.ID == id {
			return r.askPeer(ctx, k, p, path, into)
		}
	}
	r.metrics.requests.WithLabelValues(string(k), "no_address").Inc()
	return fmt.Errorf("replica %s is not among the live replicas with an address", id)
}

func (r *Reader) askPeer(ctx context.Context, k kind, p Peer, path string, into any) error {
	result, err := r.get(ctx, p, path, into)
	r.metrics.requests.WithLabelValues(string(k), result).Inc()
	return err
}

// get is one signed GET; result labels the outcome for the metrics.
func (r *Reader) get(ctx context.Context, p Peer, path string, into any) (result string, err error) {
	if p.Address == "" {
		return "no_address", fmt.Errorf("replica %s advertises no address", p.ID)
	}
	ctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(p.Address, "/")+path, nil)
	if err != nil {
		return "unsendable", fmt.Errorf("build the request: %w", err)
	}
	if err := r.cfg.Signer.Sign(ctx, req, p.ID, nil); err != nil {
		return "unsendable", fmt.Errorf("sign the request: %w", err)
	}
	res, err := r.cfg.Client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return "timeout", fmt.Errorf("no answer within %s: %w", r.cfg.Timeout, err)
		}
		return "unreachable", err
	}
	defer res.Body.Close()
	body, err := io.ReadAll(io.LimitReader(res.Body, maxBody))
	if err != nil {
		if ctx.Err() != nil {
			return "timeout", fmt.Errorf("no answer within %s: %w", r.cfg.Timeout, err)
		}
		return "unreachable", fmt.Errorf("read the answer: %w", err)
	}
	if res.StatusCode != http.StatusOK {
		return "refused", fmt.Errorf("it answered %s: %s", res.Status, strings.TrimSpace(string(body[:min(len(body), 512)])))
	}
	if err := json.Unmarshal(body, into); err != nil {
		return "malformed", fmt.Errorf("decode the answer: %w", err)
	}
	return "ok", nil
}

// PageEvaluator is what Local needs of an evaluator.
type PageEvaluator interface {
	ServiceEligibility(service string) (evaluator.ServiceEligibility, error)
	AllServiceStats() ([]eligibility.ServiceStats, time.Time, error)
}

// Local is a Reader that answers everything from ev: a replica alone, or
// a page under test.
func Local(ev PageEvaluator) *Reader {
	e, ok := ev.(Evaluator)
	if !ok {
		e = noQuarantines{ev}
	}
	r, err := New(Config{Evaluator: e})
	if err != nil {
		panic(err) // only Evaluator is required, and it is set
	}
	return r
}

type noQuarantines struct{ PageEvaluator }

func (noQuarantines) QuarantineAlarms() []evaluator.QuarantineAlarm { return nil }
