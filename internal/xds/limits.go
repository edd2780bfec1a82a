package xds

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/identity"
)

// Limits bound what one principal (a token's subject, or the workload a
// SPIFFE ID maps to: identity.Principal.String) can make a replica hold
// through xDS. Without them any principal that may open a stream could
// subscribe to a million names and grow the replica's memory without
// bound. Each replica counts on its own. A request beyond a limit is
// refused with RESOURCE_EXHAUSTED naming the limit and its setting; it
// changes nothing of what the stream or the principal held.
type Limits struct {
	// NamesPerStream bounds the resource names one stream subscribes to:
	// 10,000 (MUSTER_XDS_MAX_NAMES). State of the world: the names of its
	// current requests, summed over the types. Delta: every name
	// subscribed over the stream's life, summed over the types (an
	// unsubscribed name still counts: a client churning through names
	// reconnects to start again). A wildcard counts as one name.
	NamesPerStream int
	// StreamsPerPrincipal bounds the streams one principal holds open on
	// a replica: 10,000, as the watch endpoint's (a fleet of pods
	// sharing one workload identity opens one stream each)
	// (MUSTER_XDS_MAX_STREAMS_PER_PRINCIPAL).
	StreamsPerPrincipal int
	// StreamsPerConnection bounds the streams open on one HTTP/2
	// connection: 100, what HTTP/2 servers commonly allow at once
	// (Envoy and gRPC open one ADS stream per connection; muster's load
	// generator opens 100) (MUSTER_XDS_MAX_STREAMS_PER_CONNECTION).
	StreamsPerConnection int
	// NameBytesPerPrincipal bounds the memory a principal's
	// subscriptions hold, summed over its streams: 64 MiB
	// (MUSTER_XDS_MAX_NAME_BYTES). A name costs nameCost: twice its
	// bytes (the subscription's set and the key of the response it is
	// answered from) and the maps' own overhead; a delta stream's
	// initial_resource_versions cost their names' and versions' bytes.
	NameBytesPerPrincipal int64
}

// DefaultLimits returns the default Limits.
func DefaultLimits() Limits {
	return Limits{NamesPerStream: 10_000, StreamsPerPrincipal: 10_000, StreamsPerConnection: 100, NameBytesPerPrincipal: 64 << 20}
}

// The settings the limits are read from (cmd/muster), named in refusals
// so that an operator reading one knows what to change.
const (
	EnvMaxNames                = "MUSTER_XDS_MAX_NAMES"
	EnvMaxStreamsPerPrincipal  = "MUSTER_XDS_MAX_STREAMS_PER_PRINCIPAL"
	EnvMaxStreamsPerConnection = "MUSTER_XDS_MAX_STREAMS_PER_CONNECTION"
	EnvMaxNameBytes            = "MUSTER_XDS_MAX_NAME_BYTES"
)

// Refusal reasons: the label of muster_xds_refused_total and the code of
// an audited refusal.
const (
	ReasonNamesPerStream        = "names_per_stream"
	ReasonStreamsPerPrincipal   = "streams_per_principal"
	ReasonStreamsPerConnection  = "streams_per_connection"
	ReasonNameBytesPerPrincipal = "name_bytes_per_principal"
)

// nameOverhead is what a subscribed name costs beyond its bytes: a
// string header and a slot in the subscription's set, and its share of
// the set's spare capacity. Measured (TestXDSOneNodesNamesDoNotSlowAnother,
// without the race detector): 1,250,000 names of 8 bytes on a delta and a
// state-of-the-world stream grew the heap by 73 bytes a name; they are
// counted as 80.
const nameOverhead = 64

// nameCost is what subscribing to name makes the replica hold.
func nameCost(name string) int64 { return 2*int64(len(name)) + nameOverhead }

func (l *Limits) validate() error {
	def := DefaultLimits()
	if l.NamesPerStream == 0 {
		l.NamesPerStream = def.NamesPerStream
	}
	if l.StreamsPerPrincipal == 0 {
		l.StreamsPerPrincipal = def.StreamsPerPrincipal
	}
	if l.StreamsPerConnection == 0 {
		l.StreamsPerConnection = def.StreamsPerConnection
	}
	if l.NameBytesPerPrincipal == 0 {
		l.NameBytesPerPrincipal = def.NameBytesPerPrincipal
	}
	if l.NamesPerStream < 0 || l.StreamsPerPrincipal < 0 || l.StreamsPerConnection < 0 || l.NameBytesPerPrincipal < 0 {
		return fmt.Errorf("xds: limits %+v must not be negative", *l)
	}
	return nil
}

// usage is what one principal holds on this replica, or one connection
// (streams only).
type usage struct {
	streams int
	bytes   int64
}

