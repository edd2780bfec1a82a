package streamcheck

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/url"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/google/uuid"

	"github.com/musterhq/muster/internal/assembler"
)

// Config says what a Checker watches and how it reconnects.
type Config struct {
	// URL is muster's base URL (http://host:port).
	URL string
	// Replicas, when set, are the base URLs of several replicas of one
	// region: each subscription goes to one of them at random, as a
	// client behind a load balancer or rotating URLs does.
	// Compare reads URL.
	Replicas []string
	// Services are the services watched, on one stream.
	Services []string
	// Token is the bearer token of every request (watch and resolve).
	Token string
	// HTTPClient makes the requests. It must not time a stream out
	// (Timeout 0); a stream is watched by HeartbeatTimeout instead.
	// Default: a client of the checker's own.
	HTTPClient *http.Client
	// HeartbeatTimeout: a stream that brings no frame (heartbeats
	// included) for this long is dropped and resumed: 45 s, three of
	// muster's heartbeat periods.
	HeartbeatTimeout time.Duration
	// BaseBackoff and MaxBackoff bound the full-jitter wait before each
	// new subscription (doubling from BaseBackoff while subscriptions
	// bring nothing): 50 ms and 1 s. A Retry-After from the server is
	// waited for in full.
	BaseBackoff, MaxBackoff time.Duration
	// Rand returns a number in [0, 1) for the jitter: math/rand/v2 by
	// default.
	Rand func() float64
	// MaxEvents bounds the problems kept for Events (all are counted): 100.
	MaxEvents int
}

func (c *Config) defaults() error {
	if c.URL == "" {
		return errors.New("streamcheck: a URL is required")
	}
	if len(c.Services) == 0 {
		return errors.New("streamcheck: at least one service is required")
	}
	c.URL = strings.TrimRight(c.URL, "/")
	replicas := make([]string, len(c.Replicas))
	for i, u := range c.Replicas {
		replicas[i] = strings.TrimRight(u, "/")
	}
	c.Replicas = replicas
	c.Services = slices.Compact(slices.Sorted(slices.Values(c.Services)))
	if c.HTTPClient == nil {
		c.HTTPClient = &http.Client{Transport: &http.Transport{DisableCompression: true}}
	}
	if c.HeartbeatTimeout <= 0 {
		c.HeartbeatTimeout = 45 * time.Second
	}
	if c.BaseBackoff <= 0 {
		c.BaseBackoff = 50 * time.Millisecond
	}
	if c.MaxBackoff <= 0 {
		c.MaxBackoff = time.Second
	}
	c.MaxBackoff = max(c.MaxBackoff, c.BaseBackoff)
	if c.Rand == nil {
		c.Rand = rand.Float64
	}
	if c.MaxEvents <= 0 {
		c.MaxEvents = 100
	}
	return nil
}

// Counts is what a Checker saw. The problems are Gaps, Duplicates,
// Regressions, ChecksumMismatches and Malformed; a correct server gives 0
// of each whatever happens to it.
type Counts struct {
	// Frames counts every event read: views, deltas, heartbeats, synced,
	// drains.
	Frames     int64
	FullViews  int64
	Deltas     int64
	Heartbeats int64
	Synced     int64
	Drains     int64
	// Gaps: deltas whose from_version is not the version held (or for a
	// service with no view held). Each ends the stream, and the next
	// subscription asks for full views.
	Gaps int64
	// Duplicates: frames at or below the version held (a full view at
	// exactly that version only on a subscription whose since told the
	// server so). They are not applied.
	Duplicates int64
	// Regressions: full views below the version held. Not applied.
	Regressions int64
	// ChecksumMismatches: frames whose checksum is not that of the copy
	// after applying them (or, for a view, of its own endpoints). Each
	// ends the stream, and the next subscription asks for full views.
	ChecksumMismatches int64
	// Malformed: frames that cannot be decoded, whose id is not their
	// version, or that name a service not asked for.
	Malformed int64
	// Subscriptions counts streams opened (answered 200); Reconnects those
	// after the first; Refused the attempts answered otherwise (a 503
	// from admission, a connection refused while muster is down).
	Subscriptions int64
	Reconnects    int64
	Refused       int64
	// Emptied counts frames applied that left the copy of a service
	// with no endpoint. Not a problem of the stream (a service may have
	// none); a test whose services always have instances expects 0.
	Emptied int64
}

