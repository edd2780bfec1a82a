package main

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/musterhq/muster/identity"
	"github.com/musterhq/muster/policy"
	"github.com/musterhq/muster/registry"
)

// Config is everything muster reads from its environment and flags, parsed
// once here and passed down explicitly.
type Config struct {
	Addr        string
	DebugAddr   string // pprof listener; empty: none
	DataDir     string // dev: cluster, issuer key; empty for serve
	DatabaseURL string
	Region      string
	Issuers     []identity.IssuerConfig
	LeaseTTL    time.Duration
	LogLevel    slog.Level
	Dev         bool
	// AdmissionFloor is the least number of watch (re)subscriptions
	// admitted per admission window (MUSTER_ADMISSION_FLOOR, 50).
	AdmissionFloor int
	// Policy limits: MUSTER_OVERRIDE_LIMIT ("5/10m": attempts per actor
	// per service), MUSTER_WRITE_LIMIT ("60/1m": policy writes per actor per
	// family), MUSTER_OVERRIDE_MAX_EXPIRY (24h), MUSTER_COSIGN_WINDOW (5m).
	OverrideLimit policy.Limit
	WriteLimit    policy.Limit
	MaxExpiry     time.Duration
	CosignWindow  time.Duration
}

// parseLimit reads "N/duration", e.g. "5/10m".
func parseLimit(name, v string) (policy.Limit, error) {
	n, d, ok := strings.Cut(v, "/")
	if !ok {
		return policy.Limit{}, fmt.Errorf("%s %q: want attempts/window, e.g. 5/10m", name, v)
	}
	max, err := strconv.Atoi(strings.TrimSpace(n))
	if err != nil {
		return policy.Limit{}, fmt.Errorf("%s: %w", name, err)
	}
	win, err := time.ParseDuration(strings.TrimSpace(d))
	if err != nil {
		return policy.Limit{}, fmt.Errorf("%s: %w", name, err)
	}
	l := policy.Limit{Max: max, Window: win}
	if err := l.Validate(); err != nil {
		return policy.Limit{}, fmt.Errorf("%s: %w", name, err)
	}
	return l, nil
}

// loadEnv fills what the environment says. Secrets may come from *_FILE.
func loadEnv(c *Config) error {
	var err error
	if c.DatabaseURL, err = secretEnv("DATABASE_URL"); err != nil {
		return err
	}
	c.Region = envOr("MUSTER_REGION", "local")
	aud := envOr("MUSTER_AUDIENCE", "muster")
	for _, u := range strings.Split(os.Getenv("MUSTER_ISSUERS"), ",") {
		if u = strings.TrimSpace(u); u != "" {
			c.Issuers = append(c.Issuers, identity.IssuerConfig{URL: u, Audience: aud})
		}
	}
	c.LeaseTTL = registry.DefaultLeaseTTL
	if v := os.Getenv("MUSTER_LEASE_TTL"); v != "" {
		if c.LeaseTTL, err = time.ParseDuration(v); err != nil {
			return fmt.Errorf("MUSTER_LEASE_TTL: %w", err)
		}
	}
	c.AdmissionFloor = 50
	if v := os.Getenv("MUSTER_ADMISSION_FLOOR"); v != "" {
		if c.AdmissionFloor, err = strconv.Atoi(v); err != nil {
			return fmt.Errorf("MUSTER_ADMISSION_FLOOR: %w", err)
		}
	}
	c.OverrideLimit = policy.Limit{Max: policy.DefaultOverrideMax, Window: policy.DefaultOverrideWindow}
	if v := os.Getenv("MUSTER_OVERRIDE_LIMIT"); v != "" {
		if c.OverrideLimit, err = parseLimit("MUSTER_OVERRIDE_LIMIT", v); err != nil {
			return err
		}
	}
	c.WriteLimit = policy.Limit{Max: policy.DefaultWriteMax, Window: policy.DefaultWriteWindow}
	if v := os.Getenv("MUSTER_WRITE_LIMIT"); v != "" {
		if c.WriteLimit, err = parseLimit("MUSTER_WRITE_LIMIT", v); err != nil {
			return err
		}
	}
	c.MaxExpiry, c.CosignWindow = policy.DefaultMaxExpiry, policy.DefaultCosignWindow
	if v := os.Getenv("MUSTER_OVERRIDE_MAX_EXPIRY"); v != "" {
		if c.MaxExpiry, err = time.ParseDuration(v); err != nil {
			return fmt.Errorf("MUSTER_OVERRIDE_MAX_EXPIRY: %w", err)
		}
	}
	if v := os.Getenv("MUSTER_COSIGN_WINDOW"); v != "" {
		if c.CosignWindow, err = time.ParseDuration(v); err != nil {
			return fmt.Errorf("MUSTER_COSIGN_WINDOW: %w", err)
		}
	}
	if v := os.Getenv("MUSTER_LOG_LEVEL"); v != "" {
		if err := c.LogLevel.UnmarshalText([]byte(v)); err != nil {
			return fmt.Errorf("MUSTER_LOG_LEVEL: %w", err)
		}
	}
	return nil
}

// Validate checks the configuration for the command it will run.
func (c *Config) Validate() error {
	if c.Addr == "" {
		return errors.New("an address to listen on is required (--addr)")
	}
	if !registry.ValidName(c.Region) {
		return fmt.Errorf("MUSTER_REGION %q must be a DNS label", c.Region)
	}
	if c.AdmissionFloor <= 0 {
		return fmt.Errorf("MUSTER_ADMISSION_FLOOR %d must be above 0", c.AdmissionFloor)
	}
	if c.LeaseTTL < time.Second {
		return fmt.Errorf("MUSTER_LEASE_TTL %s is below 1s", c.LeaseTTL)
	}
	if !c.Dev {
		if c.DatabaseURL == "" {
			return errors.New("muster serve needs DATABASE_URL (or DATABASE_URL_FILE); for a local database run `muster dev`")
		}
		if len(c.Issuers) == 0 {
			return errors.New("muster serve needs MUSTER_ISSUERS, the comma-separated OIDC issuer URLs whose tokens it accepts")
		}
	}
	return nil
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// secretEnv reads K, or the file named by K_FILE.
func secretEnv(k string) (string, error) {
	if f := os.Getenv(k + "_FILE"); f != "" {
		b, err := os.ReadFile(f)
		if err != nil {
			return "", fmt.Errorf("%s_FILE: %w", k, err)
		}
		return strings.TrimSpace(string(b)), nil
	}
	return os.Getenv(k), nil
}
