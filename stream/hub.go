package stream

import (
	"errors"
	"slices"
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
	// KindSynced follows a subscription's catch-up frames: the client
	// now holds everything the server had when it subscribed.
	KindSynced Kind = "synced"
)

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
}

// Hub holds the latest views and fans updates out to subscribers.
type Hub struct {
	cfg Config

	mu       sync.RWMutex
	services map[string]*serviceState
	closed   bool
	subs     int
	peak     int
	views    int // services with a view
}

type serviceState struct {
	view    *Frame
	history []*Frame // deltas, oldest first
	subs    map[*Subscription]struct{}
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
	return &Hub{cfg: cfg, services: map[string]*serviceState{}}
}

// ErrClosed is returned by Subscribe once the hub is draining.
var ErrClosed = errors.New("the streaming tier is shutting down")

// Publish records updates and delivers them to subscribers. Updates must
// come in increasing version order (the assembler's publication order).
func (h *Hub) Publish(updates []Update) {
	now := h.cfg.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, u := range updates {
		if u.View == nil {
			continue
		}
		u.View.PublishedAt = now
		st := h.state(u.View.Service)
		if st.view != nil && u.View.Version <= st.view.Version {
			continue // never go backwards
		}
		if st.view == nil {
			h.views++
		}
		st.view = u.View
		var send *Frame
		if u.Delta != nil {
			u.Delta.PublishedAt = now
			st.history = append(st.history, u.Delta)
			if len(st.history) > h.cfg.History {
				st.history = slices.Delete(st.history, 0, len(st.history)-h.cfg.History)
			}
			send = u.Delta
		} else {
			st.history = st.history[:0]
			send = u.View
		}
		for sub := range st.subs {
			sub.offer(send)
		}
	}
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

// Views is how many services the hub holds a view of.
func (h *Hub) Views() int {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.views
}

// Subscribe registers interest in services, starting after version since
// (0: from scratch). The returned subscription's Initial frames bring the
// client up to date; later ones arrive on C.
func (h *Hub) Subscribe(services []string, since uint64) (*Subscription, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, ErrClosed
	}
	sub := &Subscription{hub: h, services: slices.Clone(services), c: make(chan *Frame, h.cfg.QueueLen), wake: make(chan struct{}, 1)}
	for _, name := range sub.services {
		st := h.state(name)
		st.subs[sub] = struct{}{}
		sub.Initial = append(sub.Initial, st.catchUp(since)...)
	}
	slices.SortStableFunc(sub.Initial, func(a, b *Frame) int { return cmpVersion(a.Version, b.Version) })
	h.subs++
	h.peak = max(h.peak, h.subs)
	return sub, nil
}

// catchUp returns what a client at version since needs: nothing if it is
// current, the deltas after since if the history reaches back that far,
// otherwise the full view.
func (st *serviceState) catchUp(since uint64) []*Frame {
	if st.view == nil || (since != 0 && st.view.Version <= since) {
		return nil
	}
	if since != 0 && len(st.history) > 0 && st.history[0].FromVersion <= since {
		var out []*Frame
		for _, d := range st.history {
			if d.Version > since {
				out = append(out, d)
			}
		}
		if len(out) > 0 && out[0].FromVersion <= since {
			return out
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

// Close stops admitting subscribers and tells every open one to drain
// (reconnect elsewhere, with jitter).
func (h *Hub) Close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	drain := &Frame{Kind: KindDrain, JSON: []byte(`{"reason":"server shutting down; reconnect with jitter"}`)}
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
	// Initial frames bring the client up to date at subscribe time.
	Initial []*Frame

	c      chan *Frame
	mu     sync.Mutex
	resync bool // its queue overflowed: send full views when it drains
	wake   chan struct{}
	closed bool
}

// offer queues f without blocking. Called with the hub's lock held.
func (s *Subscription) offer(f *Frame) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.resync {
		return
	}
	select {
	case s.c <- f:
	default:
		// Too slow: drop its queue rather than grow it, and catch it up
		// with full views once it reads again.
		s.resync = true
		for len(s.c) > 0 {
			<-s.c
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
// up, and clears the overflow, or nil if it has not overflowed.
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
		if st := s.hub.services[name]; st != nil && st.view != nil {
			out = append(out, st.view)
		}
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
	h.subs--
}
