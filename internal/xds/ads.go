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
	nw    *nodeWatches  // its node's (watchCache.add)

	// noteMu guards notes: the changes of the node's snapshot not yet
	// taken (note, takeNotes). It is never held for more than an append,
	// so that a node's update never waits for one of its streams.
	noteMu sync.Mutex
	notes  []*change

	mu     sync.Mutex
	snap   *nodeSnapshot // the node's, as of the notes taken (nil: not ready)
	types  [numTypes]typeState
	nonces uint64
	closed bool // the stream has ended: what it held is released
}

// maxNotes bounds the changes a stream keeps untaken; past it they are
// collapsed into one that treats every name as changed.
const maxNotes = 64

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
	acked   string    // the version the client last ACKed (tests wait on it)
	pending *template // to send, when it differs from what the client holds
	lead    uint64    // newest local view version sent (push latency)

	stale bool // a change the subscription follows: build its template again

	// Delta.
	starred bool // a wildcard was counted (Limits: once over the stream's life)
	dirty   bool // compare the snapshot with returned
	initial bool // a first wildcard request: answered even when empty, so that Envoy completes its initialisation

	// What the subscription is counted for (Limits): names (a wildcard
	// is one) and the bytes charged to the principal. State of the
	// world: its current request's; delta: every name subscribed over
	// the stream's life.
	count int
	bytes int64
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
	defer a.release()

	recvErr := make(chan error, 1)
	go func() {
		// One request message, reset by each receive: a request's
		// handling keeps none of it but strings.
		sotwReq, deltaReq := &discovery.DiscoveryRequest{}, &discovery.DeltaDiscoveryRequest{}
		for {
			var err error
			if delta {
				if err = ss.RecvMsg(deltaReq); err == nil {
					err = a.deltaRequest(deltaReq)
				}
			} else if err = ss.RecvMsg(sotwReq); err == nil {
				err = a.sotwRequest(sotwReq)
			}
			if err != nil {
				// A refused request ends the stream: nothing more of
				// it is taken.
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

// note gives the stream a change of its node's snapshot. It takes what
// the change concerns at once when the stream is not busy taking a
// request of its own (that costs no more than the changed names it
// follows), and otherwise leaves it to the sender, signalled: an
// update of the node never waits for one of its streams, however many
// names that stream's request carries. watchCache.SetSnapshot calls it
// with the node's lock held.
func (a *adsStream) note(ch *change) {
	a.noteMu.Lock()
	if len(a.notes) >= maxNotes {
		a.notes = append(a.notes[:0], &change{snap: ch.snap, all: true})
	} else {
		a.notes = append(a.notes, ch)
	}
	a.noteMu.Unlock()
	if !a.mu.TryLock() {
		a.signal()
		return
	}
	wake := a.takeNotes()
	a.mu.Unlock()
	if wake {
		a.signal()
	}
}

// takeNotes takes the changes noted: what they change of a type the
// stream follows is looked at by the sender (its template built again,
// state of the world; compared with what the client holds, delta). It
// reports whether the sender has something to look at. a.mu held.
func (a *adsStream) takeNotes() bool {
	a.noteMu.Lock()
	notes := a.notes
	a.notes = nil
	a.noteMu.Unlock()
	wake := false
	for _, ch := range notes {
		a.snap = ch.snap
		for i := range pushOrder {
			st := &a.types[i]
			switch {
			case !st.subscribed:
				continue
			case ch.first || ch.all:
			case a.delta && !follows(st.wildcard, st.names, ch.names[i]):
				continue
			case !a.delta && !st.differs(ch.snap, pushOrder[i], ch.names[i]):
				continue
			}
			if a.delta {
				st.dirty = true
			} else {
				st.stale = true
			}
			wake = true
		}
	}
	return wake
}

// differs reports whether a state-of-the-world subscription's response
// in snap differs from what the client was last sent, given the names
// of type t that changed: whether a changed name it follows is held at
// another version, or no longer, or newly. It costs no more than the
// changed names (or the subscribed ones, when fewer).
func (st *typeState) differs(snap *nodeSnapshot, t string, changed map[string]struct{}) bool {
	held := snap.resources[t]
	moved := func(name string) bool {
		r := held[name]
		v, sent := st.returned[name]
		return (r == nil) == sent || r != nil && r.version != v
	}
	if st.wildcard || len(changed) <= len(st.names) {
		for name := range changed {
			if _, ok := st.names[name]; (st.wildcard || ok) && moved(name) {
				return true
			}
		}
		return false
	}
	for name := range st.names {
		if _, ok := changed[name]; ok && moved(name) {
			return true
		}
	}
	return false
}

// release ends the stream's accounts: what its subscriptions were
// charged goes back to its principal, and no request is taken from now
// on.
func (a *adsStream) release() {
	a.mu.Lock()
	a.closed = true
	var n int64
	for i := range a.types {
		n += a.types[i].bytes
		a.types[i].bytes = 0
	}
	a.mu.Unlock()
	if n != 0 {
		a.s.acct.charge(a.r.key, -n)
	}
}

// counted is how many names the stream's types other than i are counted
// for. a.mu held.
func (a *adsStream) counted(except int) int {
	n := 0
	for j := range a.types {
		if j != except {
			n += a.types[j].count
		}
	}
	return n
}

// refuse counts, audits and returns a request's refusal for a limit,
// and ends the stream with it: the client keeps what it holds.
func (a *adsStream) refuse(reason, detail string) error {
	err := a.s.refuseLimit(a.s.ctx, a.r.principal, reason, detail)
	a.r.end(err)
	return err
}

// sotwRequest takes a state-of-the-world request. One that answers a
// response other than the last sent of its type (a stale nonce) is
// ignored, as the protocol asks; an ACK of what is held changes
// nothing; a NACK is counted and not answered with what it rejected; a
// request with other names (or the stream's first) is answered at once
// when the node holds something the client lacks. A request that would
// take the stream or its principal past a limit (Limits) is refused:
// the error returned ends the stream, and nothing it asked for is held.
func (a *adsStream) sotwRequest(req *discovery.DiscoveryRequest) error {
	t := req.GetTypeUrl()
	i, ok := typeIndex(t)
	if !ok {
		a.s.log.Debug("xDS client asked for a type muster does not serve", "principal", a.r.key, "type", t)
		return nil
	}
	nack := req.GetErrorDetail() != nil
	if nack {
		a.s.nack(a.r, t, req.GetResponseNonce(), req.GetErrorDetail().GetMessage())
	}
	added, err := a.takeSotW(i, t, req, nack)
	if err == nil {
		// Counted without the stream's lock held: checkDenied reads the
		// server's.
		a.s.checkDenied(a.r, added)
	}
	return err
}

// takeSotW is sotwRequest's work on the stream's state; it returns the
// names the request added.
func (a *adsStream) takeSotW(i int, t string, req *discovery.DiscoveryRequest, nack bool) ([]string, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	st := &a.types[i]
	if a.closed || st.nonce != "" && req.GetResponseNonce() != st.nonce {
		return nil, nil
	}
	if !nack && st.nonce != "" {
		st.acked = req.GetVersionInfo()
	}
	asked := req.GetResourceNames()
	wildcard := a.wildcard(t, st, asked)
	if st.subscribed && wildcard == st.wildcard && sameNames(asked, st.names) && (nack || req.GetVersionInfo() == st.version) {
		return nil, nil
	}
	// The names are counted as asked (a repeat too) before any is
	// kept, so that a request of a million names costs no more than
	// its refusal.
	count := 0
	for _, n := range asked {
		if n != "*" {
			count++
		}
	}
	if wildcard {
		count++
	}
	lim := a.s.cfg.Limits
	if a.counted(i)+count > lim.NamesPerStream {
		return nil, a.refuse(ReasonNamesPerStream, lim.namesDetail(a.counted(i), len(asked)))
	}
	names := make(map[string]struct{}, count)
	var added []string
	var bytes int64
	for _, n := range asked {
		if _, dup := names[n]; dup || n == "*" {
			continue
		}
		if _, had := st.names[n]; !had {
			added = append(added, n)
		}
		names[n] = struct{}{}
		bytes += nameCost(n)
	}
	if add := bytes - st.bytes; add != 0 {
		if held, ok := a.s.acct.charge(a.r.key, add); !ok {
			return nil, a.refuse(ReasonNameBytesPerPrincipal, lim.bytesDetail(a.r.key, held, add))
		}
	}
	version := req.GetVersionInfo()
	if nack && st.nonce != "" {
		// The client keeps what it had; what it rejected is not resent
		// until it changes.
		version = st.version
	}
	st.subscribed, st.wildcard, st.names, st.count, st.bytes = true, wildcard, names, count, bytes
	st.key, st.version, st.pending, st.stale = templateKey(t, wildcard, names), version, nil, true
	a.signal()
	return added, nil
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
// resource is resent only when its version changes). A request that
// would take the stream or its principal past a limit (Limits) is
// refused: the error returned ends the stream, and nothing it asked for
// is held.
func (a *adsStream) deltaRequest(req *discovery.DeltaDiscoveryRequest) error {
	t := req.GetTypeUrl()
	i, ok := typeIndex(t)
	if !ok {
		a.s.log.Debug("xDS client asked for a type muster does not serve", "principal", a.r.key, "type", t)
		return nil
	}
	if req.GetErrorDetail() != nil {
		a.s.nack(a.r, t, req.GetResponseNonce(), req.GetErrorDetail().GetMessage())
	}
	took, err := a.takeDelta(i, t, req)
	if took {
		// Counted without the stream's lock held: checkDenied reads the
		// server's.
		a.s.checkDenied(a.r, req.GetResourceNamesSubscribe())
	}
	return err
}

// takeDelta is deltaRequest's work on the stream's state; it reports
// whether the request changed the subscription.
func (a *adsStream) takeDelta(i int, t string, req *discovery.DeltaDiscoveryRequest) (bool, error) {
	sub, unsub := req.GetResourceNamesSubscribe(), req.GetResourceNamesUnsubscribe()
	a.mu.Lock()
	defer a.mu.Unlock()
	st := &a.types[i]
	if a.closed || st.subscribed && len(sub) == 0 && len(unsub) == 0 {
		return false, nil
	}
	// What the request adds is counted before any of it is kept: the
	// names not subscribed yet, a wildcard once over the stream's life,
	// and on the first request the names the client says it holds
	// without subscribing to them. Counting stops past the room left,
	// so that a request of a million names costs no more than its
	// refusal.
	lim := a.s.cfg.Limits
	room := lim.NamesPerStream - a.counted(-1)
	initial := req.GetInitialResourceVersions()
	fresh := map[string]struct{}{}
	starred := st.starred
	legacy := !st.subscribed && len(sub) == 0 && legacyWildcard(t)
	count := 0
	if legacy {
		starred, count = true, 1
	}
	var bytes int64
	for _, n := range sub {
		if count > room {
			break
		}
		if n == "*" {
			if !starred {
				starred, count = true, count+1
			}
			continue
		}
		if _, had := st.names[n]; had {
			continue
		}
		if _, dup := fresh[n]; !dup {
			fresh[n] = struct{}{}
			count++
			bytes += nameCost(n)
		}
	}
	if !st.subscribed {
		for n, v := range initial {
			if count > room {
				break
			}
			if _, sub := fresh[n]; !sub {
				count++
				bytes += nameCost(n)
			}
			bytes += int64(len(v))
		}
	}
	if count > room {
		return false, a.refuse(ReasonNamesPerStream, lim.namesDetail(a.counted(-1), len(sub)+len(initial)))
	}
	if bytes > 0 {
		if held, ok := a.s.acct.charge(a.r.key, bytes); !ok {
			return false, a.refuse(ReasonNameBytesPerPrincipal, lim.bytesDetail(a.r.key, held, bytes))
		}
	}
	st.count, st.bytes, st.starred = st.count+count, st.bytes+bytes, starred
	if !st.subscribed {
		st.subscribed, st.names, st.returned = true, map[string]struct{}{}, map[string]string{}
		for name, v := range initial {
			st.returned[name] = v
		}
		st.wildcard, st.initial = legacy, legacy
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
	return true, nil
}

// next is the response to send for type i, if any: the pending template
// with the stream's nonce (state of the world), or what the node's
// snapshot holds that the client lacks (delta). lead is the local view
// version of a state-of-the-world assignment newly sent, and leads the
// versions of a delta response's assignments, for push latency.
func (a *adsStream) next(i int) (m *encoded, lead uint64, leads []string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.takeNotes() {
		// Types before i may have changed too: look again.
		a.signal()
	}
	st := &a.types[i]
	if !a.delta {
		if st.stale && a.snap != nil {
			// Built here, by the stream's sender, and not where the node's
			// snapshot is set: a response to many names costs its own
			// stream, never another node's update.
			st.stale = false
			if x := a.nw.template(a.snap, pushOrder[i], st.key, st.wildcard, st.names); x.version != st.version || !returnedAll(st.returned, x.returned) {
				st.pending = x
			}
		}
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
