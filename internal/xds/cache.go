package xds

import (
	"hash/fnv"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// shared is one resource as every stream sent it receives it, whichever
// principal the stream is: encoded once, when it is built, with muster's
// version. Nothing in it changes after it is built.
type shared struct {
	name    string
	version string
	any     *anypb.Any // what a state-of-the-world response carries
	// sotwField and deltaField are the resource as a field of a
	// DiscoveryResponse (its Any) and of a DeltaDiscoveryResponse (a
	// Resource over the same bytes): tag, length and encoding, so that a
	// response is the concatenation of its resources' fields.
	sotwField, deltaField []byte
	// lead is the local view version an assignment holds (0: none, and
	// for the other types), for push-latency accounting.
	lead uint64
}

// encodes counts the resources encoded, for tests.
var encodes atomic.Int64

var deterministic = proto.MarshalOptions{Deterministic: true}

func newShared(name, version string, r proto.Message, lead uint64) (*shared, error) {
	encodes.Add(1)
	a, err := deterministicAny(r)
	if err != nil {
		return nil, err
	}
	ab, err := deterministic.Marshal(a)
	if err != nil {
		return nil, err
	}
	rb, err := deterministic.Marshal(&discovery.Resource{Name: name, Version: version, Resource: a})
	if err != nil {
		return nil, err
	}
	return &shared{
		name: name, version: version, any: a, lead: lead,
		sotwField:  protowire.AppendBytes(protowire.AppendTag(nil, fieldSotwResources, protowire.BytesType), ab),
		deltaField: protowire.AppendBytes(protowire.AppendTag(nil, fieldDeltaResources, protowire.BytesType), rb),
	}, nil
}

// pushOrder is the order a change reaches a stream's types in, as
// Envoy's xDS protocol asks of a server so that nothing is routed to
// what a client does not know yet: clusters, then their assignments,
// then listeners, then their routes. A stream keeps its types' state at
// these indexes.
var pushOrder = [numTypes]string{resource.ClusterType, resource.EndpointType, resource.ListenerType, resource.RouteType}

const numTypes = 4

// typeIndex is t's index in pushOrder (false: not a type muster serves).
func typeIndex(t string) (int, bool) {
	for i, u := range pushOrder {
		if u == t {
			return i, true
		}
	}
	return 0, false
}

// watchCache holds each node's snapshot and the ADS streams that read
// it, and tells a stream what a change of the snapshot concerns.
//
// go-control-plane's SnapshotCache and servers build a response per
// watch and encode every resource in it again for each stream (v0.14:
// createResponse wraps each resource in a new cachedResource), so a
// change that reaches 10,000 streams was encoded 10,000 times, and each
// stream's next watch was made anew on every ACK. Here a resource is
// encoded once per version when it is built (shared); a
// state-of-the-world response is assembled and encoded once per node,
// type and set of names asked (a template), and a stream sends those
// bytes with its own nonce appended; a delta response is the
// concatenation of the changed resources' encodings. A stream's
// subscriptions live as long as the stream: an ACK changes nothing.
//
// A change reaches only the streams it concerns: SetSnapshot compares
// the node's new snapshot with the old one, type by type, and gives a
// stream what changed only when it follows one of the names.
//
// An update costs in proportion to the node it concerns, never to what
// other nodes' streams subscribe to: each node has a lock of its own
// (mu only finds the node), SetSnapshot hands each stream of the node a
// note of what changed and never waits for a stream busy with a request
// of its own (adsStream.note), and a state-of-the-world response to a
// set of names is built by the stream's sender, outside every lock
// another node's update takes. One node subscribing to a million names
// once held the one lock every node's update took while its response
// was built: another node's update went from 77 µs to 33 ms.
type watchCache struct {
	log *slog.Logger

	mu    sync.Mutex // guards nodes only
	nodes map[string]*nodeWatches

	// scanned counts the resources and streams SetSnapshot looked at,
	// for tests: what an update of a node costs must not depend on any
	// other node's subscriptions.
	scanned atomic.Int64
}

// nodeWatches is one node's snapshot and open streams.
type nodeWatches struct {
	// mu guards the fields below; it is held only for short work whose
	// size the node's own snapshot decides (never a stream's names).
	mu        sync.Mutex
	snap      *nodeSnapshot // nil until the server is ready
	streams   map[*adsStream]struct{}
	templates map[string]*template // for snap, by templateKey
}

// change is what one SetSnapshot changed of a node's snapshot: shared,
// read-only, by every stream of the node.
type change struct {
	snap  *nodeSnapshot
	first bool // the node's first snapshot: answers every request held
	all   bool // notes collapsed: treat every name as changed
	names [numTypes]map[string]struct{}
}

func newWatchCache(log *slog.Logger) *watchCache {
	return &watchCache{log: log, nodes: map[string]*nodeWatches{}}
}

// node returns id's entry, made when absent.
func (c *watchCache) node(id string) *nodeWatches {
	c.mu.Lock()
	defer c.mu.Unlock()
	nw := c.nodes[id]
	if nw == nil {
		nw = &nodeWatches{streams: map[*adsStream]struct{}{}, templates: map[string]*template{}}
		c.nodes[id] = nw
	}
	return nw
}

// add makes a a stream of node id.
func (c *watchCache) add(id string, a *adsStream) {
	nw := c.node(id)
	nw.mu.Lock()
	defer nw.mu.Unlock()
	nw.streams[a] = struct{}{}
	a.nw, a.snap = nw, nw.snap // a is not shared yet
}

// remove forgets a.
func (c *watchCache) remove(id string, a *adsStream) {
	c.mu.Lock()
	nw := c.nodes[id]
	c.mu.Unlock()
	if nw != nil {
		nw.mu.Lock()
		delete(nw.streams, a)
		nw.mu.Unlock()
	}
}

// SetSnapshot replaces node's snapshot and gives each of its streams
// what a change in it concerns, type by type.
func (c *watchCache) SetSnapshot(node string, snap *nodeSnapshot) {
	nw := c.node(node)
	nw.mu.Lock()
	defer nw.mu.Unlock()
	old := nw.snap
	nw.snap, nw.templates = snap, map[string]*template{}
	// The node's first snapshot (muster ready) answers every request
	// held until then, those asking for nothing it holds too (an empty
	// response: a client is told what does not exist rather than left to
	// time out waiting).
	ch := &change{snap: snap, first: old == nil}
	some := ch.first
	for i, t := range pushOrder {
		ch.names[i] = changedNames(old, snap, t)
		some = some || len(ch.names[i]) > 0
		c.scanned.Add(int64(len(snap.resources[t])))
		if old != nil {
			c.scanned.Add(int64(len(old.resources[t])))
		}
	}
	if !some {
		return
	}
	c.scanned.Add(int64(len(nw.streams)))
	for a := range nw.streams {
		a.note(ch)
	}
}

// ClearSnapshot forgets node (its last stream ended).
func (c *watchCache) ClearSnapshot(node string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.nodes, node)
}

