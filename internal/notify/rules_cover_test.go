package notify_test

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	yaml "go.yaml.in/yaml/v3"
)

// runbooksFile is the runbook every rule's runbook_url points into; it
// also tables every alarm kind with the alert that covers it.
var runbooksFile = filepath.Join("..", "..", "docs", "runbooks.md")

const runbookBase = "https://github.com/musterhq/muster/blob/main/docs/runbooks.md#"

type alertRule struct {
	Alert       string            `yaml:"alert"`
	Expr        string            `yaml:"expr"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

func loadRules(t *testing.T) []alertRule {
	t.Helper()
	b, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Groups []struct {
			Rules []alertRule `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	var out []alertRule
	for _, g := range f.Groups {
		out = append(out, g.Rules...)
	}
	if len(out) == 0 {
		t.Fatal("no rules in " + rulesFile)
	}
	return out
}

// alarmKinds is the enum of the Alarm schema's kind in openapi.yaml: what
// GET /v1/alarms can list.
func alarmKinds(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "openapi", "openapi.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var spec struct {
		Components struct {
			Schemas map[string]struct {
				Properties map[string]struct {
					Enum []string `yaml:"enum"`
				} `yaml:"properties"`
			} `yaml:"schemas"`
		} `yaml:"components"`
	}
	if err := yaml.Unmarshal(b, &spec); err != nil {
		t.Fatal(err)
	}
	kinds := spec.Components.Schemas["Alarm"].Properties["kind"].Enum
	if len(kinds) < 40 {
		t.Fatalf("openapi.yaml's Alarm kind enum has %d kinds: the schema moved?", len(kinds))
	}
	return kinds
}

// kindMatchers are the rule's selectors on muster_alarms_open's kind, as
// anchored regular expressions (Prometheus's, RE2, are Go's).
var kindSelector = regexp.MustCompile(`muster_alarms_open\{kind(=~|=)"([^"]*)"\}`)

func kindMatchers(t *testing.T, r alertRule) []*regexp.Regexp {
	t.Helper()
	var out []*regexp.Regexp
	for _, m := range kindSelector.FindAllStringSubmatch(r.Expr, -1) {
		pat := m[2]
		if m[1] == "=" {
			pat = regexp.QuoteMeta(pat)
		}
		out = append(out, regexp.MustCompile("^(?:"+pat+")$"))
	}
	if strings.Contains(r.Expr, "muster_alarms_open") && len(out) == 0 {
		t.Errorf("%s reads muster_alarms_open without a plain kind selector this test understands: %s", r.Alert, r.Expr)
	}
	return out
}

// TestEveryAlarmKindHasAnAlert: every alarm kind GET /v1/alarms can list
// is covered by exactly one alert over muster_alarms_open, or has a line
// in docs/runbooks.md naming the alert that covers it from a metric of
// its own (which that alert reads); the runbook's table lists every kind
// and no other, with the alert that really matches it.
func TestEveryAlarmKindHasAnAlert(t *testing.T) {
	t.Parallel()
	rules := loadRules(t)
	byName := map[string][]alertRule{}
	for _, r := range rules {
		byName[r.Alert] = append(byName[r.Alert], r)
	}
	doc, err := os.ReadFile(runbooksFile)
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("(?m)^\\| `([a-z_]+)` \\| ([^|]+) \\|")
	table := map[string]string{}
	for _, m := range row.FindAllStringSubmatch(string(doc), -1) {
		table[m[1]] = m[2]
	}
	kinds := alarmKinds(t)
	for k := range table {
		if !slices.Contains(kinds, k) {
			t.Errorf("docs/runbooks.md lists alarm kind %s, which openapi.yaml does not", k)
		}
	}
	alertName := regexp.MustCompile(`\bMuster[A-Z][A-Za-z]+\b`)
	metric := regexp.MustCompile("`(muster_[a-z_]+)`")
	for _, k := range kinds {
		var matched []string
		for _, r := range rules {
			for _, re := range kindMatchers(t, r) {
				if re.MatchString(k) && !slices.Contains(matched, r.Alert) {
					matched = append(matched, r.Alert)
				}
			}
		}
		cell, listed := table[k]
		if !listed {
			t.Errorf("alarm kind %s has no line in docs/runbooks.md's table (matched by %v)", k, matched)
			continue
		}
		named := alertName.FindAllString(cell, -1)
		for _, n := range named {
			if byName[n] == nil {
				t.Errorf("docs/runbooks.md says %s covers %s, and no rule is called that", n, k)
			}
		}
		switch {
		case len(matched) > 1:
			t.Errorf("alarm kind %s is matched by %v: it would fire twice", k, matched)
		case len(matched) == 1:
			if !slices.Equal(named, matched) {
				t.Errorf("docs/runbooks.md says %v covers %s; the rules say %v", named, k, matched)
			}
		default:
			// Covered from a metric of its own: the line names the
			// metric, and every alert it names reads one of them.
			ms := metric.FindAllStringSubmatch(cell, -1)
			if len(named) == 0 || len(ms) == 0 {
				t.Errorf("alarm kind %s has no rule over muster_alarms_open, and its line in docs/runbooks.md names no alert and metric that cover it: %q", k, cell)
				continue
			}
			for _, n := range named {
				reads := false
				for _, r := range byName[n] {
					for _, m := range ms {
						reads = reads || strings.Contains(r.Expr, m[1])
					}
				}
				if !reads {
					t.Errorf("docs/runbooks.md says %s covers %s from %v, and it reads none of them", n, k, ms)
				}
			}
		}
	}
}

