package resolver_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/musterhq/muster/resolver"
)

// held checks the invariants of whatever the cache holds for service: a
// sorted, duplicate-free endpoint set that hashes to its checksum.
func held(t *testing.T, c interface {
	Resolve(string) (resolver.Result, error)
}, service string) {
	t.Helper()
	r, err := c.Resolve(service)
	if err != nil {
		return
	}
	eps := r.Endpoints()
	if !slices.IsSortedFunc(eps, func(a, b resolver.Endpoint) int { return strings.Compare(a.InstanceID, b.InstanceID) }) {
		t.Fatalf("held endpoints of %s not sorted", service)
	}
	for i := 1; i < len(eps); i++ {
		if eps[i].InstanceID == eps[i-1].InstanceID {
			t.Fatalf("held endpoints of %s repeat %s", service, eps[i].InstanceID)
		}
	}
	if got := resolver.Checksum(eps); got != r.Checksum() {
		t.Fatalf("held v%d of %s hashes to %s, says %s", r.Version(), service, got, r.Checksum())
	}
	if r.Routable() > len(eps) {
		t.Fatalf("%d routable of %d endpoints", r.Routable(), len(eps))
	}
}

// FuzzWatchStream feeds arbitrary watch stream bodies to a client: it must
// never panic, and whatever it ends up holding must be internally
// consistent (the checks refuse anything else).
func FuzzWatchStream(f *testing.F) {
	v1 := view("api", 1, 3)
	v2 := view("api", 2, 4)
	vb, _ := json.Marshal(v1)
	db, _ := json.Marshal(deltaTo(v1, v2))
	f.Add([]byte("event: view\nid: 1\ndata: " + string(vb) + "\n\nevent: delta\nid: 2\ndata: " + string(db) + "\n\nevent: synced\ndata: {}\n\n"))
	f.Add([]byte("event: delta\ndata: " + string(db) + "\n\n"))
	f.Add([]byte(": comment\n\nevent: heartbeat\ndata: {}\n\nevent: drain\ndata: {}\n\n"))
	f.Add([]byte("event: view\ndata: {\"service\":\"api\",\"version\":9,\"endpoints\":[{\"instance_id\":\"a\"},{\"instance_id\":\"a\"}]}\n\n"))
	f.Add([]byte("event: view\ndata: {\"service\":\"api\",\"version\":3,\"endpoints\":[],\"checksum\":\"0000000000000000000000000000000000000000000000000000000000000000\"}\n\n"))
	f.Fuzz(func(t *testing.T, body []byte) {
		c, err := resolver.StreamClient([]string{"api", "db"})
		if err != nil {
			t.Fatal(err)
		}
		_ = resolver.Feed(c, bytes.NewReader(body))
		held(t, c, "api")
		held(t, c, "db")
	})
}

// FuzzLoadView gives LoadView arbitrary files: raw bytes, or arbitrary
// view JSON in a well-formed envelope (so the fuzzer gets past the
// content hash). It returns a view that verifies, or an error wrapping
// ErrCorruptCache, never a panic or part of a file.
func FuzzLoadView(f *testing.F) {
	good, _ := json.Marshal(view("api", 5, 3))
	f.Add(good, false)
	f.Add(good, true)
	f.Add([]byte(`{"service":"api","version":1,"endpoints":[{"instance_id":"b"},{"instance_id":"a"}],"checksum":""}`), false)
	f.Add([]byte(`{"format":1,"sha256":"","view":{}}`), true)
	f.Fuzz(func(t *testing.T, content []byte, raw bool) {
		dir := t.TempDir()
		file := content
		if !raw {
			sum := sha256.Sum256(content)
			env, err := json.Marshal(map[string]any{"format": 1, "sha256": hex.EncodeToString(sum[:]), "view": json.RawMessage(content)})
			if err != nil {
				return // not JSON: json.RawMessage refuses it; the raw case covers such files
			}
			file = env
		}
		if err := os.WriteFile(resolver.FileName(dir, "api"), file, 0o600); err != nil {
			t.Fatal(err)
		}
		v, err := resolver.LoadView(dir, "api")
		if err != nil {
			if !errors.Is(err, resolver.ErrCorruptCache) && !errors.Is(err, fs.ErrNotExist) {
				t.Fatalf("LoadView error %v wraps neither ErrCorruptCache nor ErrNotExist", err)
			}
			return
		}
		if v.Service != "api" || resolver.Checksum(v.Endpoints) != v.Checksum {
			t.Fatalf("LoadView returned an unverified view: %+v", v)
		}
		c := newCache(t, resolver.WithDir(dir))
		held(t, c, "api")
	})
}
