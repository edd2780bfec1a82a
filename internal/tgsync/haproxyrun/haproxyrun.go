// Package haproxyrun runs a real haproxy (Debian's package) with one
// frontend on loopback, one backend holding a server-template slot pool,
// and the Runtime API on a unix socket at admin level: what the tgsync
// tests (through haproxytest) and `muster loadgen tgsync` drive.
package haproxyrun

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Options shape the configuration.
type Options struct {
	// Binary is haproxy's path.
	Binary string
	// Backend is the backend's name (default "web"); Slots the
	// template's size (default 16).
	Backend string
	Slots   int
	// Extra lines inside the backend (e.g. a static server).
	Extra []string
}

// Proxy is a running haproxy.
type Proxy struct {
	// Socket is the Runtime API socket; URL the frontend's base URL;
	// Backend the backend's name; Slots the template's size; Config the
	// configuration it runs.
	Socket, URL, Backend, Config string
	Slots                        int

	dir    string
	cmd    *exec.Cmd
	exited chan struct{}
	client *http.Client
}

// Start runs haproxy and waits (up to 10 s) for its Runtime API.
func Start(o Options) (*Proxy, error) {
	if o.Backend == "" {
		o.Backend = "web"
	}
	if o.Slots == 0 {
		o.Slots = 16
	}
	// A unix socket path must be short: a test's temporary folder can be
	// too long.
	dir, err := os.MkdirTemp("", "hap-")
	if err != nil {
		return nil, err
	}
	sock := filepath.Join(dir, "admin.sock")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	addr := ln.Addr().String()
	ln.Close()
	var extra strings.Builder
	for _, l := range o.Extra {
		extra.WriteString("  " + l + "\n")
	}
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
%s`, sock, addr, o.Backend, o.Backend, o.Slots, extra.String())
	path := filepath.Join(dir, "haproxy.cfg")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	cmd := exec.Command(o.Binary, "-db", "-f", path)
	logf, err := os.Create(filepath.Join(dir, "haproxy.log"))
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("start haproxy: %w", err)
	}
	p := &Proxy{Socket: sock, URL: "http://" + addr, Backend: o.Backend, Config: cfg, Slots: o.Slots, dir: dir, cmd: cmd,
		exited: make(chan struct{}), client: &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 16}}}
	go func() { _ = cmd.Wait(); close(p.exited) }()
	for deadline := time.Now().Add(10 * time.Second); ; {
		select {
		case <-p.exited:
			log := p.Log()
			os.RemoveAll(dir)
			return nil, fmt.Errorf("haproxy exited at start:\n%s", log)
		default:
		}
		if c, err := net.Dial("unix", sock); err == nil {
			c.Close()
			return p, nil
		}
		if time.Now().After(deadline) {
			p.Stop()
			return nil, errors.New("haproxy's runtime socket did not appear within 10 s")
		}
		time.Sleep(5 * time.Millisecond) // polling with a deadline
	}
}

// Log returns what haproxy wrote.
func (p *Proxy) Log() string {
	b, _ := os.ReadFile(filepath.Join(p.dir, "haproxy.log"))
	return string(b)
}

// Stop kills haproxy, waits for it and removes its folder.
func (p *Proxy) Stop() {
	_ = p.cmd.Process.Kill()
	<-p.exited
	os.RemoveAll(p.dir)
}

// Get sends one request through the proxy and returns the body (the
// identity of the backend that answered) and the status.
func (p *Proxy) Get(ctx context.Context) (string, int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.URL+"/", nil)
	if err != nil {
		return "", 0, err
	}
	res, err := p.client.Do(req)
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
func (p *Proxy) Spread(ctx context.Context, n int) map[string]int {
	out := map[string]int{}
	for range n {
		id, code, err := p.Get(ctx)
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
