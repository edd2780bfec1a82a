// Package xdstest runs real gRPC on loopback for the xDS tests: backends
// that say who they are, and grpc-go clients that dial xds:///SERVICE
// through grpc-go's own xDS resolver and balancers, bootstrapped at a
// muster xDS server with a bearer token.
//
// The token travels as the per-RPC credentials of a channel-credentials
// type this package registers with grpc-go's bootstrap ("muster_bearer":
// plaintext, for loopback, with "authorization: Bearer TOKEN" on every
// call to the xDS server). grpc-go's own JWT call credentials (gRFC A97,
// bootstrap "call_creds" of type jwt_token_file) carry the same header
// but need TLS and GRPC_EXPERIMENTAL_XDS_BOOTSTRAP_CALL_CREDS=true read
// at process start; docs/xds.md gives that bootstrap for production. The
// bootstrap here leaves out ignore_resource_deletion, which docs/xds.md
// recommends, so a resource muster wrongly stopped sending would show in
// the tests.
package xdstest

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/xds"
	"google.golang.org/grpc/xds/bootstrap"
)

// CredsType is the bootstrap channel_creds type carrying a bearer token.
const CredsType = "muster_bearer"

func init() { bootstrap.RegisterChannelCredentials(bearerBuilder{}) }

type bearerBuilder struct{}

func (bearerBuilder) Name() string { return CredsType }

func (bearerBuilder) Build(cfg json.RawMessage) (credentials.Bundle, func(), error) {
	var c struct {
		Token string `json:"token"`
		// ReconnectWithin, a Go duration, is how long the client's
		// channel to the xDS server may wait between connection
		// attempts at most ("" leaves grpc-go's defaults).
		ReconnectWithin string `json:"reconnect_within"`
	}
	if err := json.Unmarshal(cfg, &c); err != nil {
		return nil, nil, fmt.Errorf("muster_bearer config: %w", err)
	}
	b := bundle{token: c.Token}
	if c.ReconnectWithin != "" {
		d, err := time.ParseDuration(c.ReconnectWithin)
		if err != nil || d <= 0 {
			return nil, nil, fmt.Errorf("muster_bearer config: reconnect_within %q: not a positive duration", c.ReconnectWithin)
		}
		b.reconnectWithin = d
	}
	return b, func() {}, nil
}

type bundle struct {
	token           string
	reconnectWithin time.Duration
}

// DialOptions is read by grpc-go's bootstrap for the channel to the xDS
// server. With reconnectWithin set, that channel retries at least that
// often instead of backing off up to 2 min, and the ADS stream waits for
// the channel to connect instead of failing at once and backing off on
// a schedule of its own (also up to 2 min): a test that stops the server
// sees the client come back within about reconnectWithin of the server's
// return, not after both backoffs have run out.
func (b bundle) DialOptions() []grpc.DialOption {
	if b.reconnectWithin == 0 {
		return nil
	}
	return []grpc.DialOption{
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff: backoff.Config{
				BaseDelay:  min(100*time.Millisecond, b.reconnectWithin),
				Multiplier: backoff.DefaultConfig.Multiplier,
				Jitter:     backoff.DefaultConfig.Jitter,
				MaxDelay:   b.reconnectWithin,
			},
			MinConnectTimeout: 20 * time.Second,
		}),
		grpc.WithDefaultCallOptions(grpc.WaitForReady(true)),
	}
}

func (b bundle) TransportCredentials() credentials.TransportCredentials {
	return insecure.NewCredentials()
}
func (b bundle) PerRPCCredentials() credentials.PerRPCCredentials { return bearer(b.token) }
func (b bundle) NewWithMode(string) (credentials.Bundle, error)   { return b, nil }

// bearer sends "authorization: Bearer TOKEN" (no token: nothing).
type bearer string

func (t bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	if t == "" {
		return nil, nil
	}
	return map[string]string{"authorization": "Bearer " + string(t)}, nil
}
func (bearer) RequireTransportSecurity() bool { return false }