// Problems is the number of frames that broke the stream's contract.
func (c Counts) Problems() int64 {
	return c.Gaps + c.Duplicates + c.Regressions + c.ChecksumMismatches + c.Malformed
}

// Add returns the sum of c and o, for totals over many checkers.
func (c Counts) Add(o Counts) Counts {
	return Counts{
		Frames: c.Frames + o.Frames, FullViews: c.FullViews + o.FullViews, Deltas: c.Deltas + o.Deltas,
		Heartbeats: c.Heartbeats + o.Heartbeats, Synced: c.Synced + o.Synced, Drains: c.Drains + o.Drains,
		Gaps: c.Gaps + o.Gaps, Duplicates: c.Duplicates + o.Duplicates, Regressions: c.Regressions + o.Regressions,
		ChecksumMismatches: c.ChecksumMismatches + o.ChecksumMismatches, Malformed: c.Malformed + o.Malformed,
		Subscriptions: c.Subscriptions + o.Subscriptions, Reconnects: c.Reconnects + o.Reconnects, Refused: c.Refused + o.Refused,
		Emptied: c.Emptied + o.Emptied,
	}
}

func (c Counts) String() string {
	return fmt.Sprintf("frames %d (views %d, deltas %d, heartbeats %d, synced %d, drains %d); gaps %d, duplicates %d, regressions %d, checksum mismatches %d, malformed %d; subscriptions %d (reconnects %d), refused %d; emptied %d",
		c.Frames, c.FullViews, c.Deltas, c.Heartbeats, c.Synced, c.Drains,
		c.Gaps, c.Duplicates, c.Regressions, c.ChecksumMismatches, c.Malformed,
		c.Subscriptions, c.Reconnects, c.Refused, c.Emptied)
}

// Problem names what was wrong with a frame.
type Problem string

// Problems a Checker reports.
const (
	Gap              Problem = "gap"
	Duplicate        Problem = "duplicate"
	Regression       Problem = "regression"
	ChecksumMismatch Problem = "checksum"
	Malformed        Problem = "malformed"
	// Emptied is not a problem of the stream (Counts.Emptied): a frame
	// that left the copy of a service with no endpoint, kept among the
	// events for a test to show.
	Emptied Problem = "emptied"
)

// Event is one frame that broke the stream's contract.
type Event struct {
	Problem Problem
	Service string
	// Kind is the frame's event name (view, delta).
	Kind string
	// Held is the version held for the service when the frame came (0:
	// none); From a delta's from_version; Version the frame's version.
	Held, From, Version uint64
	// Told is the version of the service the subscription that brought
	// the frame said it held (held=; 0: none, a full view asked for).
	Told   uint64
	Detail string
	At     time.Time
}

func (e Event) String() string {
	s := fmt.Sprintf("%s: %s %s", e.Problem, e.Kind, e.Service)
	if e.Kind == "delta" {
		s += fmt.Sprintf(" %d→%d", e.From, e.Version)
	} else {
		s += fmt.Sprintf(" v%d", e.Version)
	}
	s += fmt.Sprintf(" holding v%d (told the server v%d)", e.Held, e.Told)
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	return s
}

// Checker watches one set of services and checks every frame. Run it in
// a goroutine of its own; the other methods may be called meanwhile.
type Checker struct {
	cfg Config

	mu        sync.Mutex
	held      map[string]*copyOf
	watermark uint64
	counts    Counts
	events    []Event
	// synced: the open stream has sent synced (and is still open).
	synced bool
	// stale names the services whose copy cannot be trusted (a gap, a
	// checksum mismatch): subscriptions ask for full views until each
	// has had one.
	stale map[string]bool
	// told is what the open subscription said it held (held=).
	told map[string]uint64
}

