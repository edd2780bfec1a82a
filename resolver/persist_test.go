package resolver_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/musterhq/muster/resolver"
)

func TestPersistRoundTrip(t *testing.T) {
	dir := t.TempDir()
	c := newCache(t, resolver.WithDir(dir))
	v1 := view("api", 1, 20)
	v1.Endpoints[3].Health = resolver.HealthUnknown
	v1.Endpoints[4].Capabilities = nil
	v1.Checksum = resolver.Checksum(v1.Endpoints)
	if err := c.ApplyView(v1); err != nil {
		t.Fatal(err)
	}
	v2 := viewOf("api", 2, v1.Endpoints[:15])
	if err := c.ApplyDelta(deltaTo(v1, v2)); err != nil {
		t.Fatal(err)
	}
	if matches, _ := filepath.Glob(filepath.Join(dir, ".*tmp*")); len(matches) != 0 {
		t.Errorf("temporary files left behind: %v", matches)
	}

	var events []resolver.Event
	c2 := newCache(t, resolver.WithDir(dir), resolver.WithEventHook(func(e resolver.Event) { events = append(events, e) }))
	r := mustResolve(t, c2, "api")
	want := mustResolve(t, c, "api")
	if diff := cmp.Diff(want.View(), r.View()); diff != "" {
		t.Errorf("loaded view differs (-applied +loaded):\n%s", diff)
	}
	if _, err := c2.Resolve("db"); !errors.Is(err, resolver.ErrNoView) {
		t.Errorf("db without a file = %v, want ErrNoView", err)
	}
	if len(events) != 0 || c2.Stats().Loaded != 1 {
		t.Errorf("events %v stats %+v", events, c2.Stats())
	}
	// Deltas chain on the loaded version.
	v3 := viewOf("api", 3, v1.Endpoints[:14])
	if err := c2.ApplyDelta(deltaTo(v2, v3)); err != nil {
		t.Fatal(err)
	}
}

func TestPersistSkipsGuardedUpdate(t *testing.T) {
	dir := t.TempDir()
	c := newCache(t, resolver.WithDir(dir))
	v1 := view("api", 1, 10)
	if err := c.ApplyView(v1); err != nil {
		t.Fatal(err)
	}
	if err := c.ApplyView(viewOf("api", 2, v1.Endpoints[:1])); !errors.Is(err, resolver.ErrShrinkCapped) {
		t.Fatal(err)
	}
	got, err := resolver.LoadView(dir, "api")
	if err != nil {
		t.Fatal(err)
	}
	if got.Version != 1 {
		t.Errorf("file holds v%d, want the larger v1", got.Version)
	}
}

func TestCorruptFileIgnored(t *testing.T) {
	for name, tc := range map[string]struct {
		mangle func([]byte) []byte
		reason string
	}{
		"truncated": {func(b []byte) []byte { return b[:len(b)/2] }, "decode envelope"},
		"empty":     {func([]byte) []byte { return nil }, "decode envelope"},
		"flipped byte": {func(b []byte) []byte {
			i := strings.Index(string(b), "10.0.0.")
			b[i] = '9'
			return b
		}, "content sha256"},
		"wrong format": {func(b []byte) []byte {
			return []byte(strings.Replace(string(b), `"format":1`, `"format":2`, 1))
		}, "format 2"},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			c := newCache(t, resolver.WithDir(dir))
			if err := c.ApplyView(view("api", 1, 4)); err != nil {
				t.Fatal(err)
			}
			path := resolver.FileName(dir, "api")
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, tc.mangle(b), 0o644); err != nil {
				t.Fatal(err)
			}
			var events []resolver.Event
			c2 := newCache(t, resolver.WithDir(dir), resolver.WithEventHook(func(e resolver.Event) { events = append(events, e) }))
			if _, err := c2.Resolve("api"); !errors.Is(err, resolver.ErrNoView) {
				t.Errorf("Resolve after corrupt file = %v, want ErrNoView", err)
			}
			if len(events) != 1 || !errors.Is(events[0].Err, resolver.ErrCorruptCache) || !strings.Contains(events[0].Err.Error(), tc.reason) {
				t.Errorf("events = %v, want one ErrCorruptCache mentioning %q", events, tc.reason)
			}
			if c2.Stats().CorruptFiles != 1 {
				t.Errorf("stats %+v", c2.Stats())
			}
		})
	}
}

func TestCorruptFileBadChecksumOrService(t *testing.T) {
	dir := t.TempDir()
	c := newCache(t, resolver.WithDir(dir))
	if err := c.ApplyView(view("api", 1, 4)); err != nil {
		t.Fatal(err)
	}
	// A consistent envelope around a file for another service.
	if err := os.Rename(resolver.FileName(dir, "api"), resolver.FileName(dir, "db")); err != nil {
		t.Fatal(err)
	}
	_, err := resolver.LoadView(dir, "db")
	if !errors.Is(err, resolver.ErrCorruptCache) || !strings.Contains(err.Error(), `service "api"`) {
		t.Errorf("LoadView = %v, want ErrCorruptCache about the service", err)
	}
}
