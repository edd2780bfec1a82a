package archtest

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestQueriesStayWithTheirTable: every file of queries/ names the
// table it serves and the package that owns it ("-- Table T, owned by
// internal/P"), and no other package's code calls its queries: a package
// that needs another's rows calls the owner's function, which takes the
// caller's transaction (registry.ReadInstance, say). The load generator
// is exempt: it seeds benchmark estates in bulk, below every API.
func TestQueriesStayWithTheirTable(t *testing.T) {
	root := moduleRoot(t)
	files, err := filepath.Glob(filepath.Join(root, "queries", "*.sql"))
	if err != nil || len(files) < 10 {
		t.Fatalf("query files: %v (%d)", err, len(files))
	}
	header := regexp.MustCompile(`^-- Table (\w+), owned by (internal/[a-z/]+)`)
	name := regexp.MustCompile(`(?m)^-- name: (\w+)`)
	owner := map[string]string{} // query -> owning package dir
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		m := header.FindSubmatch(b)
		if m == nil {
			t.Errorf("%s does not start with \"-- Table T, owned by internal/P\"", filepath.Base(f))
			continue
		}
		for _, q := range name.FindAllSubmatch(b, -1) {
			owner[string(q[1])] = string(m[2])
		}
	}
	if len(owner) < 50 {
		t.Fatalf("found %d queries", len(owner))
	}
	call := regexp.MustCompile(`(\w+)\.([A-Z]\w+)\(`)
	exempt := []string{"db", "internal/loadgen"}
	err = filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() && path != root && strings.HasPrefix(d.Name(), ".") {
			return filepath.SkipDir // .git, .ci
		}
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		rel, _ := filepath.Rel(root, filepath.Dir(path))
		rel = filepath.ToSlash(rel)
		for _, e := range exempt {
			if rel == e || strings.HasPrefix(rel, e+"/") {
				return nil
			}
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if !strings.Contains(string(b), `"github.com/musterhq/muster/db"`) {
			return nil
		}
		for _, m := range call.FindAllSubmatch(b, -1) {
			pkg, ok := owner[string(m[2])]
			if !ok || rel == pkg || strings.HasPrefix(rel, pkg+"/") || string(m[1]) == filepath.Base(pkg) {
				continue // not a query, the owner's own, or the owner's function of the same name
			}
			t.Errorf("%s calls %s, a query of a table %s owns; call one of %s's functions instead", filepath.ToSlash(path[len(root)+1:]), m[2], pkg, pkg)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// moduleRoot is the module's directory (this package is internal/archtest).
func moduleRoot(t *testing.T) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Dir(filepath.Dir(wd))
}