// copyOf is the checker's copy of one service's view.
type copyOf struct {
	version   uint64
	endpoints map[uuid.UUID]assembler.Endpoint
	zones     map[string]assembler.ZoneStatus
	checksum  string // assembler.Checksum of endpoints
	// suspect: a delta applied to it did not give the checksum it
	// announced, so a full view of the same version replaces it.
	suspect bool
}

// New returns a Checker for cfg.
func New(cfg Config) (*Checker, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	return &Checker{cfg: cfg, held: map[string]*copyOf{}, stale: map[string]bool{}}, nil
}

// Counts returns what the checker has seen so far.
func (c *Checker) Counts() Counts {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.counts
}

// Events returns the first problems found (at most Config.MaxEvents).
func (c *Checker) Events() []Event {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.events)
}

// Synced reports whether the stream now open has said synced: the
// checker holds a view of every service and is current.
func (c *Checker) Synced() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.synced
}

// Watermark is the highest version applied, the since of the next
// subscription (unless a problem asks for full views).
func (c *Checker) Watermark() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.watermark
}

// Routable reports whether the copy held of service routes to instance
// id (published with a weight above 0).
func (c *Checker) Routable(service string, id uuid.UUID) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	h := c.held[service]
	if h == nil {
		return false
	}
	ep, ok := h.endpoints[id]
	return ok && ep.Weight > 0
}

// Held returns the version and checksum held for service.
func (c *Checker) Held(service string) (version uint64, checksum string, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	h := c.held[service]
	if h == nil {
		return 0, "", false
	}
	return h.version, h.checksum, true
}

// session is how one subscription ended.
type session struct {
	progress   bool          // a frame arrived
	retryAfter time.Duration // the server asked for at least this wait
}

