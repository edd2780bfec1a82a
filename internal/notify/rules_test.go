package notify_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/musterhq/muster/internal/testbin"
)

// rulesFile is the shipped alert rules file, from this package's folder;
// rulesTestFile is promtool's unit tests of it.
var (
	rulesFile     = filepath.Join("..", "..", "deploy", "prometheus", "muster-alerts.rules.yml")
	rulesTestFile = filepath.Join("..", "..", "deploy", "prometheus", "muster-alerts.test.yml")
	inhibitFile   = filepath.Join("..", "..", "deploy", "prometheus", "alertmanager-inhibit.yml")
)

// TestAlertRulesPassPromtool: the alert rules shipped beside the metrics
// are valid for Prometheus (Debian's promtool, installed by
// scripts/ensure-debian-tools), pass promtool's unit tests of them (two
// regions and two namespaces whose alerts stay apart; muster down,
// unscraped and absent; certificates), and every metric they read is one
// muster exports. The inhibitions shipped for Alertmanager pass amtool.
func TestAlertRulesPassPromtool(t *testing.T) {
	t.Parallel()
	promtool := testbin.Require(t, "promtool")
	amtool := testbin.Require(t, "amtool")
	if out, err := exec.CommandContext(t.Context(), amtool, "check-config", inhibitFile).CombinedOutput(); err != nil || !strings.Contains(string(out), "SUCCESS") {
		t.Fatalf("amtool check-config %s: %v\n%s", inhibitFile, err, out)
	}
	for _, args := range [][]string{{"check", "rules", rulesFile}, {"test", "rules", rulesTestFile}} {
		out, err := exec.CommandContext(t.Context(), promtool, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("promtool %s %s: %v\n%s", args[0], args[1], err, out)
		}
		if !strings.Contains(string(out), "SUCCESS") {
			t.Fatalf("promtool %s %s said:\n%s", args[0], args[1], out)
		}
	}
	rules, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	src := moduleSource(t)
	for _, m := range regexp.MustCompile(`\bmuster_[a-z_]+\b`).FindAllString(string(rules), -1) {
		if !strings.Contains(src, `"`+m+`"`) {
			t.Errorf("the rules read %s, which no muster code exports", m)
		}
	}
}

// moduleSource is the non-test Go source of the module, concatenated.
func moduleSource(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	root := filepath.Join("..", "..")
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(p, ".go") && !strings.HasSuffix(p, "_test.go") {
			f, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			b.Write(f)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}
