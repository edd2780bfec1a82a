package xds

import (
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	protov2 "google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// The response fields muster writes itself, numbered from the generated
// descriptors so that they cannot drift from the schema.
var (
	fieldSotwVersion    = fieldNumber(&discovery.DiscoveryResponse{}, "version_info")
	fieldSotwResources  = fieldNumber(&discovery.DiscoveryResponse{}, "resources")
	fieldSotwTypeURL    = fieldNumber(&discovery.DiscoveryResponse{}, "type_url")
	fieldSotwNonce      = fieldNumber(&discovery.DiscoveryResponse{}, "nonce")
	fieldDeltaResources = fieldNumber(&discovery.DeltaDiscoveryResponse{}, "resources")
	fieldDeltaTypeURL   = fieldNumber(&discovery.DeltaDiscoveryResponse{}, "type_url")
	fieldDeltaRemoved   = fieldNumber(&discovery.DeltaDiscoveryResponse{}, "removed_resources")
	fieldDeltaNonce     = fieldNumber(&discovery.DeltaDiscoveryResponse{}, "nonce")
)

func fieldNumber(m protov2.Message, name protoreflect.Name) protowire.Number {
	f := m.ProtoReflect().Descriptor().Fields().ByName(name)
	if f == nil {
		panic(fmt.Sprintf("xds: %s has no field %s", m.ProtoReflect().Descriptor().FullName(), name))
	}
	return f.Number()
}

// encoded is a response in its wire form: adsCodec sends its bytes as
// they are (the shared encodings of its resources and a few bytes of its
// own), so nothing is encoded per stream.
type encoded struct{ data mem.BufferSlice }

// adsCodec is the xDS server's codec: protobuf's, except that an encoded
// response is sent as it is.
type adsCodec struct{ proto encoding.CodecV2 }

func newADSCodec() adsCodec { return adsCodec{proto: encoding.GetCodecV2(proto.Name)} }

func (c adsCodec) Marshal(v any) (mem.BufferSlice, error) {
	if e, ok := v.(*encoded); ok {
		return e.data, nil
	}
	return c.proto.Marshal(v)
}

func (c adsCodec) Unmarshal(data mem.BufferSlice, v any) error { return c.proto.Unmarshal(data, v) }
func (adsCodec) Name() string                                  { return proto.Name }

// ads is muster's aggregated discovery service: state of the world and
// delta, over the streams the interceptor admitted and authenticated.
//
// It keeps the xDS protocol as go-control-plane's servers do (nonces,
// ACK and NACK, legacy wildcards, subscriptions changed on a stream),
// but a stream is two goroutines that do no work per change beyond
// sending: its requests are taken as they arrive (an ACK, the common
// one, only compares the nonce and names it carries under the stream's
// lock), and its sender is signalled by the cache with what a change
// concerns and sends bytes assembled once per change (encoded).
type ads struct{ s *Server }

func (a ads) StreamAggregatedResources(ss discovery.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	return a.s.serveADS(ss, false)
}

func (a ads) DeltaAggregatedResources(ss discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesServer) error {
	return a.s.serveADS(ss, true)
}

// adsStream is one ADS stream's subscriptions and what it was sent.
type adsStream struct {
	s     *Server
	r     *rpc
	delta bool
	wake  chan struct{} // the sender has something to look at

	mu     sync.Mutex
	snap   *nodeSnapshot // the node's, for delta (nil: not ready)
	types  [numTypes]typeState
	nonces uint64
}

// typeState is a stream's subscription to one type (pushOrder's index).
type typeState struct {
	subscribed bool // a request for the type has been taken
	wildcard   bool
	names      map[string]struct{}
	returned   map[string]string // what the client holds: name -> version (state of the world: a template's, never changed)
	nonce      string            // of the last response sent

	// State of the world.
	key     string    // templateKey of the subscription
	version string    // the version the client holds, or was last sent
	pending *template // to send, when it differs from what the client holds
	lead    uint64    // newest local view version sent (push latency)

	// Delta.
	dirty   bool // compare the snapshot with returned
	initial bool // a first wildcard request: answered even when empty, so that Envoy completes its initialisation
}

// legacyWildcard: an empty first request for the type asks for every
// resource (listeners and clusters); route configurations and
// assignments are asked for by name, and an empty request means none.
func legacyWildcard(t string) bool { return t == resource.ListenerType || t == resource.ClusterType }

// serveADS runs one stream: its requests are taken on a goroutine of
// their own while this one sends what the stream's sender is signalled.
// It returns when the stream's context ends (the interceptor's: token
// expiry, drain), and sends nothing from then on; a send blocked by a
// client that does not read ends when the client reads, the connection
// fails its keepalive, or Drain's deadline closes it.
func (s *Server) serveADS(ss grpc.ServerStream, delta bool) error {
	ctx := ss.Context()
	r, ok := ctx.Value(rpcKey{}).(*rpc)
	if !ok {
		return status.Error(codes.Internal, "xds: stream without an rpc")
	}
	a := &adsStream{s: s, r: r, delta: delta, wake: make(chan struct{}, 1)}
	protocol := "sotw"
	if delta {
		protocol = "delta"
	}
	s.m.streams.WithLabelValues(protocol).Inc()
	defer s.m.streams.WithLabelValues(protocol).Dec()
	s.cache.add(r.key, a)
	defer s.cache.remove(r.key, a)

	recvErr := make(chan error, 1)
	go func() {
		// One request message, reset by each receive: a request's
		// handling keeps none of it but strings.
		sotwReq, deltaReq := &discovery.DiscoveryRequest{}, &discovery.DeltaDiscoveryRequest{}
		for {
			var err error
			if delta {
				if err = ss.RecvMsg(deltaReq); err == nil {
					a.deltaRequest(deltaReq)
				}
			} else if err = ss.RecvMsg(sotwReq); err == nil {
				a.sotwRequest(sotwReq)
			}
			if err != nil {
				recvErr <- err
				return
			}
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-recvErr:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case <-a.wake:
		}
		for i := range pushOrder {
			if ctx.Err() != nil {
				// Its authority ended: nothing more is sent on it.
				return nil
			}
			m, lead, leads := a.next(i)
			if m == nil {
				continue
			}
			if err := ss.SendMsg(m); err != nil {
				return err
			}
			s.m.push(delta, pushOrder[i])
			if lead != 0 {
				s.observeLead(lead)
			}
			for _, v := range leads {
				s.observeLatency(v)
			}
		}
	}
}

// signal tells the sender to look at the stream's types.
func (a *adsStream) signal() {
	select {
	case a.wake <- struct{}{}:
	default:
	}
}

// changed takes a new snapshot of the node: what it changes of a type
// the stream follows becomes the type's pending response (state of the
// world) or is looked at by the sender (delta). It reports whether the
// sender has something to send. c.mu held.
func (a *adsStream) changed(nw *nodeWatches, first bool, changed *[numTypes]map[string]struct{}) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.snap = nw.snap
	wake := false
	for i := range pushOrder {
		st := &a.types[i]
		if !st.subscribed || !(first || follows(st.wildcard, st.names, changed[i])) {
			continue
		}
		if a.delta {
			st.dirty, wake = true, true
			continue
		}
		if x := nw.template(pushOrder[i], st.key, st.wildcard, st.names); x.version != st.version || !returnedAll(st.returned, x.returned) {
			st.pending, wake = x, true
		}
	}
	return wake
}

