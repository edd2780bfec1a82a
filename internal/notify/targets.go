package notify

import (
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Target kinds.
const (
	// KindAlertmanager posts to Alertmanager's v2 alerts API: URL is the
	// Alertmanager's base (https://am.example:9093), /api/v2/alerts is
	// appended.
	KindAlertmanager = "alertmanager"
	// KindWebhook posts a JSON body ({"status", "alerts": […]}) to URL as
	// given.
	KindWebhook = "webhook"
)

// PlatformTeam is the team label of an alarm no team owns, and the name
// of the platform's target in metrics and logs.
const PlatformTeam = "platform"

// Target is where one team's alarms go.
type Target struct {
	// URL may carry credentials (user:password@, a token in the query):
	// only its host is logged.
	URL string `json:"url,omitempty" yaml:"url,omitempty"`
	// URLs, instead of URL, name every member of a highly available
	// Alertmanager cluster. Each alert is posted to every member, as
	// Prometheus does, and the cluster deduplicates: one member down or
	// slow does not hold up the others, since each has its own queue and
	// retries.
	URLs []string `json:"urls,omitempty" yaml:"urls,omitempty"`
	// Kind is KindAlertmanager (the default) or KindWebhook.
	Kind string `json:"kind,omitempty" yaml:"kind,omitempty"`
	// CAFile is a PEM file of the CAs the target's certificate must chain
	// to, replacing the system roots for this target (as Prometheus'
	// tls_config.ca_file does): an Alertmanager behind the cluster's own
	// CA. Read when the targets are loaded.
	CAFile string `json:"ca_file,omitempty" yaml:"ca_file,omitempty"`

	// roots is CAFile's pool, loaded by LoadTargets (or by Validate).
	roots *x509.CertPool
}

// members are the target's URLs: URL alone, or URLs.
func (t Target) members() []string {
	if t.URL != "" {
		return []string{t.URL}
	}
	return t.URLs
}

// Targets maps the owning teams to their targets, with the platform's,
// which receives every alarm.
type Targets struct {
	Platform *Target           `json:"platform,omitempty" yaml:"platform,omitempty"`
	Teams    map[string]Target `json:"teams,omitempty" yaml:"teams,omitempty"`
}

// Empty reports whether no target is configured.
func (t Targets) Empty() bool { return t.Platform == nil && len(t.Teams) == 0 }

// Validate checks every target's URL and kind.
func (t Targets) Validate() error {
	var errs []error
	if t.Platform != nil {
		errs = append(errs, t.Platform.validate(PlatformTeam))
	}
	for _, team := range slices.Sorted(maps.Keys(t.Teams)) {
		if team == "" || team == PlatformTeam {
			errs = append(errs, fmt.Errorf("team %q: name the platform's target platform:, not under teams", team))
			continue
		}
		errs = append(errs, t.Teams[team].validate(team))
	}
	return errors.Join(errs...)
}

func (t Target) validate(name string) error {
	switch {
	case t.URL != "" && len(t.URLs) > 0:
		return fmt.Errorf("target %s: give url or urls, not both", name)
	case t.URL == "" && len(t.URLs) == 0:
		return fmt.Errorf("target %s: no url", name)
	case len(t.URLs) > maxMembers:
		return fmt.Errorf("target %s: %d urls; at most %d", name, len(t.URLs), maxMembers)
	}
	hosts := map[string]bool{}
	for i, raw := range t.members() {
		u, err := url.Parse(raw)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			// The URL is not repeated: it may carry a token.
			if len(t.URLs) > 0 {
				return fmt.Errorf("target %s: urls[%d] is not an http:// or https:// URL", name, i)
			}
			return fmt.Errorf("target %s: url is not an http:// or https:// URL", name)
		}
		if hosts[u.Host] {
			return fmt.Errorf("target %s: urls name %s twice (each member once)", name, u.Host)
		}
		hosts[u.Host] = true
	}
	if t.Kind != "" && t.Kind != KindAlertmanager && t.Kind != KindWebhook {
		return fmt.Errorf("target %s: kind %q: want %s or %s", name, t.Kind, KindAlertmanager, KindWebhook)
	}
	return nil
}

// maxMembers bounds an Alertmanager set: each member is a queue.
const maxMembers = 16

// loadCA reads CAFile into roots.
func (t *Target) loadCA(name string) error {
	if t.CAFile == "" || t.roots != nil {
		return nil
	}
	b, err := os.ReadFile(t.CAFile)
	if err != nil {
		return fmt.Errorf("target %s: ca_file: %w", name, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return fmt.Errorf("target %s: ca_file %s holds no PEM certificate", name, t.CAFile)
	}
	t.roots = pool
	return nil
}

// endpoint is the URL posted to for member raw.
func (t Target) endpoint(raw string) string {
	if t.Kind == KindWebhook {
		return raw
	}
	u, err := url.Parse(raw)
	if err != nil {
		return raw
	}
	u.Path = strings.TrimSuffix(u.Path, "/") + "/api/v2/alerts"
	return u.String()
}

// hostOf is a member's host, all that is logged of it.
func hostOf(raw string) string {
	if u, err := url.Parse(raw); err == nil {
		return u.Host
	}
	return "?"
}

// LoadTargets reads a targets file: YAML by a .yaml or .yml name, JSON
// otherwise, e.g.
//
//	platform:
//	  urls: ["https://am-0.monitoring:9093", "https://am-1.monitoring:9093"]
//	  ca_file: /etc/muster/alertmanager-ca.pem
//	teams:
//	  payments: {url: "https://alertmanager.payments:9093"}
//	  search:   {url: "https://hooks.example/muster?token=…", kind: webhook}
func LoadTargets(path string) (Targets, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Targets{}, fmt.Errorf("read alert targets: %w", err)
	}
	var t Targets
	switch strings.ToLower(filepath.Ext(path)) {
	case ".yaml", ".yml":
		dec := yaml.NewDecoder(strings.NewReader(string(b)))
		dec.KnownFields(true)
		err = dec.Decode(&t)
	default:
		dec := json.NewDecoder(strings.NewReader(string(b)))
		dec.DisallowUnknownFields()
		err = dec.Decode(&t)
	}
	if err != nil {
		return Targets{}, fmt.Errorf("parse alert targets %s: %w", path, err)
	}
	if t.Empty() {
		return Targets{}, fmt.Errorf("alert targets %s: no platform target and no team's", path)
	}
	if err := t.Validate(); err != nil {
		return Targets{}, fmt.Errorf("alert targets %s: %w", path, err)
	}
	if err := t.loadCAs(); err != nil {
		return Targets{}, fmt.Errorf("alert targets %s: %w", path, err)
	}
	return t, nil
}

// loadCAs reads every target's CAFile.
func (t *Targets) loadCAs() error {
	if t.Platform != nil {
		if err := t.Platform.loadCA(PlatformTeam); err != nil {
			return err
		}
	}
	for _, team := range slices.Sorted(maps.Keys(t.Teams)) {
		tt := t.Teams[team]
		if err := tt.loadCA(team); err != nil {
			return err
		}
		t.Teams[team] = tt
	}
	return nil
}
