package agent

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync/atomic"
)

// ErrNotLoopback is Listen's error for an address anyone but the host
// could reach.
var ErrNotLoopback = errors.New("muster agent serves without credentials, so only on loopback (127.0.0.1, ::1, localhost) or a Unix socket (unix:/path)")

// Listen listens on addr: "unix:/path" (a stale socket file is
// replaced), or HOST:PORT where HOST is a loopback address or
// "localhost". Any other address is refused with ErrNotLoopback: the
// agent gives whoever connects its own authority. A TCP connection
// whose peer is not a loopback address (a host route or a NAT rule
// could deliver one) is closed as soon as it is accepted, and counted.
func Listen(addr string) (*Listener, error) {
	if path, ok := strings.CutPrefix(addr, "unix:"); ok {
		if path == "" {
			return nil, fmt.Errorf("listen %q: a Unix socket needs a path", addr)
		}
		if fi, err := os.Lstat(path); err == nil && fi.Mode()&os.ModeSocket != 0 {
			_ = os.Remove(path)
		}
		ln, err := net.Listen("unix", path)
		if err != nil {
			return nil, fmt.Errorf("listen %s: %w", addr, err)
		}
		return &Listener{Listener: ln}, nil
	}
	if err := CheckLoopback(addr); err != nil {
		return nil, err
	}
	host, _, _ := net.SplitHostPort(addr)
	network := "tcp"
	if host == "localhost" {
		network = "tcp4" // localhost could resolve to anything in a hostile resolv; 127.0.0.1 cannot
		addr = net.JoinHostPort("127.0.0.1", addr[len(host)+1:])
	}
	ln, err := net.Listen(network, addr)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", addr, err)
	}
	return &Listener{Listener: ln}, nil
}

// CheckLoopback returns ErrNotLoopback, wrapped with addr, unless addr
// is HOST:PORT with HOST a loopback address or "localhost".
func CheckLoopback(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("listen %q: %w: %w", addr, ErrNotLoopback, err)
	}
	if host == "localhost" {
		return nil
	}
	ip, err := netip.ParseAddr(host)
	if err != nil || !ip.IsLoopback() {
		return fmt.Errorf("listen %q: %w", addr, ErrNotLoopback)
	}
	return nil
}

// Listener accepts only loopback peers (and any peer of a Unix socket,
// which the file's permissions guard).
type Listener struct {
	net.Listener
	refused atomic.Uint64
}

// Accept returns the next connection from a loopback peer.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if loopbackPeer(c.RemoteAddr()) {
			return c, nil
		}
		l.refused.Add(1)
		_ = c.Close()
	}
}

// Refused is how many connections from a non-loopback peer were closed.
func (l *Listener) Refused() uint64 { return l.refused.Load() }

// loopbackPeer reports whether a is a loopback TCP address or a Unix
// socket's peer.
func loopbackPeer(a net.Addr) bool {
	switch a := a.(type) {
	case *net.UnixAddr:
		return true
	case *net.TCPAddr:
		ip, ok := netip.AddrFromSlice(a.IP)
		return ok && ip.Unmap().IsLoopback()
	}
	if a == nil {
		return false
	}
	ap, err := netip.ParseAddrPort(a.String())
	return err == nil && ap.Addr().Unmap().IsLoopback()
}
