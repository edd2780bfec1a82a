package xds

import (
	"context"
	"errors"
	"hash/fnv"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// shared is one resource as every stream sent it receives it, whichever
// principal the stream is: encoded once, when it is built, with muster's
// version. Nothing in it changes after it is built.
type shared struct {
	name    string
	version string
	any     *anypb.Any          // what a state-of-the-world response carries
	res     *discovery.Resource // what a delta response carries (the same bytes)
	// lead is the local view version an assignment holds (0: none, and
	// for the other types), for push-latency accounting.
	lead uint64
}

// encodes counts the resources encoded, for tests.
var encodes atomic.Int64

func newShared(name, version string, r proto.Message, lead uint64) (*shared, error) {
	encodes.Add(1)
	a, err := deterministicAny(r)
	if err != nil {
		return nil, err
	}
	return &shared{name: name, version: version, any: a, res: &discovery.Resource{Name: name, Version: version, Resource: a}, lead: lead}, nil
}

// pushOrder is the order a change reaches a stream's types in, as
// Envoy's xDS protocol asks of a server so that nothing is routed to
// what a client does not know yet: clusters, then their assignments,
// then listeners, then their routes.
var pushOrder = []string{resource.ClusterType, resource.EndpointType, resource.ListenerType, resource.RouteType}

// watchCache is muster's go-control-plane ConfigWatcher: it answers the
// go-control-plane servers' watches (which keep the xDS protocol: nonces,
// ACK and NACK, subscriptions) from each node's snapshot, with responses
// built once and shared.
//
// go-control-plane's SnapshotCache builds a response per watch and
// encodes every resource in it again for each stream (v0.14:
// createResponse wraps each resource in a new cachedResource), so a
// change that reaches 10,000 streams is encoded 10,000 times, and a delta
// response is hashed as often. Here a resource is encoded once per
// version when it is built (shared); a state-of-the-world response is
// assembled once per node, type and set of names asked (a template) and
// each stream gets its own shallow copy, whose nonce the server sets;
// a delta response lists the shared resources that changed.
//
// A change reaches only the watches it concerns: SetSnapshot compares
// the node's new snapshot with the old one, type by type, and answers a
// watch only when one of the names it follows changed (every watch
// left open is up to date with the snapshot: one that is not is
// answered when it is made).
type watchCache struct {
	log *slog.Logger

	mu     sync.Mutex
	nodes  map[string]*nodeWatches
	nextID int64
}

// nodeWatches is one node's snapshot and open watches.
type nodeWatches struct {
	snap      *nodeSnapshot // nil until the server is ready
	sotw      map[int64]*sotwWatch
	delta     map[int64]*deltaWatch
	templates map[string]*template // for snap, by templateKey
}

type sotwWatch struct {
	req *cachev3.Request
	sub cachev3.Subscription
	ch  chan cachev3.Response
	key string // templateKey of what it asks for
}

type deltaWatch struct {
	req *cachev3.DeltaRequest
	sub cachev3.Subscription
	ch  chan cachev3.DeltaResponse
}

func newWatchCache(log *slog.Logger) *watchCache {
	return &watchCache{log: log, nodes: map[string]*nodeWatches{}}
}

var _ cachev3.Cache = (*watchCache)(nil)

// node returns id's entry, made when absent. c.mu held.
func (c *watchCache) node(id string) *nodeWatches {
	nw := c.nodes[id]
	if nw == nil {
		nw = &nodeWatches{sotw: map[int64]*sotwWatch{}, delta: map[int64]*deltaWatch{}}
		c.nodes[id] = nw
	}
	return nw
}

// SetSnapshot replaces node's snapshot and answers the watches a change
// in it concerns, type by type in pushOrder.
func (c *watchCache) SetSnapshot(node string, snap *nodeSnapshot) {
	c.mu.Lock()
	defer c.mu.Unlock()
	nw := c.node(node)
	old := nw.snap
	nw.snap, nw.templates = snap, map[string]*template{}
	// The node's first snapshot (muster ready) answers every watch held
	// until then, those asking for nothing it holds too (an empty
	// response: a client is told what does not exist rather than left to
	// time out waiting).
	first := old == nil
	for _, t := range pushOrder {
		changed := changedNames(old, snap, t)
		if len(changed) == 0 && !first {
			continue
		}
		for id, w := range nw.sotw {
			if w.req.GetTypeUrl() != t || !(first || follows(w.sub, changed)) {
				continue
			}
			x := nw.template(t, w.key, w.sub)
			if x.version == w.req.GetVersionInfo() {
				continue
			}
			c.sendSotW(w.ch, x.response(w.req))
			delete(nw.sotw, id)
		}
		for id, w := range nw.delta {
			if w.req.GetTypeUrl() != t || !(first || follows(w.sub, changed)) {
				continue
			}
			if r := deltaOf(snap, w.req, w.sub); r != nil {
				c.sendDelta(w.ch, r)
				delete(nw.delta, id)
			}
		}
	}
}

// ClearSnapshot forgets node (its last stream ended).
func (c *watchCache) ClearSnapshot(node string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.nodes, node)
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

// follows: the subscription covers one of the changed names.
func follows(sub cachev3.Subscription, changed map[string]struct{}) bool {
	if sub.IsWildcard() {
		return true
	}
	subscribed := sub.SubscribedResources()
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

// sendSotW hands a watch its one response. The channel has room: the
// server's is buffered for one response per watch (per type, in ordered
// ADS), and a watch is answered once, then dropped.
func (c *watchCache) sendSotW(ch chan cachev3.Response, r cachev3.Response) {
	select {
	case ch <- r:
	default:
		c.log.Error("xDS watch channel full; the stream gets this change with the next one")
	}
}

func (c *watchCache) sendDelta(ch chan cachev3.DeltaResponse, r cachev3.DeltaResponse) {
	select {
	case ch <- r:
	default:
		c.log.Error("xDS delta watch channel full; the stream gets this change with the next one")
	}
}

// CreateWatch answers a state-of-the-world request at once when the
// node's snapshot holds something the stream lacks (another version of
// what it asks for, or a name asked for and not yet sent on it), and
// otherwise holds the watch until a change concerns it. Before the node
// has a snapshot (muster not ready) every watch is held.
func (c *watchCache) CreateWatch(req *cachev3.Request, sub cachev3.Subscription, ch chan cachev3.Response) (func(), error) {
	id := req.GetNode().GetId()
	c.mu.Lock()
	defer c.mu.Unlock()
	nw := c.node(id)
	key := templateKey(req.GetTypeUrl(), sub)
	if nw.snap != nil {
		x := nw.template(req.GetTypeUrl(), key, sub)
		if x.version != req.GetVersionInfo() || !returnedAll(sub.ReturnedResources(), x.returned) {
			c.sendSotW(ch, x.response(req))
			return func() {}, nil
		}
	}
	c.nextID++
	wid := c.nextID
	nw.sotw[wid] = &sotwWatch{req: req, sub: sub, ch: ch, key: key}
	return func() { c.cancel(id, wid, false) }, nil
}

// CreateDeltaWatch answers a delta request at once with what the stream
// lacks (a resource of another version than it holds, or one it holds
// that is gone), or an empty response to a new wildcard subscription,
// and otherwise holds the watch until a change concerns it.
func (c *watchCache) CreateDeltaWatch(req *cachev3.DeltaRequest, sub cachev3.Subscription, ch chan cachev3.DeltaResponse) (func(), error) {
	id := req.GetNode().GetId()
	c.mu.Lock()
	defer c.mu.Unlock()
	nw := c.node(id)
	if nw.snap != nil {
		if r := deltaOf(nw.snap, req, sub); r != nil {
			c.sendDelta(ch, r)
			return func() {}, nil
		}
	}
	c.nextID++
	wid := c.nextID
	nw.delta[wid] = &deltaWatch{req: req, sub: sub, ch: ch}
	return func() { c.cancel(id, wid, true) }, nil
}

func (c *watchCache) cancel(node string, id int64, delta bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if nw := c.nodes[node]; nw != nil {
		if delta {
			delete(nw.delta, id)
		} else {
			delete(nw.sotw, id)
		}
	}
}

// Fetch is REST xDS, which muster does not serve.
func (c *watchCache) Fetch(context.Context, *cachev3.Request) (cachev3.Response, error) {
	return nil, errors.New("xds: muster serves xDS over ADS streams only")
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

// templateKey names what a state-of-the-world watch asks for: its type
// and every resource (wildcard) or the names it subscribes to.
func templateKey(t string, sub cachev3.Subscription) string {
	if sub.IsWildcard() {
		return t + "\x00*"
	}
	names := make([]string, 0, len(sub.SubscribedResources()))
	for name := range sub.SubscribedResources() {
		names = append(names, name)
	}
	slices.Sort(names)
	return t + "\x00\x00" + strings.Join(names, "\x00")
}

// template is a state-of-the-world response of one node's snapshot to
// one set of names, shared by every stream that asks the node for it.
type template struct {
	version   string
	resources []*anypb.Any
	returned  map[string]string // name -> resource version; never changed
	lead      uint64
}

// template is the response of the snapshot to what key asks for, built
// once per snapshot. nw.snap set; c.mu held.
func (nw *nodeWatches) template(t, key string, sub cachev3.Subscription) *template {
	if x := nw.templates[key]; x != nil {
		return x
	}
	held := nw.snap.resources[t]
	var list []*shared
	if sub.IsWildcard() {
		list = make([]*shared, 0, len(held))
		for _, r := range held {
			list = append(list, r)
		}
	} else {
		for name := range sub.SubscribedResources() {
			if r := held[name]; r != nil {
				list = append(list, r)
			}
		}
	}
	slices.SortFunc(list, func(a, b *shared) int { return strings.Compare(a.name, b.name) })
	x := &template{resources: make([]*anypb.Any, len(list)), returned: make(map[string]string, len(list))}
	h := fnv.New64a()
	for i, r := range list {
		x.resources[i] = r.any
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
	nw.templates[key] = x
	return x
}

// response is x as one stream is sent it: its own DiscoveryResponse (the
// server writes the stream's nonce into it) over the shared resources.
func (x *template) response(req *cachev3.Request) *sharedResponse {
	return &sharedResponse{req: req, returned: x.returned, out: &discovery.DiscoveryResponse{
		VersionInfo: x.version, Resources: x.resources, TypeUrl: req.GetTypeUrl(),
	}}
}

// sharedResponse is a state-of-the-world response to one watch.
type sharedResponse struct {
	req      *cachev3.Request
	out      *discovery.DiscoveryResponse
	returned map[string]string
}

var _ cachev3.Response = (*sharedResponse)(nil)

func (r *sharedResponse) GetDiscoveryResponse() (*discovery.DiscoveryResponse, error) {
	return r.out, nil
}
func (r *sharedResponse) GetRequest() *discovery.DiscoveryRequest { return r.req }
func (r *sharedResponse) GetVersion() (string, error)             { return r.out.GetVersionInfo(), nil }
func (r *sharedResponse) GetResponseVersion() string              { return r.out.GetVersionInfo() }
func (r *sharedResponse) GetReturnedResources() map[string]string {
	return r.returned
}
func (r *sharedResponse) GetContext() context.Context { return context.Background() }

// deltaOf is the delta response of snap to a watch: the subscribed
// resources whose version differs from the one the stream holds, and
// those it holds that are gone; nil when there are none and the watch is
// not a stream's first wildcard request, which is answered even when
// empty so that Envoy completes its initialisation.
func deltaOf(snap *nodeSnapshot, req *cachev3.DeltaRequest, sub cachev3.Subscription) *sharedDeltaResponse {
	t := req.GetTypeUrl()
	held := snap.resources[t]
	returned := sub.ReturnedResources()
	var (
		send    []*discovery.Resource
		removed []string
		next    map[string]string
	)
	if sub.IsWildcard() {
		next = make(map[string]string, len(held))
		for name, r := range held {
			next[name] = r.version
			if v, ok := returned[name]; !ok || v != r.version {
				send = append(send, r.res)
			}
		}
		for name := range returned {
			if held[name] == nil {
				removed = append(removed, name)
			}
		}
	} else {
		next = make(map[string]string, len(sub.SubscribedResources()))
		for name := range sub.SubscribedResources() {
			v, had := returned[name]
			if r := held[name]; r != nil {
				next[name] = r.version
				if !had || v != r.version {
					send = append(send, r.res)
				}
			} else if had {
				removed = append(removed, name)
			}
		}
	}
	if len(send) == 0 && len(removed) == 0 && !(sub.IsWildcard() && req.GetResponseNonce() == "") {
		return nil
	}
	slices.SortFunc(send, func(a, b *discovery.Resource) int { return strings.Compare(a.GetName(), b.GetName()) })
	slices.Sort(removed)
	return &sharedDeltaResponse{req: req, next: next, out: &discovery.DeltaDiscoveryResponse{
		Resources: send, RemovedResources: removed, TypeUrl: t,
	}}
}

// sharedDeltaResponse is a delta response to one watch.
type sharedDeltaResponse struct {
	req  *cachev3.DeltaRequest
	out  *discovery.DeltaDiscoveryResponse
	next map[string]string
}

var _ cachev3.DeltaResponse = (*sharedDeltaResponse)(nil)

func (r *sharedDeltaResponse) GetDeltaDiscoveryResponse() (*discovery.DeltaDiscoveryResponse, error) {
	return r.out, nil
}
func (r *sharedDeltaResponse) GetDeltaRequest() *discovery.DeltaDiscoveryRequest { return r.req }
func (r *sharedDeltaResponse) GetSystemVersion() (string, error)                 { return "", nil }
func (r *sharedDeltaResponse) GetResponseVersion() string                        { return "" }
func (r *sharedDeltaResponse) GetNextVersionMap() map[string]string              { return r.next }
func (r *sharedDeltaResponse) GetReturnedResources() map[string]string           { return r.next }
func (r *sharedDeltaResponse) GetContext() context.Context                       { return context.Background() }
