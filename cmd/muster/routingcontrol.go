package main

import (
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/musterhq/muster/internal/routingcontrol"
)

// routingControlFlags adds --routing-control and --routing-control-ca;
// apply reads them (a flag wins over its MUSTER_ROUTING_CONTROL*
// variable) and MUSTER_ROUTING_CONTROL_INTERVAL into c.
func routingControlFlags(fs *flag.FlagSet) (apply func(c *Config) error) {
	var spec, ca string
	fs.StringVar(&spec, "routing-control", "", "where to read the out-of-band region routing controls: file:/PATH (JSON, or YAML by .yaml/.yml), https://HOST/PATH or dns:NAME[@HOST:PORT] (MUSTER_ROUTING_CONTROL; docs/routing-control.md)")
	fs.StringVar(&ca, "routing-control-ca", "", "CA bundle to trust for an https:// routing control (MUSTER_ROUTING_CONTROL_CA; default: the system's roots)")
	return func(c *Config) error {
		c.RoutingControl = cmpOr(spec, os.Getenv("MUSTER_ROUTING_CONTROL"))
		c.RoutingControlCA = cmpOr(ca, os.Getenv("MUSTER_ROUTING_CONTROL_CA"))
		c.RoutingControlInterval = routingcontrol.DefaultInterval
		if v := os.Getenv("MUSTER_ROUTING_CONTROL_INTERVAL"); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil || d < 100*time.Millisecond {
				return fmt.Errorf("MUSTER_ROUTING_CONTROL_INTERVAL %q: want a duration of at least 100ms, e.g. 5s", v)
			}
			c.RoutingControlInterval = d
		}
		if c.RoutingControl == "" && c.RoutingControlCA != "" {
			return fmt.Errorf("--routing-control-ca (MUSTER_ROUTING_CONTROL_CA) is set without --routing-control")
		}
		return nil
	}
}

// routingControlConfig builds the routing controls' configuration from
// c: nil without --routing-control; an error for a malformed source.
func routingControlConfig(c Config) (*routingcontrol.Config, error) {
	if c.RoutingControl == "" {
		return nil, nil
	}
	src, err := routingcontrol.ParseSource(c.RoutingControl, c.RoutingControlCA, min(routingcontrol.DefaultTimeout, c.RoutingControlInterval))
	if err != nil {
		return nil, fmt.Errorf("--routing-control: %w", err)
	}
	return &routingcontrol.Config{Source: src, Interval: c.RoutingControlInterval}, nil
}
