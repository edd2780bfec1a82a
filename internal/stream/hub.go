package stream

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
)

// Kind is what a frame carries.
type Kind string

// Frame kinds, also the SSE event names.
const (
	KindView      Kind = "view"
	KindDelta     Kind = "delta"
	KindHeartbeat Kind = "heartbeat"
	KindDrain     Kind = "drain"
	// KindSynced follows a subscription's catch-up frames once the client
	// holds a view of every service it asked for (sent now, or already
	// current by its since): never before. A service the hub has no view
	// of yet (the evaluator is still rebuilding) holds synced back until
	// its first view is published and sent.
	KindSynced Kind = "synced"
)

// syncedFrame is the one synced frame every subscription shares.
var syncedFrame = &Frame{Kind: KindSynced, JSON: []byte(`{}`)}

// Frame is one encoded event, shared by every subscriber that receives it.
type Frame struct {
	Kind    Kind
	Service string
	Version uint64
	// FromVersion is the version a delta applies to.
	FromVersion uint64
	JSON        []byte
	// Withdrawal marks deltas that take capacity away, for lag accounting.
	Withdrawal bool
	// PublishedAt is when the hub received it.
	PublishedAt time.Time
}

// Update is one service's publication: the new full view, and the delta
// from the previous version (nil for a service's first view).
type Update struct {
	View  *Frame
	Delta *Frame
	// Rebased marks a delta whose base this publisher did not publish
	// itself: it gained the service and restored the last view
	// it had relayed or saved. The hub vouches for such a delta only to a
	// client at exactly its base; one above it may hold a version the
	// previous owner published and this replica never saw, and gets the
	// full view.
	Rebased bool
}

// Config configures a Hub.
type Config struct {
	// History is how many deltas per service are kept for reconnecting
	// clients; older clients get a full view. 64 by default.
	History int
	// QueueLen bounds each subscriber's queue of frames. 64 by default.
	QueueLen int
	// Now defaults to time.Now.
	Now func() time.Time
	// DrainSpread is the window over which subscribers told to drain at
	// shutdown should spread their reconnections: the drain frame
	// carries it as reconnect_within_ms, and a client waits a uniformly
	// random part of it (full jitter) before it subscribes elsewhere, so
	// a replica's subscribers do not land on the others in one burst.
	// 2 s by default; negative for none.
	DrainSpread time.Duration
}

// DefaultDrainSpread is Config.DrainSpread's default.
const DefaultDrainSpread = 2 * time.Second

// Drain is the data of a drain frame: why the stream ends and, when the
// server is shutting down, the window to spread the reconnection over.
type Drain struct {
	Reason string `json:"reason"`
	// ReconnectWithinMS asks the client to reconnect after a uniformly
	// random delay in [0, ReconnectWithinMS) ms; 0 means at once.
	ReconnectWithinMS int64 `json:"reconnect_within_ms,omitempty"`
}

// DrainShutdown is a Drain's reason when the server shuts down.
const DrainShutdown = "server shutting down; reconnect with jitter"

// DrainNotCurrent is a Drain's reason when this replica stops serving a
// service as current (it cannot follow the service's owner while another
// replica can: SetStale). The client keeps what it holds and resumes
// elsewhere with held.
const DrainNotCurrent = "not_current"

// NotCurrentSpread is the window a not_current drain asks its clients to
// spread their reconnection over: short, because they are behind until
// they move, and the move is bounded (docs/replicas.md).
const NotCurrentSpread = time.Second

// ErrNotCurrent is wrapped by Subscribe's error when a service asked for
// is stale here (SetStale): the client should subscribe at another
// replica and keep what it holds meanwhile.
var ErrNotCurrent = errors.New("this replica cannot follow the owner of a service asked for while another replica can")

// Hub holds the latest views and fans updates out to subscribers.
type Hub struct {
	cfg Config

	mu       sync.RWMutex
	services map[string]*serviceState
	closed   bool
	closing  chan struct{} // closed by Close
	subs     int
	peak     int
	views    int // services with a view
	taps     map[*Tap]struct{}
	relayed  uint64 // updates taken from peers (Relay)
	// stale holds the services this replica holds but cannot vouch are
	// current (SetStale): clients are refused them.
	stale map[string]struct{}
}

