package db

import (
	"bytes"
	"context"
	"net"
	"sync"
	"time"
)

// DefaultIOTimeout is how long a connection may wait for PostgreSQL's next
// byte while a reply is owed before it is given up as dead (see ioConn).
//
// Why 5 s: it is the backstop for work that runs without a deadline of its
// own (background workers, tools), not the request budget (server.Config's
// DBTimeout, 1.5 s, a context deadline, ends request-path queries first). A
// healthy PostgreSQL sends something within milliseconds of a query, except
// while one statement computes silently (a large DELETE, a sort before the
// first row); nothing muster runs is that slow at region scale, and 5 s
// leaves an order of magnitude of headroom over the slowest (the observed
// window prune). Longer would let a frozen server (SIGSTOP, a hung host, a
// network path that drops packets without a reset) park a worker for that
// long per query. statement_timeout (15 s, server side) stays the bound on
// what a statement may take in total, streaming included; this one only
// measures silence.
const DefaultIOTimeout = 5 * time.Second

// ioConn is a net.Conn with a client-side deadline for a server that stops
// answering without closing the connection: a frozen PostgreSQL (every
// process SIGSTOPped) accepts the bytes of a query into the socket buffer
// and never replies, and without a deadline the read waits forever.
//
// Writing arms the deadline (now + timeout), every byte received pushes it
// out again, and a read that ends on ReadyForQuery (the server is idle,
// waiting for the next query) disarms it, so an idle pooled connection
// carries no deadline. It is an inactivity limit, not a cap on a reply's
// length: a large result that keeps streaming never trips it. Deadlines
// pgx sets itself (context cancellation) still apply; the earlier one wins.
type ioConn struct {
	net.Conn
	timeout time.Duration

	mu                  sync.Mutex
	armed               time.Time // zero: no reply owed
	userRead, userWrite time.Time // what pgx asked for
	tail                [6]byte   // the last bytes received, to spot ReadyForQuery across reads
	ntail               int
}

func newIOConn(c net.Conn, timeout time.Duration) *ioConn {
	return &ioConn{Conn: c, timeout: timeout}
}

func (c *ioConn) Write(b []byte) (int, error) {
	if len(b) > 0 {
		c.mu.Lock()
		c.armed = time.Now().Add(c.timeout)
		c.applyLocked()
		c.mu.Unlock()
	}
	return c.Conn.Write(b)
}

func (c *ioConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.mu.Lock()
		c.noteTailLocked(b[:n])
		if !c.armed.IsZero() {
			if c.replyEndedLocked() {
				c.armed = time.Time{}
			} else {
				c.armed = time.Now().Add(c.timeout)
			}
			c.applyLocked()
		}
		c.mu.Unlock()
	}
	return n, err
}

func (c *ioConn) SetDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.userRead, c.userWrite = t, t
	return c.applyLocked()
}

func (c *ioConn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.userRead = t
	return c.applyLocked()
}

func (c *ioConn) SetWriteDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.userWrite = t
	return c.applyLocked()
}

// applyLocked sets the earlier of the armed and the caller's deadline on
// the connection, per direction.
func (c *ioConn) applyLocked() error {
	if err := c.Conn.SetReadDeadline(earliest(c.armed, c.userRead)); err != nil {
		return err
	}
	return c.Conn.SetWriteDeadline(earliest(c.armed, c.userWrite))
}

// noteTailLocked keeps the last len(c.tail) bytes received.
func (c *ioConn) noteTailLocked(b []byte) {
	if len(b) >= len(c.tail) {
		copy(c.tail[:], b[len(b)-len(c.tail):])
		c.ntail = len(c.tail)
		return
	}
	keep := min(c.ntail, len(c.tail)-len(b))
	copy(c.tail[:keep], c.tail[c.ntail-keep:c.ntail])
	copy(c.tail[keep:], b)
	c.ntail = keep + len(b)
}

// readyForQuery is the start of PostgreSQL's ReadyForQuery message: type
// 'Z', length 5, then the transaction status (idle, in a transaction,
// failed transaction).
var readyForQuery = []byte{'Z', 0, 0, 0, 5}

// replyEndedLocked reports whether the bytes received so far end with a
// ReadyForQuery message. A row whose data happens to end the same way
// only disarms the backstop for the rest of that reply (the context and
// statement_timeout still bound it); behind TLS the bytes are encrypted,
// the check never matches, and the deadline simply stays armed until the
// next query re-arms it.
func (c *ioConn) replyEndedLocked() bool {
	if c.ntail < len(c.tail) || !bytes.Equal(c.tail[:5], readyForQuery) {
		return false
	}
	switch c.tail[5] {
	case 'I', 'T', 'E':
		return true
	}
	return false
}

func earliest(a, b time.Time) time.Time {
	switch {
	case a.IsZero():
		return b
	case b.IsZero() || a.Before(b):
		return a
	}
	return b
}

// dialWithIOTimeout wraps dial so every connection it makes carries the
// backstop.
func dialWithIOTimeout(dial func(ctx context.Context, network, addr string) (net.Conn, error), timeout time.Duration) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return newIOConn(c, timeout), nil
	}
}