// Bearer returns per-RPC credentials sending token, for raw xDS streams.
func Bearer(token string) credentials.PerRPCCredentials { return bearer(token) }

// Bootstrap is a grpc-go xDS bootstrap pointing at the xDS server addr,
// presenting token.
func Bootstrap(addr, token string) []byte {
	return bootstrapJSON(addr, map[string]string{"token": token})
}

func bootstrapJSON(addr string, creds map[string]string) []byte {
	b, _ := json.Marshal(map[string]any{
		"xds_servers": []any{map[string]any{
			"server_uri":      addr,
			"channel_creds":   []any{map[string]any{"type": CredsType, "config": creds}},
			"server_features": []string{"xds_v3"},
		}},
		"node": map[string]any{"id": "xdstest", "locality": map[string]string{"zone": "az1"}},
	})
	return b
}

// Dial returns a grpc-go client of xds:///service whose xDS client (one of
// its own, not the process's shared one) follows the server at addr.
func Dial(t testing.TB, addr, token, service string) *grpc.ClientConn {
	t.Helper()
	builder, err := xds.NewXDSResolverWithConfigForTesting(Bootstrap(addr, token))
	if err != nil {
		t.Fatal(err)
	}
	return DialWith(t, builder, service)
}

// DialReconnecting is Dial for a client that follows a stopped and
// restarted xDS server within about reconnectWithin of its return
// (bundle.DialOptions): grpc-go's own backoffs would add up to 2 min
// after a long outage, and that wait is grpc-go's, not the server's.
func DialReconnecting(t testing.TB, addr, token, service string, reconnectWithin time.Duration) *grpc.ClientConn {
	t.Helper()
	cfg := bootstrapJSON(addr, map[string]string{"token": token, "reconnect_within": reconnectWithin.String()})
	builder, err := xds.NewXDSResolverWithConfigForTesting(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return DialWith(t, builder, service)
}

// DialWith dials xds:///service through builder.
func DialWith(t testing.TB, builder resolver.Builder, service string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient("xds:///"+service, grpc.WithResolvers(builder),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// Backend is a real gRPC server on loopback answering UnaryCall with its
// id.
type Backend struct {
	ID   string
	Addr *net.TCPAddr
	srv  *grpc.Server
	once sync.Once
}

type backendService struct {
	testgrpc.UnimplementedTestServiceServer
	id string
}

func (b backendService) UnaryCall(context.Context, *testgrpc.SimpleRequest) (*testgrpc.SimpleResponse, error) {
	return &testgrpc.SimpleResponse{ServerId: b.id}, nil
}

// StartBackend starts a backend, stopped when t ends (or by Stop).
func StartBackend(t testing.TB, id string) *Backend {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &Backend{ID: id, Addr: ln.Addr().(*net.TCPAddr), srv: grpc.NewServer()}
	testgrpc.RegisterTestServiceServer(b.srv, backendService{id: id})
	go func() { _ = b.srv.Serve(ln) }()
	t.Cleanup(b.Stop)
	return b
}

// Stop stops the backend (its port refuses from then on).
func (b *Backend) Stop() { b.once.Do(b.srv.Stop) }

// Call makes one call and returns the id of the backend that answered,
// or the error.
func Call(ctx context.Context, conn *grpc.ClientConn) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	r, err := testgrpc.NewTestServiceClient(conn).UnaryCall(ctx, &testgrpc.SimpleRequest{FillServerId: true})
	if err != nil {
		return "", err
	}
	return r.GetServerId(), nil
}

// Tally makes n calls and counts the answers by backend id; failed calls
// count under "error: ..." keys.
func Tally(ctx context.Context, conn *grpc.ClientConn, n int) map[string]int {
	out := map[string]int{}
	for range n {
		id, err := Call(ctx, conn)
		if err != nil {
			id = "error: " + err.Error()
		}
		out[id]++
	}
	return out
}