// sotwRequest takes a state-of-the-world request. One that answers a
// response other than the last sent of its type (a stale nonce) is
// ignored, as the protocol asks; an ACK of what is held changes
// nothing; a NACK is counted and not answered with what it rejected; a
// request with other names (or the stream's first) is answered at once
// when the node holds something the client lacks.
func (a *adsStream) sotwRequest(req *discovery.DiscoveryRequest) {
	t := req.GetTypeUrl()
	i, ok := typeIndex(t)
	if !ok {
		a.s.log.Debug("xDS client asked for a type muster does not serve", "principal", a.r.key, "type", t)
		return
	}
	nack := req.GetErrorDetail() != nil
	if nack {
		a.s.nack(a.r, t, req.GetResponseNonce(), req.GetErrorDetail().GetMessage())
	}
	a.mu.Lock()
	st := &a.types[i]
	if st.nonce != "" && req.GetResponseNonce() != st.nonce {
		a.mu.Unlock()
		return
	}
	wildcard := a.wildcard(t, st, req.GetResourceNames())
	if st.subscribed && wildcard == st.wildcard && sameNames(req.GetResourceNames(), st.names) && (nack || req.GetVersionInfo() == st.version) {
		a.mu.Unlock()
		return
	}
	names := make(map[string]struct{}, len(req.GetResourceNames()))
	var added []string
	for _, n := range req.GetResourceNames() {
		if n == "*" {
			continue
		}
		if _, had := st.names[n]; !had {
			added = append(added, n)
		}
		names[n] = struct{}{}
	}
	a.mu.Unlock()
	a.s.checkDenied(a.r, added)

	c := a.s.cache
	c.mu.Lock()
	defer c.mu.Unlock()
	a.mu.Lock()
	defer a.mu.Unlock()
	if st.nonce != "" && req.GetResponseNonce() != st.nonce {
		return // a response went out meanwhile
	}
	version := req.GetVersionInfo()
	if nack && st.nonce != "" {
		// The client keeps what it had; what it rejected is not resent
		// until it changes.
		version = st.version
	}
	st.subscribed, st.wildcard, st.names = true, wildcard, names
	st.key, st.version, st.pending = templateKey(t, wildcard, names), version, nil
	if nw := c.nodes[a.r.key]; nw != nil && nw.snap != nil {
		if x := nw.template(t, st.key, wildcard, names); x.version != st.version || !returnedAll(st.returned, x.returned) {
			st.pending = x
			a.signal()
		}
	}
}