// TestRulesKeepRegionAndNamespace: every aggregation keeps region and
// namespace (so two regions' alerts never merge), every rule has a
// severity and a runbook_url that points at a section of
// docs/runbooks.md, and every alert there has a section.
func TestRulesKeepRegionAndNamespace(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile(runbooksFile)
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^## (\w+)$`).FindAllStringSubmatch(string(doc), -1) {
		anchors[strings.ToLower(m[1])] = true
	}
	by := regexp.MustCompile(`\bby\s*\(([^)]*)\)`)
	alerts := map[string]bool{}
	for _, r := range loadRules(t) {
		alerts[strings.ToLower(r.Alert)] = true
		if strings.Contains(r.Expr, "without") {
			t.Errorf("%s aggregates with without(): say by (region, namespace, ...) so what is kept is plain: %s", r.Alert, r.Expr)
		}
		for _, m := range by.FindAllStringSubmatch(r.Expr, -1) {
			var labels []string
			for _, l := range strings.Split(m[1], ",") {
				labels = append(labels, strings.TrimSpace(l))
			}
			for _, want := range []string{"region", "namespace"} {
				if !slices.Contains(labels, want) {
					t.Errorf("%s aggregates %s away: by (%s)", r.Alert, want, m[1])
				}
			}
			if slices.Contains(labels, "instance") && !slices.Contains(labels, "job") {
				t.Errorf("%s keeps instance but not job: by (%s)", r.Alert, m[1])
			}
		}
		if s := r.Labels["severity"]; s != "warning" && s != "critical" {
			t.Errorf("%s: severity %q, want warning or critical", r.Alert, s)
		}
		u := r.Annotations["runbook_url"]
		anchor, ok := strings.CutPrefix(u, runbookBase)
		if !ok || anchor != strings.ToLower(r.Alert) {
			t.Errorf("%s: runbook_url %q, want %s%s", r.Alert, u, runbookBase, strings.ToLower(r.Alert))
		}
		if !anchors[anchor] {
			t.Errorf("%s: docs/runbooks.md has no section ## %s", r.Alert, r.Alert)
		}
	}
	for a := range anchors {
		if alerts[a] {
			continue
		}
		t.Errorf("docs/runbooks.md has a section for %s, which no rule raises", a)
	}
}

// TestInhibitionsNameShippedAlerts: the Alertmanager inhibitions shipped
// beside the rules name alerts the rules raise (a renamed alert would
// silently stop inhibiting).
func TestInhibitionsNameShippedAlerts(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(inhibitFile)
	if err != nil {
		t.Fatal(err)
	}
	alerts := map[string]bool{}
	for _, r := range loadRules(t) {
		alerts[r.Alert] = true
	}
	names := regexp.MustCompile(`alertname="([^"]+)"`).FindAllStringSubmatch(string(b), -1)
	if len(names) == 0 {
		t.Fatal("no alertname matchers in " + inhibitFile)
	}
	for _, m := range names {
		if !alerts[m[1]] {
			t.Errorf("%s inhibits %s, which no rule raises", inhibitFile, m[1])
		}
	}
}
