package seal_test

import (
	"crypto/ed25519"
	"errors"
	"strings"
	"testing"

	"github.com/musterhq/muster/internal/seal"
)

func ptr(s string) *string { return &s }

// TestCensusCheck: who may start on a database, by the keys that sealed
// its live rows.
func TestCensusCheck(t *testing.T) {
	old, rotated := seal.Keys{"old": ed25519.PublicKey{1}}, seal.Keys{"new": ed25519.PublicKey{2}}
	both := seal.Keys{"old": ed25519.PublicKey{1}, "new": ed25519.PublicKey{2}}
	census := func(adopted bool, rows ...any) seal.Census {
		var c seal.Census
		for i := 0; i < len(rows); i += 3 {
			c.Add(rows[i].(string), rows[i+1].(*string), int64(rows[i+2].(int)))
		}
		if adopted {
			c.Adoptions = []string{"instances by key old"}
		}
		return c
	}
	for _, tc := range []struct {
		name    string
		c       seal.Census
		keys    seal.Keys
		want    error
		mention []string
	}{
		{"an empty database, keyless", census(false), nil, nil, nil},
		{"an empty database, keyed", census(false), old, nil, nil},
		{"rows from before the seals, keyless", census(false, seal.TableInstances, (*string)(nil), 40), nil, nil, nil},
		{"rows from before the seals, keyed: adopted at start", census(false, seal.TableInstances, (*string)(nil), 40), old, nil, nil},
		{"sealed rows, keyless", census(true, seal.TableInstances, ptr("old"), 40, seal.TableShifts, ptr("old"), 1), nil, seal.ErrKeyless,
			[]string{"41 live rows are sealed", "instances 40", "shifts 1", "MUSTER_AUDIT_SIGNING_KEY_FILE", "adoptions recorded"}},
		{"adopted but nothing live, keyless", census(true), nil, seal.ErrKeyless, []string{"0 live rows"}},
		{"the same key", census(true, seal.TableInstances, ptr("old"), 40), old, nil, nil},
		{"a rotated key, the old one not trusted", census(true, seal.TableInstances, ptr("old"), 40, seal.TableOverrides, ptr("old"), 2, seal.TableContracts, ptr("old"), 3), rotated, seal.ErrKeyMismatch,
			[]string{"45 of the 45 live sealed rows", "instances 40, contracts 3, overrides 2", "key old", "it trusts new", "MUSTER_AUDIT_PUBLIC_KEY_FILES", "muster seal status"}},
		{"a rotation half done: both trusted", census(true, seal.TableInstances, ptr("old"), 30, seal.TableInstances, ptr("new"), 10), both, nil, nil},
		{"a few rows forged under a made-up key: refused one by one", census(true, seal.TableInstances, ptr("old"), 100, seal.TableInstances, ptr("forged"), 5), old, nil, nil},
		{"more than the share under another key", census(true, seal.TableInstances, ptr("old"), 100, seal.TableInstances, ptr("forged"), 6), old, seal.ErrKeyMismatch,
			[]string{"6 of the 106", "key forged"}},
		{"unsealed rows do not count against the key", census(true, seal.TableInstances, ptr("old"), 1, seal.TableInstances, (*string)(nil), 500), old, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.c.Check(tc.keys, seal.DefaultMismatchShare)
			if !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
				t.Fatalf("Check: %v, want %v", err, tc.want)
			}
			for _, m := range tc.mention {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("the refusal does not say %q:\n%v", m, err)
				}
			}
		})
	}
}