// wildcard reports whether a request's names ask for every resource of
// type t: "*" among them, or none in a legacy wildcard type's first
// request (and in its next ones while it is a wildcard). a.mu held.
func (a *adsStream) wildcard(t string, st *typeState, names []string) bool {
	for _, n := range names {
		if n == "*" {
			return true
		}
	}
	return len(names) == 0 && legacyWildcard(t) && (!st.subscribed || st.wildcard)
}

// sameNames: the request names (less "*") are the subscription's.
func sameNames(req []string, names map[string]struct{}) bool {
	n := 0
	for _, name := range req {
		if name == "*" {
			continue
		}
		if _, ok := names[name]; !ok {
			return false
		}
		n++
	}
	return n == len(names)
}

// deltaRequest takes a delta request: subscriptions change (the
// unsubscribed names are forgotten as held, so that a name subscribed
// again is sent again), and an ACK or NACK changes nothing (a delta
// resource is resent only when its version changes).
func (a *adsStream) deltaRequest(req *discovery.DeltaDiscoveryRequest) {
	t := req.GetTypeUrl()
	i, ok := typeIndex(t)
	if !ok {
		a.s.log.Debug("xDS client asked for a type muster does not serve", "principal", a.r.key, "type", t)
		return
	}
	if req.GetErrorDetail() != nil {
		a.s.nack(a.r, t, req.GetResponseNonce(), req.GetErrorDetail().GetMessage())
	}
	sub, unsub := req.GetResourceNamesSubscribe(), req.GetResourceNamesUnsubscribe()
	a.mu.Lock()
	st := &a.types[i]
	if st.subscribed && len(sub) == 0 && len(unsub) == 0 {
		a.mu.Unlock()
		return
	}
	a.mu.Unlock()
	a.s.checkDenied(a.r, sub)

	a.mu.Lock()
	defer a.mu.Unlock()
	if !st.subscribed {
		st.subscribed, st.names, st.returned = true, map[string]struct{}{}, map[string]string{}
		for name, v := range req.GetInitialResourceVersions() {
			st.returned[name] = v
		}
		st.wildcard = len(sub) == 0 && legacyWildcard(t)
		st.initial = st.wildcard
	}
	for _, n := range sub {
		if n == "*" {
			st.wildcard = true
			st.initial = st.initial || req.GetResponseNonce() == ""
			continue
		}
		st.names[n] = struct{}{}
	}
	for _, n := range unsub {
		if n == "*" {
			st.wildcard = false
			continue
		}
		delete(st.names, n)
		delete(st.returned, n)
	}
	st.dirty = true
	a.signal()
}

// next is the response to send for type i, if any: the pending template
// with the stream's nonce (state of the world), or what the node's
// snapshot holds that the client lacks (delta). lead is the local view
// version of a state-of-the-world assignment newly sent, and leads the
// versions of a delta response's assignments, for push latency.
func (a *adsStream) next(i int) (m *encoded, lead uint64, leads []string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	st := &a.types[i]
	if !a.delta {
		x := st.pending
		st.pending = nil
		if x == nil || (x.version == st.version && returnedAll(st.returned, x.returned)) {
			return nil, 0, nil
		}
		a.nonces++
		st.nonce = strconv.FormatUint(a.nonces, 10)
		st.version, st.returned = x.version, x.returned
		if x.lead != st.lead {
			st.lead, lead = x.lead, x.lead
		}
		nonce := protowire.AppendBytes(protowire.AppendTag(make([]byte, 0, 24), fieldSotwNonce, protowire.BytesType), []byte(st.nonce))
		return &encoded{data: mem.BufferSlice{mem.SliceBuffer(x.wire()), mem.SliceBuffer(nonce)}}, lead, nil
	}
	if !st.dirty || a.snap == nil {
		return nil, 0, nil
	}
	st.dirty = false
	send, removed := deltaOf(a.snap, pushOrder[i], st.wildcard, st.names, st.returned)
	if len(send) == 0 && len(removed) == 0 && !st.initial {
		return nil, 0, nil
	}
	st.initial = false
	for _, r := range send {
		st.returned[r.name] = r.version
	}
	for _, name := range removed {
		delete(st.returned, name)
	}
	a.nonces++
	st.nonce = strconv.FormatUint(a.nonces, 10)
	data := make(mem.BufferSlice, 0, len(send)+1)
	for _, r := range send {
		data = append(data, mem.SliceBuffer(r.deltaField))
		if pushOrder[i] == resource.EndpointType {
			leads = append(leads, r.version)
		}
	}
	tail := protowire.AppendBytes(protowire.AppendTag(nil, fieldDeltaTypeURL, protowire.BytesType), []byte(pushOrder[i]))
	for _, name := range removed {
		tail = protowire.AppendBytes(protowire.AppendTag(tail, fieldDeltaRemoved, protowire.BytesType), []byte(name))
	}
	tail = protowire.AppendBytes(protowire.AppendTag(tail, fieldDeltaNonce, protowire.BytesType), []byte(st.nonce))
	return &encoded{data: append(data, mem.SliceBuffer(tail))}, 0, leads
}

var _ discovery.AggregatedDiscoveryServiceServer = ads{}