// Services returns the names of the services the hub holds a view of,
// sorted: what a surface that serves every service (xDS, the DNS zone)
// follows to learn of new ones.
func (h *Hub) Services() []string {
	h.mu.RLock()
	defer h.mu.RUnlock()
	out := make([]string, 0, h.views)
	for name, st := range h.services {
		if st.view != nil && !isRemote(name) {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// CountSubscriber counts a subscriber the hub does not serve itself (an
// xDS stream, which reads views through a subscription of its own) in
// Subscribers and the peak, until done is called (once; later calls do
// nothing): the census and admission then size the population by every
// client that will come back, whatever surface it follows.
func (h *Hub) CountSubscriber() (done func()) {
	h.mu.Lock()
	h.subs++
	h.peak = max(h.peak, h.subs)
	h.mu.Unlock()
	return sync.OnceFunc(func() {
		h.mu.Lock()
		h.subs--
		h.mu.Unlock()
	})
}

type serviceState struct {
	view    *Frame
	history []*Frame // deltas, oldest first
	subs    map[*Subscription]struct{}
	// foreign is the base of the service's first delta in this hub when
	// that base was published by another process (the publisher restored
	// it after a restart): the hub cannot vouch that nothing was
	// published between it and a client's since, because the restored
	// view may be older than the last one published (its save is
	// asynchronous). 0: none.
	foreign uint64
}

// NewHub returns an empty hub.
func NewHub(cfg Config) *Hub {
	if cfg.History == 0 {
		cfg.History = 64
	}
	if cfg.QueueLen == 0 {
		cfg.QueueLen = 64
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.DrainSpread == 0 {
		cfg.DrainSpread = DefaultDrainSpread
	}
	return &Hub{cfg: cfg, services: map[string]*serviceState{}, closing: make(chan struct{})}
}

// Closing is closed once Close has been called: streams the hub does not
// end with a drain frame (the relay to peers, which reads a Tap) end
// when it is.
func (h *Hub) Closing() <-chan struct{} { return h.closing }

// ErrClosed is returned by Subscribe once the hub is draining.
var ErrClosed = errors.New("the streaming tier is shutting down")

// Publish records updates from this replica's own publisher and
// delivers them to subscribers and to the taps (the relay to peers).
// Updates must come in increasing version order per service (the
// assembler's publication order).
//
// A delta goes to subscribers only when it applies to the view the hub
// holds (its from_version is that view's version): otherwise, as for a
// service's first publication in this hub (after a restart the
// publisher's first version may be a delta from a version the previous
// process published), subscribers get the full view, and the delta is
// kept only for a client resuming at exactly its base. Subscribers that
// were waiting for a first view get synced after it once they hold a view
// of every service they asked for.
func (h *Hub) Publish(updates []Update) {
	h.mu.Lock()
	defer h.mu.Unlock()
	accepted := h.apply(updates)
	for t := range h.taps {
		t.offer(accepted)
	}
}

// Relay records updates another replica published (every
// replica serves every view; versions are issued only by a service's
// owner), as Publish does but for the taps: a replica relays only what it
// published itself. Updates at or below the version held are dropped, so
// the same update relayed twice, or a deposed owner's late one, changes
// nothing. It returns how many were taken.
func (h *Hub) Relay(updates []Update) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := len(h.apply(updates))
	h.relayed += uint64(n)
	return n
}

// Relayed is how many updates Relay has taken.
func (h *Hub) Relayed() uint64 {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.relayed
}

// apply records updates, returning those taken. Called with h.mu held.
func (h *Hub) apply(updates []Update) []Update {
	now := h.cfg.Now()
	var accepted []Update
	for _, u := range updates {
		if u.View == nil {
			continue
		}
		st := h.state(u.View.Service)
		if st.view != nil && u.View.Version <= st.view.Version {
			continue // never go backwards
		}
		accepted = append(accepted, u)
		first := st.view == nil
		if first && !isRemote(u.View.Service) {
			h.views++
		}
		chained := !first && u.Delta != nil && u.Delta.FromVersion == st.view.Version
		u.View.PublishedAt = now
		st.view = u.View
		send := u.View
		switch {
		case u.Delta == nil:
			st.history, st.foreign = st.history[:0], 0
		case chained && !u.Rebased:
			u.Delta.PublishedAt = now
			st.history = append(st.history, u.Delta)
			if len(st.history) > h.cfg.History {
				st.history = slices.Delete(st.history, 0, len(st.history)-h.cfg.History)
			}
			send = u.Delta
		default:
			// A first publication, a delta from a base this hub does not
			// hold, or a rebased one: kept only for a client at exactly
			// its base. A chained rebased delta still goes to subscribers,
			// who hold what the hub holds.
			u.Delta.PublishedAt = now
			st.history = append(st.history[:0], u.Delta)
			st.foreign = u.Delta.FromVersion
			if chained {
				send = u.Delta
			}
		}
		for sub := range st.subs {
			if f := sub.pick(send, u.View); f != nil {
				sub.offer(f)
			}
			if first {
				sub.gotFirstView(u.View.Service)
			}
		}
	}
	return accepted
}

// Snapshot returns the latest view of every service the hub holds, in
// service order: what a peer starting to relay from this replica needs
// first.
func (h *Hub) Snapshot() []*Frame {
	h.mu.RLock()
	defer h.mu.RUnlock()
	out := make([]*Frame, 0, h.views)
	for name, st := range h.services {
		if st.view != nil && !isRemote(name) {
			out = append(out, st.view)
		}
	}
	slices.SortFunc(out, func(a, b *Frame) int {
		if a.Service < b.Service {
			return -1
		}
		if a.Service > b.Service {
			return 1
		}
		return 0
	})
	return out
}

// Tap follows what this replica's own publisher publishes (Publish, not
// Relay), for relaying to a peer. Its queue is bounded: a tap that falls
// behind by more than its limit drops the queue and is marked to resync
// (Take reports it), after which its reader sends Snapshot again.
type Tap struct {
	hub   *Hub
	limit int

	mu     sync.Mutex
	queue  []Update
	resync bool
	closed bool
	wake   chan struct{}
}

// Tap returns a tap holding at most limit updates (4,096 when limit <= 0).
func (h *Hub) Tap(limit int) *Tap {
	if limit <= 0 {
		limit = 4096
	}
	t := &Tap{hub: h, limit: limit, wake: make(chan struct{}, 1)}
	h.mu.Lock()
	if h.taps == nil {
		h.taps = map[*Tap]struct{}{}
	}
	h.taps[t] = struct{}{}
	h.mu.Unlock()
	return t
}

// Wake receives a value when updates (or a resync) wait to be taken.
func (t *Tap) Wake() <-chan struct{} { return t.wake }

// Take returns the updates queued since the last call, and whether the
// tap overflowed since (its reader must send a snapshot: updates were
// lost).
func (t *Tap) Take() (updates []Update, resync bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	updates, resync = t.queue, t.resync
	t.queue, t.resync = nil, false
	return updates, resync
}

func (t *Tap) offer(us []Update) {
	if len(us) == 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return
	}
	if len(t.queue)+len(us) > t.limit {
		t.queue, t.resync = nil, true
	} else {
		t.queue = append(t.queue, us...)
	}
	select {
	case t.wake <- struct{}{}:
	default:
	}
}

// Close stops the tap.
func (t *Tap) Close() {
	t.hub.mu.Lock()
	delete(t.hub.taps, t)
	t.hub.mu.Unlock()
	t.mu.Lock()
	t.closed, t.queue = true, nil
	t.mu.Unlock()
}

func (h *Hub) state(service string) *serviceState {
	st := h.services[service]
	if st == nil {
		st = &serviceState{subs: map[*Subscription]struct{}{}}
		h.services[service] = st
	}
	return st
}

// View returns the latest encoded view of a service.
func (h *Hub) View(service string) (*Frame, bool) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	st := h.services[service]
	if st == nil || st.view == nil {
		return nil, false
	}
	return st.view, true
}

// Views is how many (local) services the hub holds a view of.
func (h *Hub) Views() int {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.views
}

// Subscribe registers interest in services, starting after version since
// (0: from scratch). The returned subscription's Initial frames bring the
// client up to date, ending with a synced frame when the hub holds a view
// of every service; later frames arrive on C. For a service the hub has
// no view of yet, the client keeps what it has: its first view arrives on
// C when it is published, and synced after the last such view.
func (h *Hub) Subscribe(services []string, since uint64) (*Subscription, error) {
	return h.subscribe(services, since, nil, true)
}

// SubscribeHeld is Subscribe for a client that says which version it
// holds of each service in held. A version names one view in
// the region (an owner's epoch is its high half), so the client's base is
// known exactly, whichever replica published it and whichever replica
// it resumes on: it gets nothing if it holds the hub's view or a later
// one, the deltas from exactly its version if the hub kept them, else the
// full view; and the hub sends it nothing at or below the version it
// holds (a replica whose relay lags behind the client). synced still
// waits for the hub's first view of each service (only then can it say
// the client is current), however old that view. since applies to the
// services not in held.
//
// A single watermark cannot say this across owners: a service published
// under an older epoch has versions below a watermark another owner's
// newer epoch set, so "current by its since" would be wrong.
func (h *Hub) SubscribeHeld(services []string, since uint64, held map[string]uint64) (*Subscription, error) {
	return h.subscribe(services, since, held, true)
}

// Follow is Subscribe for muster's own surfaces that read the views to
// serve them in another protocol (the DNS zone, the xDS server): the
// subscription is not a client, so it is not counted in Subscribers, the
// peak or the census. Those surfaces count their clients themselves
// (CountSubscriber).
func (h *Hub) Follow(services []string, since uint64) (*Subscription, error) {
	return h.subscribe(services, since, nil, false)
}

func (h *Hub) subscribe(services []string, since uint64, held map[string]uint64, counted bool) (*Subscription, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, ErrClosed
	}
	if counted && len(h.stale) > 0 {
		var stale []string
		for _, name := range services {
			if _, ok := h.stale[name]; ok {
				stale = append(stale, name)
			}
		}
		if len(stale) > 0 {
			slices.Sort(stale)
			return nil, fmt.Errorf("%w: %s", ErrNotCurrent, strings.Join(stale, ", "))
		}
	}
	sub := &Subscription{hub: h, services: slices.Clone(services), c: make(chan *Frame, h.cfg.QueueLen), wake: make(chan struct{}, 1), counted: counted}
	for _, name := range sub.services {
		st := h.state(name)
		st.subs[sub] = struct{}{}
		if v, ok := held[name]; ok && v != 0 {
			switch {
			case st.view == nil:
				// The client holds one; synced still waits for this
				// hub's, which alone can say the client is current.
				sub.setFloor(name, v)
			case v >= st.view.Version:
				sub.setFloor(name, v)
				continue
			default:
				sub.Initial = append(sub.Initial, st.catchUpFrom(v)...)
				continue
			}
		}
		if st.view == nil {
			if sub.waiting == nil {
				sub.waiting = map[string]struct{}{}
			}
			sub.waiting[name] = struct{}{}
			continue
		}
		sub.Initial = append(sub.Initial, st.catchUp(since)...)
	}
	slices.SortStableFunc(sub.Initial, func(a, b *Frame) int { return cmpVersion(a.Version, b.Version) })
	if len(sub.waiting) == 0 {
		sub.Initial = append(sub.Initial, syncedFrame)
	}
	if counted {
		h.subs++
		h.peak = max(h.peak, h.subs)
	}
	return sub, nil
}

