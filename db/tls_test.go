package db_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/tlsreload/tlstest"
)

// tlsOnlyServer accepts PostgreSQL's SSLRequest, completes the TLS
// handshake with a leaf of ca for 127.0.0.1, and counts the handshakes
// that completed; then it hangs up, so a client that got that far fails
// with an EOF, not a certificate error.
func tlsOnlyServer(t *testing.T, ca *tlstest.CA) (addr string, handshakes func() int) {
	t.Helper()
	certPEM, keyPEM := ca.Leaf(t, "db", time.Hour)
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	n := 0
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				msg, err := pgproto3.NewBackend(c, c).ReceiveStartupMessage()
				if _, ok := msg.(*pgproto3.SSLRequest); err != nil || !ok {
					return
				}
				if _, err := c.Write([]byte("S")); err != nil {
					return
				}
				tc := tls.Server(c, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
				if tc.Handshake() == nil {
					mu.Lock()
					n++
					mu.Unlock()
				}
			})
		}
	})
	return ln.Addr().String(), func() int { mu.Lock(); defer mu.Unlock(); return n }
}

// TestSetRootCAs: with SetRootCAs a connection string that asks for
// verification but names no sslrootcert verifies the server against the
// roots given, under verify-full (Go's own check) and verify-ca (pgx's
// callback, which reads the roots when it runs), where the system roots
// alone refuse it ("unknown authority"); an sslrootcert of the string's
// own is kept, and sslmode=require stays unverified. SystemRootHosts
// names exactly the hosts SetRootCAs would change.
func TestSetRootCAs(t *testing.T) {
	t.Setenv("PGSSLMODE", "")
	t.Setenv("PGSSLROOTCERT", "")
	ca, other := tlstest.NewCA(t), tlstest.NewCA(t)
	addr, handshakes := tlsOnlyServer(t, ca)
	base := "postgres://muster@" + addr + "/muster?connect_timeout=5"
	connect := func(url string, roots *x509.CertPool) error {
		cc, err := pgx.ParseConfig(url)
		if err != nil {
			t.Fatal(err)
		}
		db.SetRootCAs(&cc.Config, roots)
		conn, err := pgx.ConnectConfig(context.Background(), cc)
		if err == nil {
			conn.Close(context.Background())
		}
		return err
	}
	for _, mode := range []string{"verify-full", "verify-ca"} {
		url := base + "&sslmode=" + mode
		hosts, err := db.SystemRootHosts(url)
		if err != nil || len(hosts) != 1 || hosts[0] != "127.0.0.1" {
			t.Errorf("%s: SystemRootHosts = %v, %v; want [127.0.0.1]", mode, hosts, err)
		}
		if err := connect(url, nil); err == nil || !strings.Contains(err.Error(), "unknown authority") {
			t.Errorf("%s against the system roots: %v, want unknown authority", mode, err)
		}
		if err := connect(url, other.Pool()); err == nil || !strings.Contains(err.Error(), "unknown authority") {
			t.Errorf("%s against another CA: %v, want unknown authority", mode, err)
		}
		before := handshakes()
		if err := connect(url, ca.Pool()); err == nil || strings.Contains(err.Error(), "certificate") {
			t.Errorf("%s against the server's CA: %v, want the handshake done and the stand-in's hang-up", mode, err)
		}
		if handshakes() <= before {
			t.Errorf("%s against the server's CA: no handshake completed", mode)
		}
	}
	// An sslrootcert of the URL's own wins over the roots given.
	bundle := t.TempDir() + "/own.pem"
	tlstest.WriteFile(t, bundle, other.PEM)
	if hosts, _ := db.SystemRootHosts(base + "&sslmode=verify-full&sslrootcert=" + bundle); len(hosts) != 0 {
		t.Errorf("SystemRootHosts with an sslrootcert = %v, want none", hosts)
	}
	if err := connect(base+"&sslmode=verify-full&sslrootcert="+bundle, ca.Pool()); err == nil || !strings.Contains(err.Error(), "unknown authority") {
		t.Errorf("verify-full with its own sslrootcert (another CA): %v, want unknown authority: the URL's bundle is kept", err)
	}
	// require verifies nothing, and is not made to.
	if hosts, _ := db.SystemRootHosts(base + "&sslmode=require"); len(hosts) != 0 {
		t.Errorf("SystemRootHosts under require = %v, want none", hosts)
	}
	if err := connect(base+"&sslmode=require", other.Pool()); err != nil && strings.Contains(err.Error(), "certificate") {
		t.Errorf("require with roots given: %v; it must stay unverified", err)
	}
}
