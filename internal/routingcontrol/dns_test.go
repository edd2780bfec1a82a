package routingcontrol

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/musterhq/muster/internal/testbin"
	"github.com/musterhq/muster/internal/wait"
)

// freePort finds a port free on 127.0.0.1 for both TCP and UDP, below
// Linux's ephemeral range (as internal/dnszone's tests do).
func freePort(t *testing.T) int {
	t.Helper()
	for range 100 {
		port := 20000 + rand.IntN(12000)
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			continue
		}
		pc, err := net.ListenPacket("udp", addr)
		ln.Close()
		if err == nil {
			pc.Close()
			return port
		}
	}
	t.Fatal("no loopback port free for TCP and UDP")
	return 0
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}
func (b *syncBuffer) String() string { b.mu.Lock(); defer b.mu.Unlock(); return b.b.String() }

// startNamed runs Debian's named on 127.0.0.1:port, authoritative for
// example.org with the records given, until the test ends.
func startNamed(t *testing.T, port int, records string) {
	t.Helper()
	bin := testbin.Require(t, "named")
	dir := t.TempDir()
	zone := `$TTL 5
@ IN SOA ns.example.org. hostmaster.example.org. 1 60 60 600 5
@ IN NS ns.example.org.
ns IN A 127.0.0.1
` + records
	if err := os.WriteFile(filepath.Join(dir, "example.org.db"), []byte(zone), 0o600); err != nil {
		t.Fatal(err)
	}
	conf := fmt.Sprintf(`options {
	directory %[1]q;
	pid-file %[3]q;
	session-keyfile %[4]q;
	listen-on port %[2]d { 127.0.0.1; };
	listen-on-v6 { none; };
	recursion no;
	notify no;
	dnssec-validation no;
};
controls { };
zone "example.org" { type primary; file %[5]q; };
`, dir, port, filepath.Join(dir, "named.pid"), filepath.Join(dir, "session.key"), filepath.Join(dir, "example.org.db"))
	path := filepath.Join(dir, "named.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, "-g", "-4", "-n", "1", "-c", path)
	log := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = log, log
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatalf("start named: %v", err)
	}
	t.Cleanup(func() {
		cancel()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("named's log:\n%s", log.String())
		}
	})
}

// TestDNSSource: the TXT record set of a real named on loopback; a
// malformed record and a missing name fail static; a record too large
// for UDP is read over TCP.
func TestDNSSource(t *testing.T) {
	t.Parallel()
	testbin.Require(t, "named")
	port := freePort(t)
	var big strings.Builder
	for i := range 40 {
		fmt.Fprintf(&big, " \"region-%02d-with-a-long-name-to-fill-the-answer=on\"", i)
	}
	startNamed(t, port, `_muster-routing IN TXT "us-east-1=on" "eu-west-1=off"
_muster-routing IN TXT "ap-south-1=on"
broken IN TXT "us-east-1=down"
big IN TXT`+big.String()+"\n")
	server := "127.0.0.1:" + strconv.Itoa(port)
	src, err := ParseSource("dns:_muster-routing.example.org@"+server, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var got Reading
	wait.For(t, 20*time.Second, "named answering", func() bool {
		got, err = src.Read(ctx, "")
		return err == nil
	})
	if d := cmp.Diff(map[string]State{"us-east-1": On, "eu-west-1": Off, "ap-south-1": On}, got.Regions); d != "" {
		t.Errorf("controls (-want +got):\n%s", d)
	}

	c, clock := newControls(t, src, nil, nil)
	c.RunOnce(ctx)
	if c.On("eu-west-1") || !c.On("us-east-1") {
		t.Fatalf("after reading the record: %+v", c.Status())
	}
	// The source now points at a malformed record, then a missing one:
	// the controls in force stay.
	c.cfg.Source = &DNSSource{Name: "broken.example.org", Server: server}
	clock.Advance(5 * time.Second)
	c.RunOnce(ctx)
	if c.On("eu-west-1") || !strings.HasPrefix(c.Status().LastError, ReasonMalformed+":") {
		t.Fatalf("malformed record: %+v", c.Status())
	}
	if _, err := (&DNSSource{Name: "nothing.example.org", Server: server}).Read(ctx, ""); ReasonOf(err) != ReasonMissing {
		t.Errorf("a missing name: %v", err)
	}
	bigRead, err := (&DNSSource{Name: "big.example.org", Server: server}).Read(ctx, "")
	if err != nil || len(bigRead.Regions) != 40 {
		t.Errorf("a record set larger than a UDP answer: %d regions, %v", len(bigRead.Regions), err)
	}
	// Nobody listening: unreachable or timeout, within the deadline.
	dead := &DNSSource{Name: "_muster-routing.example.org", Server: "127.0.0.1:" + strconv.Itoa(freePort(t))}
	rctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	if _, err := dead.Read(rctx, ""); err == nil {
		t.Error("read from a port nobody serves")
	}
}
