package chart_test

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v4/pkg/chart/common"
)

// valuePaths returns the dotted paths of values.yaml: every key (all) and
// the leaves (a scalar, a list or an empty map: what an operator sets).
func valuePaths(t *testing.T) (all, leaves []string) {
	t.Helper()
	vals, err := common.ReadValuesFile(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var walk func(m map[string]any, prefix string)
	walk = func(m map[string]any, prefix string) {
		for k, v := range m {
			p := prefix + k
			all = append(all, p)
			if sub, ok := v.(map[string]any); ok && len(sub) > 0 {
				walk(sub, p+".")
				continue
			}
			leaves = append(leaves, p)
		}
	}
	walk(vals, "")
	slices.Sort(all)
	slices.Sort(leaves)
	return all, leaves
}

// readmeTableNames returns the value names the README's table rows give
// in their first cell, expanded as an operator reads them: `a.b.c`, then
// `.d` for a.b.d, and `a.x/y.z` for a.x.z and a.y.z. A name in
// parentheses is a note about the names before it, not one of its own.
func readmeTableNames(t *testing.T) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(chartDir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	tick := regexp.MustCompile("`([^`]+)`")
	names := map[string]bool{}
	for line := range strings.Lines(string(b)) {
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		cell, _, _ := strings.Cut(strings.Split(line, "|")[1], "(")
		var bases []string
		for _, m := range tick.FindAllStringSubmatch(cell, -1) {
			if rel, ok := strings.CutPrefix(m[1], "."); ok {
				for _, b := range bases {
					if i := strings.LastIndex(b, "."); i >= 0 {
						names[b[:i+1]+rel] = true
					}
				}
				continue
			}
			bases = []string{""}
			for seg := range strings.SplitSeq(m[1], ".") {
				var next []string
				for _, e := range bases {
					for alt := range strings.SplitSeq(seg, "/") {
						next = append(next, strings.TrimPrefix(e+"."+alt, "."))
					}
				}
				bases = next
			}
			for _, e := range bases {
				names[e] = true
			}
		}
	}
	return names
}

// TestREADMEDocumentsEveryValue: docs/helm.md says the chart README lists
// every value; every leaf of values.yaml, or a map above it (`resources`
// stands for its requests and limits), is named in the README's table.
func TestREADMEDocumentsEveryValue(t *testing.T) {
	names := readmeTableNames(t)
	_, leaves := valuePaths(t)
	for _, leaf := range leaves {
		documented := false
		for p := leaf; p != "" && !documented; {
			documented = names[p]
			i := strings.LastIndex(p, ".")
			if i < 0 {
				break
			}
			p = p[:i]
		}
		if !documented {
			t.Errorf("the README's values table does not name %s", leaf)
		}
	}
}

// notValues are dotted names the documents give that are not values:
// a value the schema refuses, named to say so, and a TLS Secret's keys.
var notValues = map[string]bool{
	"signingKey.privateKey": true, // refused: the documents say how to move off it
	"tls.crt":               true, // keys of a kubernetes.io/tls Secret
	"tls.key":               true,
}

// TestDocsNameOnlyRealValues: every dotted value name that docs/helm.md,
// docs/production.md and the chart README give (a backticked a.b whose
// first part is a top-level value) is a key of values.yaml, so no
// document points an operator at a value that was renamed or removed.
func TestDocsNameOnlyRealValues(t *testing.T) {
	all, _ := valuePaths(t)
	top := map[string]bool{}
	for _, p := range all {
		if !strings.Contains(p, ".") {
			top[p] = true
		}
	}
	dotted := regexp.MustCompile("`([a-zA-Z][a-zA-Z0-9]*(?:\\.[a-zA-Z][a-zA-Z0-9]*)+)`")
	for _, f := range []string{"../../docs/helm.md", "../../docs/production.md", filepath.Join(chartDir, "README.md")} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range dotted.FindAllStringSubmatch(string(b), -1) {
			first, _, _ := strings.Cut(m[1], ".")
			if top[first] && !slices.Contains(all, m[1]) && !notValues[m[1]] {
				t.Errorf("%s names the value %s, which values.yaml does not have", f, m[1])
			}
		}
	}
}
