package dnszone_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/musterhq/muster/internal/dnszone"
	"github.com/musterhq/muster/internal/testbin"
	"github.com/musterhq/muster/internal/wait"
)

const keyName = "muster-xfr."

func newSecret(t *testing.T) string {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return base64.StdEncoding.EncodeToString(b)
}

// freePort finds a port free on 127.0.0.1 for both TCP and UDP.
func freePort(t *testing.T) int {
	t.Helper()
	// Drawn below Linux's ephemeral range (32768 up): a port the kernel
	// hands out can go to any outgoing connection of the tests running
	// beside this one before named binds it.
	for range 100 {
		port := 20000 + mrand.IntN(12000)
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			continue // taken: draw again
		}
		pc, err := net.ListenPacket("udp", addr)
		ln.Close()
		if err == nil {
			pc.Close()
			return port
		}
	}
	t.Fatal("no loopback port free for TCP and UDP below the ephemeral range in 100 draws")
	return 0
}

// syncBuffer is named's log, written by its process and read by the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// startNamed runs Debian's named as a secondary of muster's zone on
// 127.0.0.1:port, transferring with the TSIG key, until the test ends.
func startNamed(t *testing.T, port int, primary string, secret string) *syncBuffer {
	t.Helper()
	bin := testbin.Require(t, "named")
	dir := t.TempDir()
	host, pport, _ := net.SplitHostPort(primary)
	conf := fmt.Sprintf(`options {
	directory %[1]q;
	pid-file %[7]q;
	session-keyfile %[8]q;
	listen-on port %[2]d { 127.0.0.1; };
	listen-on-v6 { none; };
	recursion no;
	notify no;
	dnssec-validation no;
};
controls { };
key %[3]q { algorithm hmac-sha256; secret %[4]q; };
zone "muster.internal" {
	type secondary;
	primaries { %[5]s port %[6]s key %[3]q; };
	file %[9]q;
	masterfile-format text;
};
`, dir, port, strings.TrimSuffix(keyName, "."), secret, host, pport,
		filepath.Join(dir, "named.pid"), filepath.Join(dir, "session.key"), filepath.Join(dir, "muster.internal.db"))
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
		if t.Failed() || os.Getenv("MUSTER_TEST_NAMED_LOG") != "" {
			t.Logf("named's log:\n%s", log.String())
		}
	})
	return log
}

