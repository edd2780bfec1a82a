package archtest

import (
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// TestTestDatabasesAreStopped: a test package that starts the test
// PostgreSQL cluster (it imports db/dbtest or internal/app/apptest) stops
// it when its tests end, with dbtest.Main in a TestMain. Without it the
// cluster outlives the test binary: each CI run left three running, and
// they skewed every load measurement made after.
func TestTestDatabasesAreStopped(t *testing.T) {
	root := moduleRoot(t)
	uses := map[string]bool{}  // directories with a test importing either
	stops := map[string]bool{} // directories with a TestMain calling dbtest.Main
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() && path != root && strings.HasPrefix(d.Name(), ".") {
			return filepath.SkipDir // .git, .ci
		}
		if err != nil || d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		dir, _ := filepath.Rel(root, filepath.Dir(path))
		src := string(b)
		if strings.Contains(src, `"github.com/musterhq/muster/db/dbtest"`) || strings.Contains(src, `"github.com/musterhq/muster/internal/app/apptest"`) {
			uses[filepath.ToSlash(dir)] = true
		}
		if strings.Contains(src, "dbtest.Main(") {
			stops[filepath.ToSlash(dir)] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(uses) < 10 {
		t.Fatalf("found %d test packages using the test database", len(uses))
	}
	var missing []string
	for dir := range uses {
		if !stops[dir] {
			missing = append(missing, dir)
		}
	}
	sort.Strings(missing)
	for _, dir := range missing {
		t.Errorf("%s starts the test PostgreSQL cluster and never stops it: add func TestMain(m *testing.M) { dbtest.Main(m) }", dir)
	}
}