// accounts counts what each principal and connection holds.
type accounts struct {
	lim Limits

	mu          sync.Mutex
	principals  map[string]*usage
	connections map[string]*usage
}

func newAccounts(lim Limits) *accounts {
	return &accounts{lim: lim, principals: map[string]*usage{}, connections: map[string]*usage{}}
}

// open counts a stream of principal on connection, unless either holds
// its limit already: then it reports which, and what is held.
func (c *accounts) open(principal, connection string) (reason string, held int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	p, conn := c.principals[principal], c.connections[connection]
	switch {
	case p != nil && p.streams >= c.lim.StreamsPerPrincipal:
		return ReasonStreamsPerPrincipal, p.streams
	case conn != nil && conn.streams >= c.lim.StreamsPerConnection:
		return ReasonStreamsPerConnection, conn.streams
	}
	if p == nil {
		p = &usage{}
		c.principals[principal] = p
	}
	if conn == nil {
		conn = &usage{}
		c.connections[connection] = conn
	}
	p.streams++
	conn.streams++
	return "", 0
}

// close forgets a stream opened with open (its bytes were released).
func (c *accounts) close(principal, connection string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if p := c.principals[principal]; p != nil {
		if p.streams--; p.streams <= 0 {
			delete(c.principals, principal)
		}
	}
	if conn := c.connections[connection]; conn != nil {
		if conn.streams--; conn.streams <= 0 {
			delete(c.connections, connection)
		}
	}
}

// charge adds n bytes (negative: releases) to what principal holds,
// unless that would take it past its limit: then it reports what it
// holds, and nothing changes.
func (c *accounts) charge(principal string, n int64) (held int64, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.principals[principal]
	if p == nil {
		// Its streams have ended: nothing is held for it.
		return 0, n <= 0
	}
	if n > 0 && p.bytes+n > c.lim.NameBytesPerPrincipal {
		return p.bytes, false
	}
	p.bytes += n
	return p.bytes, true
}

// connectionKey names the stream's HTTP/2 connection: its two ends,
// unique while it is open.
func connectionKey(ctx context.Context) string {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return "unknown"
	}
	local := ""
	if p.LocalAddr != nil {
		local = p.LocalAddr.String()
	}
	return p.Addr.String() + "|" + local
}

// streamsRetry is the retry delay of a stream refused for the streams
// its principal or connection holds: no stream is known to end sooner
// (the watch endpoint's).
const streamsRetry = 10 * time.Second

// refuseLimit counts, audits and returns the refusal of p's request or
// stream for reason, with RESOURCE_EXHAUSTED and detail (which names the
// limit and its setting). A stream refused for its streams carries a
// retry delay.
func (s *Server) refuseLimit(ctx context.Context, p identity.Principal, reason, detail string) error {
	s.m.refused.WithLabelValues(reason).Inc()
	if s.cfg.Refusals != nil {
		s.cfg.Refusals.Record(string(p.Kind), p.String(), []audit.RefusedItem{{Code: reason, Reason: detail}})
	}
	// Counted and audited (one row a minute per principal); a log line
	// each would let a refused client flood the log.
	s.log.Debug("xDS request refused: a limit per principal", "principal", p.String(), "reason", reason, "detail", detail)
	st := status.New(codes.ResourceExhausted, detail)
	if reason == ReasonStreamsPerPrincipal || reason == ReasonStreamsPerConnection {
		_ = grpc.SetTrailer(ctx, metadata.Pairs("retry-after", strconv.Itoa(int(streamsRetry/time.Second))))
		if d, err := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(streamsRetry)}); err == nil {
			st = d
		}
	}
	return st.Err()
}

// namesDetail, streamsDetail and bytesDetail are the refusals' texts.
func (l Limits) namesDetail(held, asked int) string {
	return fmt.Sprintf("xds: at most %d resource names per stream (%s); the stream holds %d and this request names %d: keep what you hold and subscribe to fewer",
		l.NamesPerStream, EnvMaxNames, held, asked)
}

func (l Limits) bytesDetail(p string, held, add int64) string {
	return fmt.Sprintf("xds: at most %d bytes of resource names per principal (%s); %s holds %d and this request would add %d",
		l.NameBytesPerPrincipal, EnvMaxNameBytes, p, held, add)
}

func (l Limits) streamsDetail(reason, p string, held int) string {
	if reason == ReasonStreamsPerConnection {
		return fmt.Sprintf("xds: at most %d streams per connection (%s); this connection holds %d: open another connection",
			l.StreamsPerConnection, EnvMaxStreamsPerConnection, held)
	}
	return fmt.Sprintf("xds: at most %d streams per principal (%s); %s holds %d on this replica: close one, or retry in %d s",
		l.StreamsPerPrincipal, EnvMaxStreamsPerPrincipal, p, held, int(streamsRetry/time.Second))
}
