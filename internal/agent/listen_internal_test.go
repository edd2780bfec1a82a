package agent

import (
	"net"
	"testing"
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
