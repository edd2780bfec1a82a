package image

import (
	"bytes"
	"debug/elf"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestReleaseReproducible builds the release twice, from a git clone and
// from a `git archive` export of the same commit, and wants one index
// digest: nothing from the checkout or the build machine gets in. It then
// checks what the chart relies on: both architectures, ELF binaries for
// the right machines, the chart's appVersion as label, tag and what
// `muster version` prints.
//
// A cold arm64 compile of muster takes minutes on two cores, too much for
// every `go test ./...` on a laptop, so the test runs only when
// MUSTER_RELEASE_TEST is set; .ci/run sets it (about a minute there, with
// the build cache warm):
//
//	MUSTER_RELEASE_TEST=1 go test -race -count=1 -run TestReleaseReproducible ./internal/image/
func TestReleaseReproducible(t *testing.T) {
	if os.Getenv("MUSTER_RELEASE_TEST") == "" {
		t.Skip("set MUSTER_RELEASE_TEST=1 to build the two-architecture release (minutes with a cold build cache)")
	}
	ctx := t.Context()
	root, err := ModuleRoot(ctx, ".")
	if err != nil {
		t.Fatal(err)
	}
	git := func(dir string, args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, "git", args...)
		cmd.Dir = dir
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("git %s: %v", strings.Join(args, " "), err)
		}
		return strings.TrimSpace(string(out))
	}
	rev := git(root, "rev-parse", "HEAD")
	commitTime, err := time.Parse(time.RFC3339, git(root, "log", "-1", "--format=%cI", rev))
	if err != nil {
		t.Fatal(err)
	}

	// One checkout is a clone, dated and revisioned by git itself...
	clone := filepath.Join(t.TempDir(), "clone")
	git(root, "clone", "-q", "--shared", "--no-checkout", root, clone)
	git(clone, "checkout", "-q", "--detach", rev)
	// ...the other an export with no .git, told the same by hand, as a
	// release from a source tarball would be with SOURCE_DATE_EPOCH.
	export := filepath.Join(t.TempDir(), "export")
	if err := os.MkdirAll(export, 0o755); err != nil {
		t.Fatal(err)
	}
	archive := exec.CommandContext(ctx, "sh", "-c", `git archive --format=tar "$1" | tar -x -C "$2"`, "sh", rev, export)
	archive.Dir = root
	if out, err := archive.CombinedOutput(); err != nil {
		t.Fatalf("git archive: %v\n%s", err, out)
	}

	a, err := BuildRelease(ctx, ReleaseConfig{Src: clone})
	if err != nil {
		t.Fatal(err)
	}
	b, err := BuildRelease(ctx, ReleaseConfig{Src: export, Created: commitTime, Revision: rev})
	if err != nil {
		t.Fatal(err)
	}
	da, err := a.Index.Digest()
	if err != nil {
		t.Fatal(err)
	}
	db, err := b.Index.Digest()
	if err != nil {
		t.Fatal(err)
	}
	if da != db {
		t.Errorf("the clone's release is %s, the export's %s: want one digest", da, db)
	}

	appVersion, err := ChartAppVersion(root)
	if err != nil {
		t.Fatal(err)
	}
	if a.Version != appVersion {
		t.Errorf("release version %q, want the chart's appVersion %q", a.Version, appVersion)
	}

	t.Run("index", func(t *testing.T) {
		m, err := a.Index.IndexManifest()
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, d := range m.Manifests {
			got = append(got, d.Platform.OS+"/"+d.Platform.Architecture)
		}
		if diff := cmp.Diff([]string{"linux/amd64", "linux/arm64"}, got); diff != "" {
			t.Errorf("index platforms (-want +got):\n%s", diff)
		}
		for i, img := range a.Images {
			cf, err := img.Image.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			if cf.Architecture != ReleasePlatforms[i] {
				t.Errorf("image %d is for %s, want %s", i, cf.Architecture, ReleasePlatforms[i])
			}
			want := map[string]string{
				LabelVersion:  appVersion,
				LabelRevision: rev,
				LabelCreated:  commitTime.UTC().Format(time.RFC3339),
			}
			for k, v := range want {
				if cf.Config.Labels[k] != v {
					t.Errorf("%s image: label %s = %q, want %q", cf.Architecture, k, cf.Config.Labels[k], v)
				}
			}
			if !cf.Created.Equal(commitTime) {
				t.Errorf("%s image created %s, want the commit's time %s", cf.Architecture, cf.Created, commitTime)
			}
		}
	})

	t.Run("layout tagged with appVersion", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "oci")
		if err := WriteIndexLayout(dir, a.Index, a.Version); err != nil {
			t.Fatal(err)
		}
		var index struct {
			Manifests []struct {
				MediaType   string
				Digest      string
				Annotations map[string]string
			}
		}
		readJSON(t, filepath.Join(dir, "index.json"), &index)
		if len(index.Manifests) != 1 || index.Manifests[0].Digest != da.String() ||
			index.Manifests[0].Annotations[refName] != appVersion {
			t.Errorf("index.json %+v, want the release index %s tagged %s", index, da, appVersion)
		}
		if err := WriteIndexLayout(dir, a.Index, a.Version); err == nil {
			t.Error("WriteIndexLayout wrote a release over an existing layout")
		}
	})

	t.Run("binaries", func(t *testing.T) {
		machines := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}
		for i, img := range a.Images {
			arch := ReleasePlatforms[i]
			f, err := elf.NewFile(bytes.NewReader(img.Binary))
			if err != nil {
				t.Fatalf("%s binary is not ELF: %v", arch, err)
			}
			if f.Machine != machines[arch] || f.Class != elf.ELFCLASS64 {
				t.Errorf("%s binary is for %v %v, want %v", arch, f.Class, f.Machine, machines[arch])
			}
		}
		if runtime.GOOS != "linux" || runtime.GOARCH != "amd64" {
			t.Skip("the amd64 binary runs only on linux/amd64")
		}
		bin := filepath.Join(t.TempDir(), "muster")
		if err := os.WriteFile(bin, a.Images[0].Binary, 0o755); err != nil {
			t.Fatal(err)
		}
		out, err := exec.CommandContext(ctx, bin, "version").CombinedOutput()
		if err != nil {
			t.Fatalf("muster version: %v\n%s", err, out)
		}
		if want := "muster " + appVersion + " go"; !strings.HasPrefix(string(out), want) {
			t.Errorf("muster version printed %q, want it to start with %q", out, want)
		}
	})

	t.Run("sbom", func(t *testing.T) {
		for i, arch := range ReleasePlatforms {
			sa, err := SBOM(a.Images[i], arch, "https://github.com/musterhq/muster")
			if err != nil {
				t.Fatal(err)
			}
			sb, err := SBOM(b.Images[i], arch, "https://github.com/musterhq/muster")
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(sa, sb) {
				t.Errorf("%s SBOMs of the two builds differ", arch)
			}
			var doc struct {
				SPDXVersion string
				Packages    []struct {
					Name, VersionInfo string
				}
			}
			if err := json.Unmarshal(sa, &doc); err != nil {
				t.Fatal(err)
			}
			got := map[string]string{}
			for _, p := range doc.Packages {
				got[p.Name] = p.VersionInfo
			}
			if doc.SPDXVersion != "SPDX-2.3" || got["muster"] != appVersion ||
				got["golang.org/x/crypto/x509roots/fallback"] == "" || got["github.com/jackc/pgx/v5"] == "" {
				t.Errorf("%s SBOM: version %q, packages %v; want SPDX-2.3 naming muster %s, pgx and the fallback roots", arch, doc.SPDXVersion, got, appVersion)
			}
		}
	})
}

