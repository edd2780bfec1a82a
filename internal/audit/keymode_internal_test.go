package audit

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestKeyFileModeSharedPolicy: a key file others may read is accepted
// only with AllowShared and on a read-only mount, never one anybody but
// its owner may write; an owner-only file needs neither. The mount is
// answered by a stand-in here (TestSharedKeyFileOnAReadOnlyMount uses a
// real one where the test may mount).
func TestKeyFileModeSharedPolicy(t *testing.T) {
	t.Parallel()
	p := filepath.Join(t.TempDir(), "k")
	if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	ro := func(string) (bool, error) { return true, nil }
	rw := func(string) (bool, error) { return false, nil }
	for _, tc := range []struct {
		mode     os.FileMode
		shared   bool
		readOnly func(string) (bool, error)
		ok       bool
		say      string
	}{
		{0o600, false, rw, true, ""},
		{0o644, false, ro, false, "MUSTER_SECRET_FILES_ALLOW_SHARED=true"},
		{0o644, true, rw, false, "writable one"},
		{0o644, true, ro, true, ""},
		{0o444, true, ro, true, ""},
		{0o604, true, ro, true, ""},
		{0o666, true, ro, false, "chmod 600"},
		{0o664, true, ro, false, "chmod 600"},
	} {
		if err := os.Chmod(p, tc.mode); err != nil {
			t.Fatal(err)
		}
		st, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		err = keyFileMode(p, st, KeyFilePolicy{AllowShared: tc.shared}, tc.readOnly)
		if (err == nil) != tc.ok || (err != nil && !strings.Contains(err.Error(), tc.say)) {
			t.Errorf("mode %04o, shared %v: %v, want ok %v saying %q", tc.mode, tc.shared, err, tc.ok, tc.say)
		}
	}
}
