package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/musterhq/muster/internal/dnszone"
	"github.com/musterhq/muster/internal/stream"
)

// devDNSAddr is where muster dev serves its DNS zone unless told otherwise.
const devDNSAddr = "127.0.0.1:8053"

// dnsFlags are the DNS zone's flags; each falls back to its MUSTER_DNS_*
// variable.
type dnsFlags struct {
	addr, zone, services, secondaries, keyName, ttl string
}

func addDNSFlags(fs *flag.FlagSet, dev bool) *dnsFlags {
	f := &dnsFlags{}
	def := "off unless given"
	if dev {
		def = devDNSAddr + `; "" for none`
	}
	fs.StringVar(&f.addr, "dns-addr", "", "serve the authoritative DNS zone on this address, UDP and TCP (MUSTER_DNS_ADDR; "+def+")")
	fs.StringVar(&f.zone, "dns-zone", "", "the DNS zone muster is authoritative for (MUSTER_DNS_ZONE; default "+dnszone.DefaultZone+")")
	fs.StringVar(&f.services, "dns-services", "", `services the DNS zone serves, comma-separated, or "*" for all; DNS carries no identity, so anybody who reaches --dns-addr can resolve these (MUSTER_DNS_SERVICES; required with --dns-addr under serve, "*" in dev)`)
	fs.StringVar(&f.secondaries, "dns-secondaries", "", "secondaries (IP[:port], comma-separated) sent NOTIFY and allowed AXFR/IXFR with the TSIG key (MUSTER_DNS_SECONDARIES)")
	fs.StringVar(&f.keyName, "dns-tsig-key", "", "name of the hmac-sha256 TSIG key of zone transfers; its base64 secret comes from MUSTER_DNS_TSIG_SECRET or MUSTER_DNS_TSIG_SECRET_FILE (MUSTER_DNS_TSIG_KEY)")
	fs.StringVar(&f.ttl, "dns-ttl", "", "TTL of the zone's records and of negative answers (MUSTER_DNS_TTL; default 5s)")
	return f
}

// config is the DNS zone's configuration, or nil when DNS is off. Flags
// win over the environment.
func (f *dnsFlags) config(fs *flag.FlagSet, dev bool) (*dnszone.Config, error) {
	given := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { given[fl.Name] = true })
	pick := func(flagName, val, env string) string {
		if given[flagName] {
			return val
		}
		return os.Getenv(env)
	}
	addr := pick("dns-addr", f.addr, "MUSTER_DNS_ADDR")
	_, addrSet := os.LookupEnv("MUSTER_DNS_ADDR")
	explicit := given["dns-addr"] || addrSet
	if dev && !explicit {
		addr = devDNSAddr
	}
	if addr == "" {
		return nil, nil
	}
	c := &dnszone.Config{Addr: addr, Zone: pick("dns-zone", f.zone, "MUSTER_DNS_ZONE"),
		TSIGKeyName: pick("dns-tsig-key", f.keyName, "MUSTER_DNS_TSIG_KEY"),
		// muster dev's default address may be taken by another muster dev.
		Optional: dev && !explicit}
	services := pick("dns-services", f.services, "MUSTER_DNS_SERVICES")
	if services == "" && dev {
		services = dnszone.AllServices
	}
	if services == "" {
		return nil, errors.New(`--dns-addr needs --dns-services (or MUSTER_DNS_SERVICES): the services DNS may serve, or "*" for all; DNS carries no identity`)
	}
	for s := range strings.SplitSeq(services, ",") {
		if s = strings.TrimSpace(s); s != "" {
			c.Services = append(c.Services, s)
		}
	}
	var err error
	if c.Secondaries, err = dnszone.ParseSecondaries(pick("dns-secondaries", f.secondaries, "MUSTER_DNS_SECONDARIES")); err != nil {
		return nil, fmt.Errorf("--dns-secondaries: %w", err)
	}
	if c.TSIGSecret, err = secretEnv("MUSTER_DNS_TSIG_SECRET"); err != nil {
		return nil, err
	}
	if v := pick("dns-ttl", f.ttl, "MUSTER_DNS_TTL"); v != "" {
		if c.TTL, err = time.ParseDuration(v); err != nil {
			return nil, fmt.Errorf("--dns-ttl: %w", err)
		}
	}
	// Checked here so a bad setting fails at start with its name; app
	// fills in the hub.
	probe := *c
	probe.Services = append([]string(nil), c.Services...)
	probe.Hub = stream.NewHub(stream.Config{})
	if err := probe.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}
