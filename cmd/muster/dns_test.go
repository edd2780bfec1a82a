package main

import (
	"io"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/musterhq/muster/internal/cli"
	"github.com/musterhq/muster/internal/dnszone"
	"github.com/musterhq/muster/internal/wait"
)

func dnsConfig(t *testing.T, dev bool, args ...string) (*dnszone.Config, error) {
	t.Helper()
	fs := cli.NewFlags("test", io.Discard)
	df := addDNSFlags(fs, dev)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return df.config(fs, dev)
}

// TestDNSFlags: DNS is off under serve unless --dns-addr is given, and
// then needs the served services named; dev serves every service on
// 127.0.0.1:8053 (best effort) unless told otherwise; bad settings fail
// at start naming the flag or field.
func TestDNSFlags(t *testing.T) {
	for _, k := range []string{"MUSTER_DNS_ADDR", "MUSTER_DNS_SERVICES", "MUSTER_DNS_TSIG_SECRET", "MUSTER_DNS_TSIG_SECRET_FILE", "MUSTER_DNS_ZONE"} {
		t.Setenv(k, "") // restored after the test
		os.Unsetenv(k)
	}
	if c, err := dnsConfig(t, false); c != nil || err != nil {
		t.Fatalf("serve without --dns-addr: %+v, %v; want DNS off", c, err)
	}
	if _, err := dnsConfig(t, false, "--dns-addr", ":8053"); err == nil || !strings.Contains(err.Error(), "--dns-services") {
		t.Fatalf("serve --dns-addr without --dns-services: %v", err)
	}
	c, err := dnsConfig(t, false, "--dns-addr", "127.0.0.1:5353", "--dns-services", "web, api", "--dns-zone", "Disco.Example", "--dns-ttl", "30s")
	if err != nil || c.Optional || c.Zone != "Disco.Example" || len(c.Services) != 2 || c.Services[1] != "api" || c.TTL.Seconds() != 30 {
		t.Fatalf("serve with flags: %+v, %v", c, err)
	}
	c, err = dnsConfig(t, true)
	if err != nil || c.Addr != devDNSAddr || !c.Optional || c.Services[0] != dnszone.AllServices {
		t.Fatalf("dev defaults: %+v, %v", c, err)
	}
	if c, err := dnsConfig(t, true, "--dns-addr", ""); c != nil || err != nil {
		t.Fatalf(`dev --dns-addr "": %+v, %v; want DNS off`, c, err)
	}
	if _, err := dnsConfig(t, false, "--dns-addr", ":53", "--dns-services", "*", "--dns-secondaries", "10.0.0.53"); err == nil || !strings.Contains(err.Error(), "TSIG") {
		t.Fatalf("secondaries without a TSIG key: %v", err)
	}
	t.Setenv("MUSTER_DNS_TSIG_SECRET", "MDEyMzQ1Njc4OWFiY2RlZg==")
	c, err = dnsConfig(t, false, "--dns-addr", ":53", "--dns-services", "*", "--dns-secondaries", "10.0.0.53,10.0.1.53:5300", "--dns-tsig-key", "muster-xfr")
	if err != nil || len(c.Secondaries) != 2 || c.Secondaries[0].Port() != 53 || c.TSIGSecret == "" {
		t.Fatalf("secondaries with a key: %+v, %v", c, err)
	}
	os.Unsetenv("MUSTER_DNS_TSIG_SECRET") // a secret without a key name is refused
	t.Setenv("MUSTER_DNS_ADDR", "127.0.0.1:9053")
	t.Setenv("MUSTER_DNS_SERVICES", "web")
	if c, err := dnsConfig(t, true); err != nil || c.Addr != "127.0.0.1:9053" || c.Optional || c.Services[0] != "web" {
		t.Fatalf("dev from the environment: %+v, %v", c, err)
	}
}

// TestDevServesDNS: muster dev (the binary's wiring, through app) serves
// the zone on the address given, answering for the zone it is
// authoritative for.
func TestDevServesDNS(t *testing.T) {
	t.Parallel()
	d := startDev(t, devDir(t), "--dns-addr", "127.0.0.1:0")
	m := regexp.MustCompile(`msg="dns zone serving" worker=dns addr=(\S+)`).FindStringSubmatch(d.stderr.String())
	if m == nil {
		t.Fatalf("no dns zone serving line:\n%s", d.stderr.String())
	}
	// Served once muster is ready (a fresh dev has no service: at once).
	var r *dns.Msg
	wait.For(t, 10*time.Second, "TXT _muster answered by muster dev", func() bool {
		q := new(dns.Msg)
		q.SetQuestion("_muster."+dnszone.DefaultZone, dns.TypeTXT)
		var err error
		r, _, err = (&dns.Client{Timeout: 3 * time.Second}).Exchange(q, m[1])
		return err == nil && r.Rcode == dns.RcodeSuccess
	})
	if !r.Authoritative || len(r.Answer) != 1 {
		t.Fatalf("TXT _muster from muster dev: %v", r)
	}
}
