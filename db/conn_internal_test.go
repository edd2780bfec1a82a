package db

import (
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// TestIOConnArmsAndDisarms: a query arms the deadline, bytes of the reply
// push it out, and a ReadyForQuery, even one split across reads, disarms
// it; a server that falls silent mid-reply trips it.
func TestIOConnArmsAndDisarms(t *testing.T) {
	t.Parallel()
	client, server := net.Pipe()
	defer client.Close()
	defer server.Close()
	c := newIOConn(client, 200*time.Millisecond)
	armed := func() bool { c.mu.Lock(); defer c.mu.Unlock(); return !c.armed.IsZero() }

	go func() { _, _ = io.ReadFull(server, make([]byte, 1)) }()
	if _, err := c.Write([]byte("Q")); err != nil {
		t.Fatal(err)
	}
	if !armed() {
		t.Fatal("a write left the deadline unarmed")
	}
	go func() {
		_, _ = server.Write([]byte("C\x00\x00\x00\x0dSELECT 1\x00Z\x00\x00"))
		_, _ = server.Write([]byte("\x00\x05I"))
	}()
	buf := make([]byte, 64)
	if _, err := c.Read(buf); err != nil {
		t.Fatal(err)
	}
	if !armed() {
		t.Fatal("disarmed before the reply ended")
	}
	if _, err := c.Read(buf); err != nil {
		t.Fatal(err)
	}
	if armed() {
		t.Fatal("still armed after ReadyForQuery")
	}

	// Idle past the timeout: nothing trips, nothing is owed.
	go func() { _, _ = io.ReadFull(server, make([]byte, 1)) }()
	if _, err := c.Write([]byte("Q")); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err := c.Read(buf) // the server never answers
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read from a silent server: %v", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("the backstop took %s", took)
	}
	if !IsUnavailable(err) || !IsTimeout(err) {
		t.Fatalf("a backstop timeout is not unavailable: %v", err)
	}
}

// TestIOConnKeepsTheCallersDeadline: a deadline pgx sets (to cancel a
// read) applies even while the backstop is further out.
func TestIOConnKeepsTheCallersDeadline(t *testing.T) {
	t.Parallel()
	client, server := net.Pipe()
	defer client.Close()
	defer server.Close()
	c := newIOConn(client, time.Hour)
	go func() { _, _ = io.ReadFull(server, make([]byte, 1)) }()
	if _, err := c.Write([]byte("Q")); err != nil {
		t.Fatal(err)
	}
	if err := c.SetDeadline(time.Now().Add(50 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := c.Read(make([]byte, 8)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read: %v", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("the caller's deadline took %s", took)
	}
}
