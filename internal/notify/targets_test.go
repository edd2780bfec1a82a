package notify_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/musterhq/muster/internal/notify"
)

// TestLoadTargets: the documented YAML loads; a bad URL or kind is
// refused without repeating the URL (it may carry a token).
func TestLoadTargets(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	got, err := notify.LoadTargets(write("ok.yaml", `platform: {url: "https://alertmanager.platform.internal:9093"}
teams:
  payments: {url: "https://alertmanager.payments.internal:9093"}
  search:   {url: "https://hooks.example/muster?token=s3cret", kind: webhook}
`))
	if err != nil {
		t.Fatal(err)
	}
	if got.Platform == nil || len(got.Teams) != 2 || got.Teams["search"].Kind != notify.KindWebhook {
		t.Fatalf("loaded %+v", got)
	}
	for name, body := range map[string]string{
		"scheme.json": `{"teams":{"payments":{"url":"ftp://x?token=s3cret"}}}`,
		"kind.json":   `{"platform":{"url":"https://x?token=s3cret","kind":"pager"}}`,
		"empty.json":  `{}`,
		"field.yaml":  "platfrom: {url: https://x}\n",
	} {
		_, err := notify.LoadTargets(write(name, body))
		if err == nil {
			t.Errorf("%s loaded", name)
		} else if strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%s: the error repeats the URL: %v", name, err)
		}
	}
}