// catchUp returns what a client at version since needs: nothing if it is
// current, the deltas after since if the history reaches back that far,
// otherwise the full view. The service must have a view.
//
// since is a version at or below every version the client holds of its
// services (the lowest it holds; a client naming each service's version
// uses SubscribeHeld). Deltas the client already holds it drops. Deltas published by this hub form an
// unbroken chain, so the chain's first delta from at or below since is
// the client's base. A chain starting at a base another process
// published (foreign) is used only by a client at exactly that base: one
// above it may hold a later version the previous process published and
// this one never saw (a crash before the save), and a delta from another
// base would corrupt its copy. It gets the full view instead.
func (st *serviceState) catchUp(since uint64) []*Frame {
	if since != 0 && st.view.Version <= since {
		return nil
	}
	if since != 0 && len(st.history) > 0 && st.history[0].FromVersion <= since {
		var out []*Frame
		for _, d := range st.history {
			if d.Version > since {
				out = append(out, d)
			}
		}
		if len(out) > 0 && out[0].FromVersion <= since && (out[0].FromVersion != st.foreign || since == st.foreign) {
			return out
		}
	}
	return []*Frame{st.view}
}

// catchUpFrom returns what a client holding exactly version v (below the
// hub's view) needs: the deltas from v if the hub kept the chain from it,
// otherwise the full view. Versions are unique in the region, so a chain
// starting at v is the client's, even one from a base another process
// published (foreign).
func (st *serviceState) catchUpFrom(v uint64) []*Frame {
	for i, d := range st.history {
		if d.FromVersion == v {
			return slices.Clone(st.history[i:])
		}
	}
	return []*Frame{st.view}
}

