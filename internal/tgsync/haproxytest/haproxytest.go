// Package haproxytest runs Debian's real haproxy for tests (through
// haproxyrun), in front of real HTTP backends on loopback.
package haproxytest

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/musterhq/muster/internal/testbin"
	"github.com/musterhq/muster/internal/tgsync/haproxyrun"
)

// Proxy is a running haproxy, stopped when the test ends.
type Proxy struct {
	*haproxyrun.Proxy
}

// Options shape the configuration.
type Options struct {
	Backend string // default "web"
	Slots   int    // default 16
	// Extra lines inside the backend (e.g. a static server).
	Extra []string
}

// Start runs haproxy until the test ends (SIGKILL in Cleanup); it skips
// without a haproxy binary (fails with MUSTER_REQUIRE_TOOLS=1).
func Start(t testing.TB, o Options) *Proxy {
	t.Helper()
	bin := testbin.Require(t, "haproxy")
	p, err := haproxyrun.Start(haproxyrun.Options{Binary: bin, Backend: o.Backend, Slots: o.Slots, Extra: o.Extra})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("haproxy said:\n%s", p.Log())
		}
		p.Stop()
	})
	return &Proxy{p}
}

// Spread sends n requests and counts them by backend identity.
func (p *Proxy) Spread(n int) map[string]int { return p.Proxy.Spread(context.Background(), n) }

// Backend is a real HTTP server on loopback answering with its identity.
type Backend struct {
	ID   string
	Addr string
	Port int
}

// NewBackend starts a backend answering id; it stops when the test ends.
func NewBackend(t testing.TB, id string) *Backend {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, id)
	}))
	t.Cleanup(srv.Close)
	host, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	p, _ := strconv.Atoi(port)
	return &Backend{ID: id, Addr: host, Port: p}
}
