package testbin

import (
	"os"
	"testing"
)

// TestRequireFindsAnInstalledBinary: sh is on every machine; what Require
// returns is that binary.
func TestRequireFindsAnInstalledBinary(t *testing.T) {
	p := Require(t, "sh")
	if st, err := os.Stat(p); err != nil || st.IsDir() {
		t.Fatalf("Require(sh) = %q: %v", p, err)
	}
}
