package main

import (
	"flag"
	"fmt"
	"log/slog"
	"net"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/musterhq/muster/internal/proxied"
)

// proxyProtocolFlag adds --proxy-protocol-from to fs; apply puts what it
// was given into cfg, over MUSTER_PROXY_PROTOCOL_FROM.
func proxyProtocolFlag(fs *flag.FlagSet) (apply func(*Config) error) {
	var from string
	fs.StringVar(&from, "proxy-protocol-from", "", "comma-separated networks (CIDR) of the load balancers in front of the API and xDS listeners: their connections must open with a PROXY protocol v1/v2 header, whose source address is then the client's; a header from anywhere else is refused (MUSTER_PROXY_PROTOCOL_FROM; docs/production.md)")
	return func(c *Config) error {
		if from == "" {
			return nil
		}
		nets, err := proxied.ParseNetworks(from)
		if err != nil {
			return fmt.Errorf("--proxy-protocol-from: %w", err)
		}
		c.ProxyProtocolFrom = nets
		return nil
	}
}

// proxyProtocol wraps the API listener ln, as it comes from net.Listen,
// to read PROXY protocol headers from cfg.ProxyProtocolFrom
// (internal/proxied); without networks it returns ln as it is and no
// metrics. The header comes first on the wire: a TLS listener, when there
// is one, goes around the returned one. The metrics (refusals by reason)
// are for the app's registry, which does not exist yet.
func proxyProtocol(cfg Config, ln net.Listener, log *slog.Logger) (net.Listener, prometheus.Collector, error) {
	return proxyProtocolOn("api", cfg, ln, log)
}

// proxyProtocolOn is proxyProtocol for the listener named name ("api",
// "xds"): the load balancer that fronts the API fronts xDS too (one NLB,
// one target group attribute), so both read headers from the same
// networks, and the metric's listener label tells their refusals apart.
func proxyProtocolOn(name string, cfg Config, ln net.Listener, log *slog.Logger) (net.Listener, prometheus.Collector, error) {
	if len(cfg.ProxyProtocolFrom) == 0 {
		return ln, nil, nil
	}
	pln, err := proxied.Wrap(ln, proxied.Config{From: cfg.ProxyProtocolFrom, Listener: name})
	if err != nil {
		return nil, nil, err
	}
	log.Info("PROXY protocol required from the load balancers' networks, refused from others", "listener", name, "from", cfg.ProxyProtocolFrom)
	return pln, pln, nil
}
