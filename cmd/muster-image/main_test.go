package main

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

// TestUsageErrors: a command line that says nothing of where the image
// goes, or says too much, is refused before anything is built.
func TestUsageErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "--out DIR and/or --tar FILE"},
		{[]string{"--out", t.TempDir(), "extra"}, `unexpected argument "extra"`},
		{[]string{"--no-such-flag"}, "no-such-flag"},
		{[]string{"--release"}, "--release needs --out DIR"},
		{[]string{"--release", "--out", t.TempDir(), "--tag", "v9"}, "--release fixes what --tag would set"},
		{[]string{"--release", "--out", t.TempDir(), "--goarch", "riscv64"}, "--release fixes what --goarch would set"},
		{[]string{"--release", "--out", t.TempDir(), "--tar", "m.tar"}, "--release fixes what --tar would set"},
	} {
		var stdout, stderr bytes.Buffer
		err := run(t.Context(), tc.args, &stdout, &stderr)
		if !errors.Is(err, errUsage) || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("muster-image %q: %v, stderr %q; want a usage error saying %q", tc.args, err, stderr.String(), tc.want)
		}
	}
}