// template is the response of snap to what key asks for, built once per
// snapshot and node: taken from the node when it holds snap still, else
// built outside the node's lock (snap does not change) and kept when it
// still does.
func (nw *nodeWatches) template(snap *nodeSnapshot, t, key string, wildcard bool, names map[string]struct{}) *template {
	nw.mu.Lock()
	if x := nw.templates[key]; x != nil && nw.snap == snap {
		nw.mu.Unlock()
		return x
	}
	nw.mu.Unlock()
	x := newTemplate(snap, t, wildcard, names)
	nw.mu.Lock()
	defer nw.mu.Unlock()
	if nw.snap == snap {
		if y := nw.templates[key]; y != nil {
			return y
		}
		nw.templates[key] = x
	}
	return x
}

// changedNames are the names of type t whose resource differs between
// the snapshots (added, removed or another version).
func changedNames(old, cur *nodeSnapshot, t string) map[string]struct{} {
	out := map[string]struct{}{}
	var was map[string]*shared
	if old != nil {
		was = old.resources[t]
	}
	now := cur.resources[t]
	for name, r := range now {
		if w := was[name]; w == nil || w.version != r.version || w.any != r.any {
			out[name] = struct{}{}
		}
	}
	for name := range was {
		if now[name] == nil {
			out[name] = struct{}{}
		}
	}
	return out
}

// follows: a subscription (every resource, or names) covers one of the
// changed names.
func follows(wildcard bool, subscribed, changed map[string]struct{}) bool {
	if wildcard {
		return len(changed) > 0
	}
	if len(subscribed) < len(changed) {
		for name := range subscribed {
			if _, ok := changed[name]; ok {
				return true
			}
		}
		return false
	}
	for name := range changed {
		if _, ok := subscribed[name]; ok {
			return true
		}
	}
	return false
}

// returnedAll: every resource of the template was returned on the stream.
func returnedAll(returned, want map[string]string) bool {
	for name := range want {
		if _, ok := returned[name]; !ok {
			return false
		}
	}
	return true
}

