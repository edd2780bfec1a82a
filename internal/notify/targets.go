package notify

import (
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
	// CA is a PEM bundle file the target's https certificate must chain
	// to, instead of the system roots (an Alertmanager behind a private
	// CA). It is read again when it changes; a bundle that no longer
	// loads keeps the last good one. A relative path in a targets file is
	// the file's folder's.
	CA string `json:"ca,omitempty" yaml:"ca,omitempty"`
}

// members are the target's URLs: URL alone, or URLs.
func (t Target) members() []string {
	if t.URL != "" {
		return []string{t.URL}
	}
	return t.URLs
}

// maxMembers bounds an Alertmanager set: each member is a queue.
const maxMembers = 16

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
		if t.CA != "" && u.Scheme != "https" {
			return fmt.Errorf("target %s: ca is for an https:// URL", name)
		}
	}
	if t.Kind != "" && t.Kind != KindAlertmanager && t.Kind != KindWebhook {
		return fmt.Errorf("target %s: kind %q: want %s or %s", name, t.Kind, KindAlertmanager, KindWebhook)
	}
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
//	  ca: alertmanager-ca.pem
//	teams:
//	  payments: {url: "https://alertmanager.payments:9093"}
//	  search:   {url: "https://hooks.example/muster?token=…", kind: webhook}
//	  batch:    {url: "https://alertmanager.batch:9093", ca: batch-ca.pem}
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
	rel := func(tg *Target) {
		if tg.CA != "" && !filepath.IsAbs(tg.CA) {
			tg.CA = filepath.Join(filepath.Dir(path), tg.CA)
		}
	}
	if t.Platform != nil {
		rel(t.Platform)
	}
	for name, tg := range t.Teams {
		rel(&tg)
		t.Teams[name] = tg
	}
	if err := t.Validate(); err != nil {
		return Targets{}, fmt.Errorf("alert targets %s: %w", path, err)
	}
	return t, nil
}
