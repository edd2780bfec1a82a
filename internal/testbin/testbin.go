// Package testbin finds the real third-party programs muster's tests
// drive (haproxy, named, dig), installed from Debian by
// scripts/ensure-debian-tools. Without one a test skips, or fails when
// MUSTER_REQUIRE_TOOLS=1 (CI sets it), so a missing package can never
// turn a CI run green by skipping.
package testbin

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// Require returns the path of the named binary, looked up on PATH and in
// /usr/sbin and /sbin (where Debian puts haproxy and named).
func Require(t testing.TB, name string) string {
	t.Helper()
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	for _, dir := range []string{"/usr/sbin", "/sbin", "/usr/bin"} {
		p := filepath.Join(dir, name)
		if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return p
		}
	}
	msg := "no " + name + " binary: run scripts/ensure-debian-tools (installs Debian's haproxy, bind9, bind9-dnsutils, curl, jq, umoci, prometheus-alertmanager and prometheus)"
	if os.Getenv("MUSTER_REQUIRE_TOOLS") == "1" {
		t.Fatal(msg + "; MUSTER_REQUIRE_TOOLS=1 makes this a failure")
	}
	t.Skip(msg)
	return ""
}
