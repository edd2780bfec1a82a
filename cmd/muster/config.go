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
	"github.com/musterhq/muster/registry"
	"github.com/musterhq/muster/webui"
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
	// UI configures the admin web UI's sign-in for `muster serve`
	// (MUSTER_UI_*); the UI is off when UI.IssuerURL is empty. `muster
	// dev` signs in through its built-in issuer instead.
	UI webui.OIDCConfig
	// UIInsecureCookie drops the session cookie's Secure attribute
	// (MUSTER_UI_INSECURE_COOKIE=1), for plain-http development only.
	UIInsecureCookie bool
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
	c.UI = webui.OIDCConfig{
		IssuerURL:   os.Getenv("MUSTER_UI_ISSUER"),
		ClientID:    os.Getenv("MUSTER_UI_CLIENT_ID"),
		RedirectURL: os.Getenv("MUSTER_UI_REDIRECT_URL"),
		RoleClaim:   os.Getenv("MUSTER_UI_ROLE_CLAIM"),
		TeamClaim:   os.Getenv("MUSTER_UI_TEAM_CLAIM"),
	}
	if c.UI.ClientSecret, err = secretEnv("MUSTER_UI_CLIENT_SECRET"); err != nil {
		return err
	}
	c.UIInsecureCookie = os.Getenv("MUSTER_UI_INSECURE_COOKIE") == "1"
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
		if c.UI.IssuerURL != "" && (c.UI.ClientID == "" || c.UI.RedirectURL == "") {
			return errors.New("the web UI (MUSTER_UI_ISSUER) needs MUSTER_UI_CLIENT_ID and MUSTER_UI_REDIRECT_URL too")
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