// TestBaseHasNoHostCABundle: unless a bundle is asked for, the base layer
// holds nothing read from the build machine.
func TestBaseHasNoHostCABundle(t *testing.T) {
	t.Parallel()
	for _, f := range baseFiles(nil) {
		if strings.HasPrefix(f.name, "etc/ssl") {
			t.Errorf("the base layer holds %s without a bundle asked for", f.name)
		}
	}
	var names []string
	for _, f := range baseFiles([]byte("pem")) {
		names = append(names, f.name)
	}
	if !strings.Contains(strings.Join(names, " "), "etc/ssl/certs/ca-certificates.crt") {
		t.Errorf("a bundle asked for is not in the base layer: %v", names)
	}
}

func TestChartAppVersion(t *testing.T) {
	t.Parallel()
	root, err := ModuleRoot(t.Context(), ".")
	if err != nil {
		t.Fatal(err)
	}
	got, err := ChartAppVersion(root)
	if err != nil || !semver.MatchString(got) {
		t.Errorf("ChartAppVersion(%s) = %q, %v; want the chart's version", root, got, err)
	}
	for _, bad := range []string{`appVersion: "1.0; rm -rf /"`, `version: 0.1.0`, `appVersion: [`} {
		dir := t.TempDir()
		path := filepath.Join(dir, ChartPath)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(bad+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if v, err := ChartAppVersion(dir); err == nil {
			t.Errorf("Chart.yaml %q gave appVersion %q, want an error", bad, v)
		}
	}
}

// TestReleaseRefusesLocalChanges: a release is labelled with its commit,
// so a checkout with changes on top is refused before anything is built.
func TestReleaseRefusesLocalChanges(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	run := func(args ...string) {
		t.Helper()
		cmd := exec.CommandContext(t.Context(), args[0], args[1:]...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
	}
	chart := filepath.Join(dir, ChartPath)
	if err := os.MkdirAll(filepath.Dir(chart), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(chart, []byte("appVersion: \"0.1.0\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	run("git", "init", "-q")
	run("git", "add", ".")
	run("git", "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", "chart")
	if err := os.WriteFile(filepath.Join(dir, "local.go"), []byte("package main\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := BuildRelease(t.Context(), ReleaseConfig{Src: dir, Go: "/nonexistent/go-must-not-run"})
	if err == nil || !strings.Contains(err.Error(), "not committed") || !strings.Contains(err.Error(), "local.go") {
		t.Errorf("BuildRelease of a checkout with local changes: %v, want a refusal naming local.go", err)
	}
}
