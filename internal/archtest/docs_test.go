package archtest

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestDocsCiteNoIssueNumbers: the documents say what happens and why in
// words; "issue 27" means nothing to an operator reading them, and the
// tracker's numbers do not travel with the repository.
func TestDocsCiteNoIssueNumbers(t *testing.T) {
	cite := regexp.MustCompile(`[Ii]ssue #?[0-9]+`)
	var files []string
	for _, dir := range []string{"../../docs", "../../deploy"} {
		err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err == nil && !d.IsDir() && strings.HasSuffix(p, ".md") {
				files = append(files, p)
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	top, err := filepath.Glob("../../*.md")
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, top...)
	if len(files) < 10 {
		t.Fatalf("found %d documents", len(files))
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(b), "\n") {
			if m := cite.FindString(line); m != "" {
				t.Errorf("%s:%d cites %q: say what it stood for instead", strings.TrimPrefix(f, "../../"), i+1, m)
			}
		}
	}
}