// Subscribers is how many subscriptions are open; Peak the most seen.
func (h *Hub) Subscribers() (now, peak int) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.subs, h.peak
}

// Close stops admitting subscribers and tells every open one to drain:
// reconnect elsewhere, after a random part of Config.DrainSpread
// (reconnect_within_ms in the frame).
func (h *Hub) Close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.closed {
		close(h.closing)
	}
	h.closed = true
	b, err := json.Marshal(Drain{Reason: DrainShutdown, ReconnectWithinMS: max(h.cfg.DrainSpread.Milliseconds(), 0)})
	if err != nil {
		panic(err) // a struct of a string and an int
	}
	drain := &Frame{Kind: KindDrain, JSON: b}
	seen := map[*Subscription]bool{}
	for _, st := range h.services {
		for sub := range st.subs {
			if !seen[sub] {
				seen[sub] = true
				sub.offer(drain)
			}
		}
	}
}

// SetStale replaces the set of services this replica holds but cannot
// vouch are current: their owner is a peer this replica cannot follow
// while another replica can (internal/relay). Client subscriptions
// (Subscribe, SubscribeHeld) naming one are refused with ErrNotCurrent,
// and every client subscribed to a service that becomes stale is told
// to drain (reason not_current, reconnect within NotCurrentSpread): it
// keeps what it holds and resumes at another replica with held. muster's
// own surfaces (Follow) are neither refused nor drained; relayed views
// of a stale service are still taken. It returns how many subscriptions
// were told to drain.
func (h *Hub) SetStale(services []string) (drained int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	next := make(map[string]struct{}, len(services))
	for _, name := range services {
		next[name] = struct{}{}
	}
	var drain *Frame
	seen := map[*Subscription]bool{}
	for name := range next {
		if _, was := h.stale[name]; was {
			continue
		}
		st := h.services[name]
		if st == nil {
			continue
		}
		for sub := range st.subs {
			if !sub.counted || seen[sub] {
				continue
			}
			seen[sub] = true
			if drain == nil {
				b, err := json.Marshal(Drain{Reason: DrainNotCurrent, ReconnectWithinMS: NotCurrentSpread.Milliseconds()})
				if err != nil {
					panic(err) // a struct of a string and an int
				}
				drain = &Frame{Kind: KindDrain, JSON: b}
			}
			sub.offer(drain)
			drained++
		}
	}
	if len(next) == 0 {
		next = nil
	}
	h.stale = next
	return drained
}

