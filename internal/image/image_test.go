package image

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"io/fs"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-containerregistry/pkg/v1/empty"

	"github.com/musterhq/muster/internal/testbin"
)

// TestImageUnpacksAndRuns builds the image from this tree, has Debian's
// umoci (a reader that is not go-containerregistry) unpack it, and checks
// what a runtime would get: exactly the files the image promises, no
// shell, a non-root user, the labels, and a binary that runs and answers
// `muster version`.
func TestImageUnpacksAndRuns(t *testing.T) {
	umoci := testbin.Require(t, "umoci")
	ctx := t.Context()
	root, err := ModuleRoot(ctx, ".")
	if err != nil {
		t.Fatal(err)
	}
	ca := testCABundle(t)
	// The binary is built for this machine's architecture so the test can
	// run it.
	cfg := Config{Src: root, GOARCH: runtime.GOARCH, CACerts: ca}
	built, err := Build(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "layout")
	if err := WriteLayout(dir, built.Image, "latest"); err != nil {
		t.Fatal(err)
	}
	bundle := filepath.Join(t.TempDir(), "bundle")
	// --rootless: the test need not run as root, and umoci then leaves the
	// files owned by whoever runs it.
	if out, err := exec.CommandContext(ctx, umoci, "unpack", "--rootless", "--image", dir+":latest", bundle).CombinedOutput(); err != nil {
		t.Fatalf("umoci unpack: %v\n%s", err, out)
	}
	rootfs := filepath.Join(bundle, "rootfs")

	t.Run("rootfs", func(t *testing.T) {
		var got []string
		err := filepath.WalkDir(rootfs, func(path string, d fs.DirEntry, err error) error {
			if err != nil || path == rootfs {
				return err
			}
			rel, _ := filepath.Rel(rootfs, path)
			if d.IsDir() {
				rel += "/"
			} else if !d.Type().IsRegular() {
				rel += " (" + d.Type().String() + ")"
			}
			got = append(got, rel)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		want := []string{
			"etc/", "etc/group", "etc/passwd", "etc/ssl/", "etc/ssl/certs/", "etc/ssl/certs/ca-certificates.crt",
			"home/", "home/muster/", "tmp/",
			"usr/", "usr/local/", "usr/local/bin/", "usr/local/bin/muster",
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("unpacked rootfs (-want +got):\n%s", diff)
		}
		for _, sh := range []string{"bin/sh", "bin/bash", "bin/busybox", "usr/bin/sh"} {
			if _, err := os.Lstat(filepath.Join(rootfs, sh)); err == nil {
				t.Errorf("the image holds a shell: /%s", sh)
			}
		}
		passwd, err := os.ReadFile(filepath.Join(rootfs, "etc/passwd"))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(passwd, []byte("\nmuster:x:65532:65532:")) {
			t.Errorf("/etc/passwd names no muster user with uid and gid 65532:\n%s", passwd)
		}
		group, err := os.ReadFile(filepath.Join(rootfs, "etc/group"))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(group, []byte("\nmuster:x:65532:")) {
			t.Errorf("/etc/group names no muster group with gid 65532:\n%s", group)
		}
		wantCA, _ := os.ReadFile(ca)
		gotCA, err := os.ReadFile(filepath.Join(rootfs, "etc/ssl/certs/ca-certificates.crt"))
		if err != nil || !bytes.Equal(gotCA, wantCA) {
			t.Errorf("the CA bundle in the image differs from %s (%v)", ca, err)
		}
		st, err := os.Stat(filepath.Join(rootfs, "tmp"))
		if err != nil || st.Mode()&fs.ModeSticky == 0 || st.Mode().Perm() != 0o777 {
			t.Errorf("/tmp is %v (%v), want drwxrwxrwt", st.Mode(), err)
		}
	})

	t.Run("runtime config", func(t *testing.T) {
		// umoci turns the image config into an OCI runtime config, as a
		// container runtime would read it.
		var spec struct {
			Process struct {
				User struct{ UID, GID int }
				Args []string
				Cwd  string
			}
		}
		readJSON(t, filepath.Join(bundle, "config.json"), &spec)
		if spec.Process.User.UID != UID || spec.Process.User.GID != UID {
			t.Errorf("the container runs as %d:%d, want %d:%d", spec.Process.User.UID, spec.Process.User.GID, UID, UID)
		}
		if diff := cmp.Diff([]string{"/usr/local/bin/muster", "serve"}, spec.Process.Args); diff != "" {
			t.Errorf("the container's command (-want +got):\n%s", diff)
		}
		if spec.Process.Cwd != HomeDir {
			t.Errorf("the container's working directory is %q, want %q", spec.Process.Cwd, HomeDir)
		}
	})

	t.Run("labels", func(t *testing.T) {
		// Read by hand, as the OCI image layout spec lays it out: index,
		// manifest, config.
		var index struct {
			Manifests []struct {
				Digest      string
				Annotations map[string]string
			}
		}
		readJSON(t, filepath.Join(dir, "index.json"), &index)
		if len(index.Manifests) != 1 || index.Manifests[0].Annotations[refName] != "latest" {
			t.Fatalf("index.json: %+v, want one manifest tagged latest", index)
		}
		var manifest struct{ Config struct{ Digest string } }
		readJSON(t, blob(dir, index.Manifests[0].Digest), &manifest)
		var config struct {
			Architecture, OS string
			Config           struct {
				User         string
				ExposedPorts map[string]struct{}
				Labels       map[string]string
			}
		}
		readJSON(t, blob(dir, manifest.Config.Digest), &config)
		if config.OS != "linux" || config.Architecture != runtime.GOARCH {
			t.Errorf("platform %s/%s, want linux/%s", config.OS, config.Architecture, runtime.GOARCH)
		}
		if config.Config.User != "65532:65532" {
			t.Errorf("user %q, want 65532:65532", config.Config.User)
		}
		if diff := cmp.Diff(map[string]struct{}{"8080/tcp": {}, "18000/tcp": {}}, config.Config.ExposedPorts); diff != "" {
			t.Errorf("exposed ports (-want +got):\n%s", diff)
		}
		want := map[string]string{
			LabelSource:   "https://github.com/musterhq/muster",
			LabelVersion:  built.Version,
			LabelCreated:  built.Created.Format(time.RFC3339),
			LabelLicenses: "NOASSERTION",
			LabelTitle:    "muster",
		}
		// Only a build that stamped its revision has one to label (CI
		// builds with -buildvcs=false).
		if built.Revision != "" {
			want[LabelRevision] = built.Revision
		}
		if diff := cmp.Diff(want, config.Config.Labels); diff != "" {
			t.Errorf("labels (-want +got):\n%s", diff)
		}
	})

	t.Run("binary answers muster version", func(t *testing.T) {
		bin := filepath.Join(rootfs, "usr/local/bin/muster")
		out, err := exec.CommandContext(ctx, bin, "version").CombinedOutput()
		if err != nil {
			t.Fatalf("%s version: %v\n%s", bin, err, out)
		}
		want := "muster " + built.Version + " " + runtime.Version() + " linux/" + runtime.GOARCH + "\n"
		if !strings.HasPrefix(string(out), want) {
			t.Errorf("muster version printed %q, want it to start with %q", out, want)
		}
		if built.Revision != "" && !strings.Contains(string(out), "revision "+built.Revision) {
			t.Errorf("muster version printed %q, want revision %s", out, built.Revision)
		}
	})

	t.Run("rebuilt, same digest", func(t *testing.T) {
		again := built
		if os.Getenv("MUSTER_RELEASE_TEST") != "" {
			// TestReleaseReproducible builds the tree four times
			// through Build (two checkouts, two architectures) and
			// wants one digest: a fifth build here would prove less.
			t.Log("two builds of one tree are compared by TestReleaseReproducible")
		} else {
			var err error
			if again, err = Build(ctx, cfg); err != nil {
				t.Fatal(err)
			}
			d1, err := built.Image.Digest()
			if err != nil {
				t.Fatal(err)
			}
			d2, err := again.Image.Digest()
			if err != nil {
				t.Fatal(err)
			}
			if d1 != d2 {
				t.Errorf("two builds of one tree: %s and %s", d1, d2)
			}
		}
		// Rewriting the layout replaces the tagged image instead of adding
		// a second one.
		if err := WriteLayout(dir, again.Image, "latest"); err != nil {
			t.Fatal(err)
		}
		var index struct{ Manifests []json.RawMessage }
		readJSON(t, filepath.Join(dir, "index.json"), &index)
		if len(index.Manifests) != 1 {
			t.Errorf("index.json holds %d manifests after a rewrite, want 1", len(index.Manifests))
		}
	})
}

func TestBuildRefusesAMissingCABundle(t *testing.T) {
	t.Parallel()
	root, err := ModuleRoot(t.Context(), ".")
	if err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(t.TempDir(), "ca-certificates.crt")
	_, err = Build(t.Context(), Config{Src: root, CACerts: missing, Go: "/nonexistent/go-must-not-run"})
	if err == nil || !strings.Contains(err.Error(), missing) || !strings.Contains(err.Error(), "CA bundle") {
		t.Errorf("Build without a CA bundle: %v, want an error naming %s", err, missing)
	}
}

func TestWriteLayoutRefusesAnotherDirectory(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := WriteLayout(dir, empty.Image, "latest"); err == nil || !strings.Contains(err.Error(), "refusing") {
		t.Errorf("WriteLayout into a directory that is not a layout: %v, want a refusal", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "index.json")); err == nil {
		t.Error("WriteLayout wrote index.json into a directory it refused")
	}
}

// testCABundle writes a self-signed certificate as a PEM bundle, so the
// test does not depend on the machine's.
func testCABundle(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "muster image test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func readJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// blob is the path of a blob in an OCI layout.
func blob(dir, digest string) string {
	alg, hex, _ := strings.Cut(digest, ":")
	return filepath.Join(dir, "blobs", alg, hex)
}
