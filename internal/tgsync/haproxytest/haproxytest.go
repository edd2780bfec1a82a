// Package haproxytest runs Debian's real haproxy for tests, in front of
// real HTTP backends on loopback: a frontend on a free port, one backend
// with a server-template slot pool, and the Runtime API on a unix socket
// at admin level.
package haproxytest

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/musterhq/muster/internal/testbin"
	"github.com/musterhq/muster/internal/wait"
)

// Proxy is a running haproxy.
type Proxy struct {
	// Socket is the Runtime API socket; URL the frontend's base URL;
	// Backend the backend's name; Slots the template's size.
	Socket, URL, Backend string
	Slots                int
	client               *http.Client
}

// Options shape the configuration.
type Options struct {
	Backend string // default "web"
	Slots   int    // default 16
	// Extra lines inside the backend (e.g. a static server).
	Extra []string
}

// Start runs haproxy until the test ends (SIGKILL in Cleanup).
func Start(t testing.TB, o Options) *Proxy {
	t.Helper()
	bin := testbin.Require(t, "haproxy")
	if o.Backend == "" {
		o.Backend = "web"
	}
	if o.Slots == 0 {
		o.Slots = 16
	}
	// A unix socket path must be short: t.TempDir's can be too long.
	dir, err := os.MkdirTemp("", "hap-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "admin.sock")
	addr := freeAddr(t)
	cfg := fmt.Sprintf(`global
  stats socket %s level admin
  maxconn 4096
defaults
  mode http
  timeout connect 1s
  timeout client 10s
  timeout server 10s
frontend fe
  bind %s
  default_backend %s
backend %s
  balance roundrobin
  server-template slot 1-%d 0.0.0.0:0 disabled
%s
`, sock, addr, o.Backend, o.Backend, o.Slots, indent(o.Extra))
	path := filepath.Join(dir, "haproxy.cfg")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-db", "-f", path)
	logf, err := os.Create(filepath.Join(dir, "haproxy.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("haproxy said:\n%s", b)
		}
	})
	wait.For(t, 10*time.Second, "haproxy's runtime socket", func() bool {
		select {
		case <-exited:
			b, _ := os.ReadFile(logf.Name())
			t.Fatalf("haproxy exited:\n%s\nconfig:\n%s", b, cfg)
		default:
		}
		c, err := net.Dial("unix", sock)
		if err != nil {
			return false
		}
		c.Close()
		return true
	})
	return &Proxy{Socket: sock, URL: "http://" + addr, Backend: o.Backend, Slots: o.Slots,
		client: &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 16}}}
}

func indent(lines []string) string {
	var b strings.Builder
	for _, l := range lines {
		b.WriteString("  " + l + "\n")
	}
	return b.String()
}

func freeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// Get sends one request through the proxy and returns the identity of
// the backend that answered ("" and the status for anything but 200).
func (p *Proxy) Get() (string, int, error) {
	res, err := p.client.Get(p.URL + "/")
	if err != nil {
		return "", 0, err
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode != 200 {
		return "", res.StatusCode, nil
	}
	return string(b), 200, nil
}

// Spread sends n requests and counts them by backend identity ("503" and
// the like for failed ones, "error" for transport errors).
func (p *Proxy) Spread(n int) map[string]int {
	out := map[string]int{}
	for range n {
		id, code, err := p.Get()
		switch {
		case err != nil:
			out["error"]++
		case code != 200:
			out[strconv.Itoa(code)]++
		default:
			out[id]++
		}
	}
	return out
}

// Backend is a real HTTP server on loopback answering with its identity.
type Backend struct {
	ID   string
	Addr string
	Port int
	srv  *httptest.Server
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
	return &Backend{ID: id, Addr: host, Port: p, srv: srv}
}