// templateKey names what a state-of-the-world subscription asks for: its
// type and every resource (wildcard) or the names.
func templateKey(t string, wildcard bool, names map[string]struct{}) string {
	if wildcard {
		return t + "\x00*"
	}
	list := make([]string, 0, len(names))
	for name := range names {
		list = append(list, name)
	}
	slices.Sort(list)
	return t + "\x00\x00" + strings.Join(list, "\x00")
}

// template is a state-of-the-world response of one node's snapshot to
// one set of names, shared by every stream that asks the node for it.
type template struct {
	typeURL   string
	version   string
	resources []*shared
	returned  map[string]string // name -> resource version; never changed
	lead      uint64

	once    sync.Once
	encoded []byte // the response without its nonce (wire)
}

// newTemplate is the response of snap to what a subscription of type t
// asks for: every resource (wildcard) or the names.
func newTemplate(snap *nodeSnapshot, t string, wildcard bool, names map[string]struct{}) *template {
	held := snap.resources[t]
	var list []*shared
	if wildcard {
		list = make([]*shared, 0, len(held))
		for _, r := range held {
			list = append(list, r)
		}
	} else if len(names) > len(held) {
		// A subscription to more names than the node holds costs what
		// the node holds, not what it asked for.
		for name, r := range held {
			if _, ok := names[name]; ok {
				list = append(list, r)
			}
		}
	} else {
		for name := range names {
			if r := held[name]; r != nil {
				list = append(list, r)
			}
		}
	}
	slices.SortFunc(list, func(a, b *shared) int { return strings.Compare(a.name, b.name) })
	x := &template{typeURL: t, resources: list, returned: make(map[string]string, len(list))}
	h := fnv.New64a()
	for _, r := range list {
		x.returned[r.name] = r.version
		x.lead = max(x.lead, r.lead)
		_, _ = h.Write([]byte(r.name + "\x00" + r.version + "\x00"))
	}
	// The version names the (name, version) pairs sent, so that every
	// replica holding the same views sends the same one; an assignments'
	// version leads with the newest local view version in it, for people
	// reading it and for push-latency accounting.
	x.version = strconv.FormatUint(h.Sum64(), 36) + "." + strconv.Itoa(len(list))
	if t == resource.EndpointType {
		x.version = strconv.FormatUint(x.lead, 10) + "." + x.version
	}
	return x
}

// wire is x's DiscoveryResponse without a nonce, encoded on first use
// and shared by every stream sent x: each appends its nonce field (the
// fields of a protobuf message may come in any order).
func (x *template) wire() []byte {
	x.once.Do(func() {
		n := 0
		for _, r := range x.resources {
			n += len(r.sotwField)
		}
		b := make([]byte, 0, n+len(x.version)+len(x.typeURL)+8)
		b = protowire.AppendBytes(protowire.AppendTag(b, fieldSotwVersion, protowire.BytesType), []byte(x.version))
		for _, r := range x.resources {
			b = append(b, r.sotwField...)
		}
		x.encoded = protowire.AppendBytes(protowire.AppendTag(b, fieldSotwTypeURL, protowire.BytesType), []byte(x.typeURL))
	})
	return x.encoded
}

// deltaOf is what a delta subscription lacks in snap: the subscribed
// resources whose version differs from the one the stream holds
// (returned), and the names it holds that are gone.
func deltaOf(snap *nodeSnapshot, t string, wildcard bool, names map[string]struct{}, returned map[string]string) (send []*shared, removed []string) {
	held := snap.resources[t]
	if wildcard {
		for name, r := range held {
			if v, ok := returned[name]; !ok || v != r.version {
				send = append(send, r)
			}
		}
		for name := range returned {
			if held[name] == nil {
				removed = append(removed, name)
			}
		}
	} else if len(names) > len(held)+len(returned) {
		// As many names as a stream may hold cost what the node holds
		// and the client was sent, not what it asked for.
		for name, r := range held {
			if _, ok := names[name]; ok {
				if v, had := returned[name]; !had || v != r.version {
					send = append(send, r)
				}
			}
		}
		for name := range returned {
			if _, ok := names[name]; ok && held[name] == nil {
				removed = append(removed, name)
			}
		}
	} else {
		for name := range names {
			v, had := returned[name]
			if r := held[name]; r != nil {
				if !had || v != r.version {
					send = append(send, r)
				}
			} else if had {
				removed = append(removed, name)
			}
		}
	}
	slices.SortFunc(send, func(a, b *shared) int { return strings.Compare(a.name, b.name) })
	slices.Sort(removed)
	return send, removed
}