// Run subscribes, checks, and resubscribes whenever a stream ends, until
// ctx is done.
func (c *Checker) Run(ctx context.Context) {
	attempt := 0
	for {
		s := c.subscribe(ctx, c.resume())
		c.mu.Lock()
		c.synced = false
		c.mu.Unlock()
		if ctx.Err() != nil {
			return
		}
		if s.progress {
			attempt = 0
		}
		ceil := c.cfg.MaxBackoff
		if attempt < 30 {
			ceil = min(ceil, c.cfg.BaseBackoff<<attempt)
		}
		attempt++
		d := max(time.Duration(c.cfg.Rand()*float64(ceil)), s.retryAfter)
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// resume is what the next subscription says it holds: the
// version of each service whose copy can be trusted, as held=; the others
// (none held yet, or a copy after a gap or a checksum mismatch) get full
// views. Versions name one view in the region, so this is exact on any
// replica, where a single since cannot be across owners' epochs.
func (c *Checker) resume() map[string]uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	held := make(map[string]uint64, len(c.held))
	for name, h := range c.held {
		if !c.stale[name] {
			held[name] = h.version
		}
	}
	return held
}

var errDeadStream = errors.New("streamcheck: no frame within the heartbeat timeout")

// subscribe runs one watch stream until it ends.
func (c *Checker) subscribe(ctx context.Context, held map[string]uint64) session {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	q := url.Values{"service": c.cfg.Services}
	for _, name := range slices.Sorted(maps.Keys(held)) {
		q.Add("held", name+":"+strconv.FormatUint(held[name], 10))
	}
	base := c.cfg.URL
	if n := len(c.cfg.Replicas); n > 0 {
		base = c.cfg.Replicas[min(int(c.cfg.Rand()*float64(n)), n-1)]
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/watch?"+q.Encode(), nil)
	if err != nil {
		c.count(func(n *Counts) { n.Refused++ })
		return session{}
	}
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Authorization", "Bearer "+c.cfg.Token)
	dog := time.AfterFunc(c.cfg.HeartbeatTimeout, func() { cancel(errDeadStream) })
	defer dog.Stop()
	res, err := c.cfg.HTTPClient.Do(req)
	if err != nil {
		c.count(func(n *Counts) { n.Refused++ })
		return session{}
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(res.Body, 4<<10))
		c.count(func(n *Counts) { n.Refused++ })
		s := session{}
		if n, err := strconv.Atoi(res.Header.Get("Retry-After")); err == nil && n > 0 {
			s.retryAfter = time.Duration(n) * time.Second
		}
		return s
	}
	c.count(func(n *Counts) {
		if n.Subscriptions++; n.Subscriptions > 1 {
			n.Reconnects++
		}
	})
	c.mu.Lock()
	c.told = held
	c.mu.Unlock()
	return c.read(res.Body, dog)
}

// maxLine bounds one SSE line (a view of a very large service is one).
const maxLine = 64 << 20

// read parses SSE events and checks each until the stream ends or a
// problem needs a new subscription.
func (c *Checker) read(body io.Reader, dog *time.Timer) (s session) {
	br := bufio.NewReaderSize(body, 64<<10)
	var kind, id string
	var data []byte
	var line []byte
	for {
		line = line[:0]
		for {
			chunk, err := br.ReadSlice('\n')
			line = append(line, chunk...)
			if err == bufio.ErrBufferFull && len(line) <= maxLine {
				continue
			}
			if err != nil {
				return s
			}
			break
		}
		line = bytes.TrimRight(line, "\r\n")
		if len(line) == 0 {
			if kind == "" && data == nil {
				continue
			}
			dog.Reset(c.cfg.HeartbeatTimeout)
			s.progress = true
			if c.frame(kind, id, data) {
				return s
			}
			kind, id, data = "", "", nil
			continue
		}
		if line[0] == ':' {
			continue // comment
		}
		field, value, _ := bytes.Cut(line, []byte(":"))
		value = bytes.TrimPrefix(value, []byte(" "))
		switch string(field) {
		case "event":
			kind = string(value)
		case "id":
			id = string(value)
		case "data":
			if data != nil {
				data = append(data, '\n')
			}
			data = append(data, value...)
			if data == nil {
				data = []byte{}
			}
		}
	}
}

func (c *Checker) count(f func(*Counts)) {
	c.mu.Lock()
	f(&c.counts)
	c.mu.Unlock()
}

// frame checks and applies one event. end: the stream must end (a drain,
// or a problem after which a copy cannot be trusted).
func (c *Checker) frame(kind, id string, data []byte) (end bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.counts.Frames++
	switch kind {
	case "heartbeat":
		c.counts.Heartbeats++
		return false
	case "synced":
		c.counts.Synced++
		c.synced = true
		return false
	case "drain":
		c.counts.Drains++
		return true
	case "view":
		c.counts.FullViews++
		var v assembler.View
		if err := json.Unmarshal(data, &v); err != nil {
			c.problem(Event{Problem: Malformed, Kind: kind, Detail: err.Error()})
			return true
		}
		if !c.wellFormed(kind, id, v.Service, v.Version) {
			return true
		}
		return c.view(&v)
	case "delta":
		c.counts.Deltas++
		var d assembler.Delta
		if err := json.Unmarshal(data, &d); err != nil {
			c.problem(Event{Problem: Malformed, Kind: kind, Detail: err.Error()})
			return true
		}
		if !c.wellFormed(kind, id, d.Service, d.Version) {
			return true
		}
		return c.delta(&d)
	}
	return false // unknown events are ignored, as clients must
}

// wellFormed checks that a frame's id is its version and its service one
// asked for, counting it malformed if not.
func (c *Checker) wellFormed(kind, id, service string, version uint64) bool {
	e := Event{Problem: Malformed, Kind: kind, Service: service, Version: version, Told: c.told[service]}
	if id != strconv.FormatUint(version, 10) {
		e.Detail = fmt.Sprintf("SSE id %q is not the version %d", id, version)
		c.problem(e)
		return false
	}
	if _, ok := slices.BinarySearch(c.cfg.Services, service); !ok {
		e.Detail = "a service this stream did not ask for"
		c.problem(e)
		return false
	}
	return true
}

func (c *Checker) view(v *assembler.View) (end bool) {
	h := c.held[v.Service]
	e := Event{Kind: "view", Service: v.Service, Version: v.Version, Told: c.told[v.Service]}
	if h != nil {
		e.Held = h.version
		switch {
		case v.Version < h.version:
			e.Problem = Regression
			c.problem(e)
			return false
		case v.Version == h.version && c.told[v.Service] == h.version:
			e.Problem, e.Detail = Duplicate, "a full view of the version held, on a subscription that said it held it"
			c.problem(e)
			return false
		}
	}
	sum := assembler.Checksum(v.Endpoints)
	if sum != v.Checksum {
		e.Problem, e.Detail = ChecksumMismatch, fmt.Sprintf("the view's endpoints sum to %s, it says %s", sum, v.Checksum)
		c.problem(e)
		return true
	}
	if h != nil && v.Version == h.version && !h.suspect && sum != h.checksum {
		e.Problem, e.Detail = ChecksumMismatch, fmt.Sprintf("a full view of the version held sums to %s, the copy to %s", sum, h.checksum)
		c.problem(e)
		return true
	}
	n := &copyOf{version: v.Version, endpoints: make(map[uuid.UUID]assembler.Endpoint, len(v.Endpoints)),
		zones: make(map[string]assembler.ZoneStatus, len(v.Zones)), checksum: sum}
	for _, ep := range v.Endpoints {
		n.endpoints[ep.InstanceID] = ep
	}
	for z, st := range v.Zones {
		n.zones[z] = st
	}
	c.held[v.Service] = n
	if len(n.endpoints) == 0 {
		e.Problem, e.Held = Emptied, v.Version
		c.problem(e)
	}
	delete(c.stale, v.Service)
	c.watermark = max(c.watermark, v.Version)
	return false
}

func (c *Checker) delta(d *assembler.Delta) (end bool) {
	h := c.held[d.Service]
	e := Event{Kind: "delta", Service: d.Service, From: d.FromVersion, Version: d.Version, Told: c.told[d.Service]}
	if h == nil {
		e.Problem, e.Detail = Gap, "a delta for a service with no view held"
		c.problem(e)
		return true
	}
	e.Held = h.version
	if d.Version <= h.version {
		e.Problem = Duplicate
		c.problem(e)
		return false
	}
	if d.FromVersion != h.version {
		e.Problem = Gap
		c.problem(e)
		return true
	}
	for _, id := range d.Removals {
		delete(h.endpoints, id)
	}
	for _, ep := range d.Upserts {
		h.endpoints[ep.InstanceID] = ep
	}
	for z, st := range d.Zones {
		h.zones[z] = st
	}
	for _, z := range d.RemovedZones {
		delete(h.zones, z)
	}
	h.version = d.Version
	if len(h.endpoints) == 0 {
		e.Problem, e.Detail = Emptied, fmt.Sprintf("%d removals", len(d.Removals))
		c.problem(e)
	}
	h.checksum = assembler.Checksum(endpoints(h.endpoints))
	c.watermark = max(c.watermark, d.Version)
	if h.checksum != d.Checksum {
		h.suspect = true
		e.Problem, e.Detail = ChecksumMismatch, fmt.Sprintf("the copy sums to %s after the delta, it says %s", h.checksum, d.Checksum)
		c.problem(e)
		return true
	}
	return false
}

// problem counts e and keeps it if there is room. Called with c.mu held.
func (c *Checker) problem(e Event) {
	switch e.Problem {
	case Gap:
		c.counts.Gaps++
	case Duplicate:
		c.counts.Duplicates++
	case Regression:
		c.counts.Regressions++
	case ChecksumMismatch:
		c.counts.ChecksumMismatches++
	case Malformed:
		c.counts.Malformed++
	case Emptied:
		c.counts.Emptied++
	}
	switch e.Problem {
	case Gap, ChecksumMismatch, Malformed:
		if _, ok := slices.BinarySearch(c.cfg.Services, e.Service); ok {
			c.stale[e.Service] = true
		} else {
			for _, name := range c.cfg.Services {
				c.stale[name] = true
			}
		}
	}
	if len(c.events) < c.cfg.MaxEvents {
		e.At = time.Now()
		c.events = append(c.events, e)
	}
}

// endpoints returns m's endpoints ordered by instance id, as views list
// them.
func endpoints(m map[uuid.UUID]assembler.Endpoint) []assembler.Endpoint {
	out := make([]assembler.Endpoint, 0, len(m))
	for _, ep := range m {
		out = append(out, ep)
	}
	slices.SortFunc(out, func(a, b assembler.Endpoint) int { return bytes.Compare(a.InstanceID[:], b.InstanceID[:]) })
	return out
}

// Compare asks muster for the current view of every service (GET
// /v1/resolve/{service}) and returns an error naming each difference from
// the copy: version, checksum, endpoints or zones. Call it once the
// views stop changing (a difference while they change may be a frame
// still on its way).
func (c *Checker) Compare(ctx context.Context) error { return c.CompareWith(ctx, c.cfg.URL) }

// CompareWith is Compare against the muster at base (one replica of
// several).
func (c *Checker) CompareWith(ctx context.Context, base string) error {
	var diffs []string
	for _, name := range c.cfg.Services {
		v, err := c.resolve(ctx, strings.TrimRight(base, "/"), name)
		if err != nil {
			return err
		}
		if d := c.diff(name, v); d != "" {
			diffs = append(diffs, d)
		}
	}
	if len(diffs) > 0 {
		return fmt.Errorf("streamcheck: the copy differs from /v1/resolve: %s", strings.Join(diffs, "; "))
	}
	return nil
}

func (c *Checker) diff(name string, v *assembler.View) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	h := c.held[name]
	switch {
	case h == nil:
		return fmt.Sprintf("%s: no view held, muster serves v%d", name, v.Version)
	case h.version != v.Version:
		return fmt.Sprintf("%s: v%d held, muster serves v%d", name, h.version, v.Version)
	case h.checksum != v.Checksum:
		return fmt.Sprintf("%s v%d: checksum %s held, muster serves %s", name, v.Version, h.checksum, v.Checksum)
	}
	sorted := slices.Clone(v.Endpoints)
	slices.SortFunc(sorted, func(a, b assembler.Endpoint) int { return bytes.Compare(a.InstanceID[:], b.InstanceID[:]) })
	held := endpoints(h.endpoints)
	// Callers poll this until the copies agree, hundreds of checkers at
	// once: reflect.DeepEqual answers the usual "equal" cheaply, and
	// cmp.Diff (which also equates nil and empty) judges the rest and
	// says how they differ.
	if reflect.DeepEqual(sorted, held) && reflect.DeepEqual(v.Zones, h.zones) {
		return ""
	}
	if d := cmp.Diff(sorted, held, cmpopts.EquateEmpty()); d != "" {
		return fmt.Sprintf("%s v%d: endpoints (-served +held):\n%s", name, v.Version, d)
	}
	if d := cmp.Diff(v.Zones, h.zones, cmpopts.EquateEmpty()); d != "" {
		return fmt.Sprintf("%s v%d: zones (-served +held):\n%s", name, v.Version, d)
	}
	return ""
}

// resolve reads one service's current view from muster.
func (c *Checker) resolve(ctx context.Context, base, name string) (*assembler.View, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/resolve/"+url.PathEscape(name), nil)
	if err != nil {
		return nil, fmt.Errorf("streamcheck: resolve %s: %w", name, err)
	}
	req.Header.Set("Authorization", "Bearer "+c.cfg.Token)
	res, err := c.cfg.HTTPClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("streamcheck: resolve %s: %w", name, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		return nil, fmt.Errorf("streamcheck: resolve %s: %w", name, err)
	}
	if res.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("streamcheck: resolve %s: %s: %s", name, res.Status, bytes.TrimSpace(b))
	}
	var v assembler.View
	if err := json.Unmarshal(b, &v); err != nil {
		return nil, fmt.Errorf("streamcheck: resolve %s: decode: %w", name, err)
	}
	return &v, nil
}
