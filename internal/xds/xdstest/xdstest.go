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
	}
	if err := json.Unmarshal(cfg, &c); err != nil {
		return nil, nil, fmt.Errorf("muster_bearer config: %w", err)
	}
	return bundle{token: c.Token}, func() {}, nil
}

type bundle struct{ token string }

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
	b, _ := json.Marshal(map[string]any{
		"xds_servers": []any{map[string]any{
			"server_uri":      addr,
			"channel_creds":   []any{map[string]any{"type": CredsType, "config": map[string]string{"token": token}}},
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
