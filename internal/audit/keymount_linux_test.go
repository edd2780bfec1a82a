package audit_test

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/musterhq/muster/internal/audit"
)

// TestSharedKeyFileOnAReadOnlyMount: a key file of mode 0644, as a CSI
// secret store writes it, read through a real read-only bind mount, is
// accepted with AllowShared and refused without it; the same file read
// where it is writable is refused even with AllowShared. Needs a process
// that may mount (root with CAP_SYS_ADMIN); skipped otherwise
// (TestKeyFileModeSharedPolicy covers the rule without a mount).
func TestSharedKeyFileOnAReadOnlyMount(t *testing.T) {
	t.Parallel()
	src, dst := t.TempDir(), t.TempDir()
	key := filepath.Join(src, "signing.key")
	if _, err := audit.LoadOrCreateKeyFile(key); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(key, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount(src, dst, "", syscall.MS_BIND, ""); err != nil {
		t.Skipf("cannot bind-mount here (%v): the rule is covered by TestKeyFileModeSharedPolicy", err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dst, 0); err != nil {
			t.Errorf("unmount %s: %v", dst, err)
		}
	})
	if err := syscall.Mount("", dst, "", syscall.MS_BIND|syscall.MS_REMOUNT|syscall.MS_RDONLY, ""); err != nil {
		t.Skipf("cannot remount read-only here (%v)", err)
	}
	onRO := filepath.Join(dst, "signing.key")
	if err := os.WriteFile(filepath.Join(dst, "probe"), nil, 0o600); err == nil {
		t.Fatal("the bind mount is writable")
	}

	if _, err := audit.LoadKeyFileWith(onRO, audit.KeyFilePolicy{AllowShared: true}); err != nil {
		t.Errorf("a 0644 key on a read-only mount with AllowShared: %v", err)
	}
	if _, err := audit.LoadKeyFile(onRO); err == nil || !strings.Contains(err.Error(), "MUSTER_SECRET_FILES_ALLOW_SHARED") {
		t.Errorf("a 0644 key on a read-only mount without AllowShared: %v, want a refusal naming the setting", err)
	}
	if _, err := audit.LoadKeyFileWith(key, audit.KeyFilePolicy{AllowShared: true}); err == nil || !strings.Contains(err.Error(), "writable") {
		t.Errorf("a 0644 key on a writable file system with AllowShared: %v, want a refusal", err)
	}
}