// Stale reports whether service is stale here (SetStale).
func (h *Hub) Stale(service string) bool {
	h.mu.RLock()
	defer h.mu.RUnlock()
	_, ok := h.stale[service]
	return ok
}

func cmpVersion(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Subscription is one watcher's view of the hub.
type Subscription struct {
	hub      *Hub
	services []string
	// counted: a client's (Subscribe), in Subscribers; not one of
	// muster's own surfaces (Follow).
	counted bool
	// Initial frames bring the client up to date at subscribe time.
	Initial []*Frame

	// waiting holds the services it asked for that had no view when it
	// subscribed and have not had one published since; synced goes out
	// when it empties. Guarded by the hub's lock.
	waiting map[string]struct{}
	// floor holds, per service, a version the client said it holds above
	// the hub's view (SubscribeHeld): frames at or below it are not sent;
	// the first above it clears it. Guarded by the hub's lock.
	floor map[string]uint64

	c      chan *Frame
	mu     sync.Mutex
	resync bool // its queue overflowed: send full views when it drains
	// syncedOwed: a synced frame was dropped with an overflowed queue
	// (or could not be queued); it follows the resync's full views.
	syncedOwed bool
	wake       chan struct{}
	closed     bool
}

// gotFirstView notes that service's first view was offered, and offers
// synced when it was the last one the subscription waited for. Called
// with the hub's lock held.
func (s *Subscription) gotFirstView(service string) {
	if _, ok := s.waiting[service]; !ok {
		return
	}
	delete(s.waiting, service)
	if len(s.waiting) == 0 {
		s.offer(syncedFrame)
	}
}

// setFloor notes that the client holds service at v. Called with the
// hub's lock held.
func (s *Subscription) setFloor(service string, v uint64) {
	if s.floor == nil {
		s.floor = map[string]uint64{}
	}
	s.floor[service] = v
}

// pick is what the client gets of a publication whose frame for
// subscribers is send and whose view is view: send, unless the client
// holds a later version than the hub did (a floor): then nothing at or
// below it, and above it the view rather than a delta from another base;
// the first frame above the floor clears it. Called with the hub's lock
// held.
func (s *Subscription) pick(send, view *Frame) *Frame {
	v, ok := s.floor[view.Service]
	if !ok {
		return send
	}
	if view.Version <= v {
		return nil
	}
	delete(s.floor, view.Service)
	if send.Kind == KindDelta && send.FromVersion != v {
		return view
	}
	return send
}

// belowFloor reports whether the client holds view's service at view's
// version or later. Called with the hub's lock held, read or write.
func (s *Subscription) belowFloor(view *Frame) bool {
	v, ok := s.floor[view.Service]
	return ok && view.Version <= v
}

// offer queues f without blocking. Called with the hub's lock held.
func (s *Subscription) offer(f *Frame) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	if s.resync {
		s.syncedOwed = s.syncedOwed || f == syncedFrame
		return
	}
	select {
	case s.c <- f:
	default:
		// Too slow: drop its queue rather than grow it, and catch it up
		// with full views once it reads again.
		s.resync = true
		s.syncedOwed = f == syncedFrame
		for len(s.c) > 0 {
			if <-s.c == syncedFrame {
				s.syncedOwed = true
			}
		}
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
}

// C delivers frames after the initial ones.
func (s *Subscription) C() <-chan *Frame { return s.c }

// Resync is signalled when the subscription overflowed; call TakeResync.
func (s *Subscription) Resync() <-chan struct{} { return s.wake }

// TakeResync returns the full views that catch an overflowed subscriber
// up (followed by synced if one was dropped with the queue), and clears
// the overflow, or nil if it has not overflowed.
func (s *Subscription) TakeResync() []*Frame {
	s.hub.mu.RLock()
	defer s.hub.mu.RUnlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.resync {
		return nil
	}
	s.resync = false
	var out []*Frame
	for _, name := range s.services {
		if st := s.hub.services[name]; st != nil && st.view != nil && !s.belowFloor(st.view) {
			out = append(out, st.view)
		}
	}
	if s.syncedOwed {
		s.syncedOwed = false
		out = append(out, syncedFrame)
	}
	return out
}

// Close unsubscribes.
func (s *Subscription) Close() {
	h := s.hub
	h.mu.Lock()
	defer h.mu.Unlock()
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	s.mu.Unlock()
	for _, name := range s.services {
		if st := h.services[name]; st != nil {
			delete(st.subs, s)
		}
	}
	if s.counted {
		h.subs--
	}
}
