package agent

import (
	"context"
	"net"
	"testing"

	"google.golang.org/grpc/peer"
)

// fixedListener hands out one connection per address given, then
// reports closed.
type fixedListener struct {
	net.Listener
	conns chan net.Conn
}

func (l *fixedListener) Accept() (net.Conn, error) {
	c, ok := <-l.conns
	if !ok {
		return nil, net.ErrClosed
	}
	return c, nil
}

type addrConn struct {
	net.Conn
	remote net.Addr
}

func (c addrConn) RemoteAddr() net.Addr { return c.remote }

// TestListenerDropsNonLoopbackPeers: a connection whose peer is not a
// loopback address (a host route or NAT rule could deliver one to a
// loopback listener's port) is closed and counted, and the next
// loopback one is accepted.
func TestListenerDropsNonLoopbackPeers(t *testing.T) {
	t.Parallel()
	ch := make(chan net.Conn, 3)
	var mine []net.Conn
	for _, ip := range []string{"10.0.0.7", "::ffff:192.168.1.2", "127.0.0.1"} {
		a, b := net.Pipe()
		t.Cleanup(func() { a.Close(); b.Close() })
		mine = append(mine, b)
		ch <- addrConn{Conn: a, remote: &net.TCPAddr{IP: net.ParseIP(ip), Port: 4000}}
	}
	close(ch)
	l := &Listener{Listener: &fixedListener{conns: ch}}
	c, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	if got := c.RemoteAddr().String(); got != "127.0.0.1:4000" {
		t.Fatalf("accepted %s; want the loopback peer", got)
	}
	if l.Refused() != 2 {
		t.Fatalf("refused %d; want 2", l.Refused())
	}
	// The refused ones were closed: their other end reads EOF.
	for _, b := range mine[:2] {
		if _, err := b.Read(make([]byte, 1)); err == nil {
			t.Fatal("a refused connection is still open")
		}
	}
	if _, err := l.Accept(); err == nil {
		t.Fatal("Accept after the last connection")
	}
}

// TestLocalStreamsAreTheAgents: an xDS stream from loopback or a Unix
// socket is the agent's own principal, with or without a token; one
// from anywhere else (were the xDS server ever handed another listener)
// is refused.
func TestLocalStreamsAreTheAgents(t *testing.T) {
	t.Parallel()
	from := func(a net.Addr) context.Context { return peer.NewContext(t.Context(), &peer.Peer{Addr: a}) }
	for _, a := range []net.Addr{&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 5}, &net.TCPAddr{IP: net.IPv6loopback, Port: 5}, &net.UnixAddr{Name: "@", Net: "unix"}} {
		p, err := anonymous(from(a))
		if err != nil || p.String() != Principal.String() {
			t.Fatalf("a stream from %s: %v, %v; want the agent's principal", a, p, err)
		}
		if p, err := (localOnly{}).Verify(from(a), "whatever-token"); err != nil || p.String() != Principal.String() {
			t.Fatalf("a stream from %s with a token: %v, %v; want the agent's principal", a, p, err)
		}
	}
	if _, err := anonymous(from(&net.TCPAddr{IP: net.IPv4(10, 0, 0, 7), Port: 5})); err == nil {
		t.Fatal("a stream from 10.0.0.7 was given the agent's principal")
	}
	if _, err := anonymous(t.Context()); err == nil {
		t.Fatal("a stream with no peer was given the agent's principal")
	}
}