// TestSecondaryFollowsByNotifyAndIXFR: a real named, configured as a
// secondary with the TSIG key, takes the zone by AXFR, then follows a
// change by NOTIFY and IXFR; an unsigned transfer, one signed from an
// address that is not a secondary, and one with a wrong key are refused
// and counted.
func TestSecondaryFollowsByNotifyAndIXFR(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs named for a few seconds")
	}
	testbin.Require(t, "named")
	secret := newSecret(t)
	namedPort := freePort(t)
	e := newEnv(t, dnszone.Config{Zone: zoneName, TSIGKeyName: keyName, TSIGSecret: secret,
		Secondaries: []netip.AddrPort{netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(namedPort))}})
	e.register(t, "az1", "10.0.1.1", "10.0.1.2")
	e.publish(t)
	wait.For(t, 2*time.Second, "api in muster's zone", func() bool {
		return len(e.exchange(t, "api."+zoneName, dns.TypeA, "udp", 0).Answer) == 2
	})

	log := startNamed(t, namedPort, e.addr, secret)
	np := strconv.Itoa(namedPort)
	atNamed := func(name string) []string {
		m := new(dns.Msg)
		m.SetQuestion(name, dns.TypeA)
		r, _, err := (&dns.Client{Timeout: time.Second}).Exchange(m, "127.0.0.1:"+np)
		if err != nil || r.Rcode != dns.RcodeSuccess {
			return nil
		}
		var out []string
		for _, rr := range r.Answer {
			if a, ok := rr.(*dns.A); ok {
				out = append(out, a.A.String())
			}
		}
		slices.Sort(out)
		return out
	}
	wait.For(t, 20*time.Second, "named serving the zone it transferred", func() bool {
		return slices.Equal(atNamed("api."+zoneName), []string{"10.0.1.1", "10.0.1.2"})
	})
	// named may answer from the zone a moment before it logs the transfer.
	wait.For(t, 5*time.Second, "named logging a successful transfer", func() bool {
		return strings.Contains(log.String(), "Transfer status: success")
	})
	if out := dig(t, np, "+short", "SOA", zoneName); !strings.Contains(out, strconv.FormatUint(uint64(e.s.DNS.Serial()), 10)) {
		t.Errorf("named's SOA %q, muster's serial %d", out, e.s.DNS.Serial())
	}

	// A change: named hears of it by NOTIFY and takes it by IXFR.
	e.register(t, "az2", "10.0.2.1")
	e.publish(t)
	wait.For(t, 10*time.Second, "named following the change", func() bool {
		return slices.Equal(atNamed("api."+zoneName), []string{"10.0.1.1", "10.0.1.2", "10.0.2.1"})
	})
	if got := atNamed("az2.api." + zoneName); !slices.Equal(got, []string{"10.0.2.1"}) {
		t.Errorf("named, az2.api: %v", got)
	}
	// muster counts a transfer once it has written it, which may be a
	// moment after named has applied it.
	for _, want := range []string{`muster_dns_transfers_total{kind="axfr",result="full"}`, `muster_dns_transfers_total{kind="ixfr",result="incremental"}`,
		`muster_dns_notifies_total{result="acknowledged"}`} {
		wait.For(t, 5*time.Second, "metric "+want, func() bool { return strings.Contains(string(e.s.Scrape(t)), want) })
	}
	if !strings.Contains(log.String(), "received notify for zone 'muster.internal': TSIG 'muster-xfr'") {
		t.Errorf("named's log shows no signed NOTIFY:\n%s", log.String())
	}

	// Transfers to anyone else are refused.
	key := "hmac-sha256:" + strings.TrimSuffix(keyName, ".") + ":" + secret
	if out := e.dig(t, "AXFR", zoneName); !strings.Contains(out, "Transfer failed") {
		t.Errorf("unsigned AXFR:\n%s", out)
	}
	if out := e.dig(t, "-b", "127.0.0.2", "-y", key, "AXFR", zoneName); !strings.Contains(out, "Transfer failed") {
		t.Errorf("AXFR signed from 127.0.0.2 (not a secondary):\n%s", out)
	}
	wrong := "hmac-sha256:" + strings.TrimSuffix(keyName, ".") + ":" + newSecret(t)
	if out := e.dig(t, "-y", wrong, "AXFR", zoneName); strings.Contains(out, "10.0.1.1") {
		t.Errorf("AXFR with a wrong key got records:\n%s", out)
	}
	if out := e.dig(t, "+tcp", "IXFR=1", zoneName); !strings.Contains(out, "Transfer failed") {
		t.Errorf("unsigned IXFR:\n%s", out)
	}
	// The secondary's own key from its own address works (dig as named).
	if out := e.dig(t, "-y", key, "AXFR", zoneName); !strings.Contains(out, "10.0.2.1") || !strings.Contains(out, "_api._tcp."+zoneName) {
		t.Errorf("AXFR as the secondary:\n%s", out)
	}
	metrics := string(e.s.Scrape(t))
	if !strings.Contains(metrics, `muster_dns_transfers_total{kind="axfr",result="refused"} 3`) ||
		!strings.Contains(metrics, `muster_dns_transfers_total{kind="ixfr",result="refused"} 1`) {
		t.Errorf("refused transfers not counted:\n%s", grepLines(metrics, "muster_dns_transfers_total"))
	}
}

func grepLines(s, sub string) string {
	var out []string
	for l := range strings.SplitSeq(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
