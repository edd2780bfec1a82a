package image

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/buildinfo"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The image's fixed facts: where things are and who runs them.
const (
	BinaryPath = "/usr/local/bin/muster"
	CACertPath = "/etc/ssl/certs/ca-certificates.crt"
	UID        = 65532 // distroless's "nonroot" number, so volume ownership carries over
	UserName   = "muster"
	HomeDir    = "/home/muster"
	// XDSPort is the port the image documents for xDS; `muster serve`
	// serves xDS only when given --xds-addr (MUSTER_XDS_ADDR), e.g. :18000.
	XDSPort = 18000
	// APIPort is `muster serve`'s default --addr port.
	APIPort = 8080
)

// Label keys of the OCI image annotations the config carries.
const (
	LabelSource   = "org.opencontainers.image.source"
	LabelVersion  = "org.opencontainers.image.version"
	LabelRevision = "org.opencontainers.image.revision"
	LabelCreated  = "org.opencontainers.image.created"
	LabelLicenses = "org.opencontainers.image.licenses"
	LabelTitle    = "org.opencontainers.image.title"
)

// Config is what Build needs. Build fills the empty fields with the
// defaults named on them.
type Config struct {
	// Src is the module root holding cmd/muster.
	Src string
	// Go is the go command to run (default "go").
	Go string
	// GOARCH is the target architecture (default "amd64"); GOOS is always
	// linux.
	GOARCH string
	// CACerts, when set, is a PEM bundle copied to CACertPath. By default
	// the image holds none: the binary carries Mozilla's roots (see
	// cmd/muster/roots.go), so the image does not depend on the build
	// machine's bundle.
	CACerts string
	// Version, when set, is linked into the binary as the release it is
	// (what `muster version` prints) and is the version label; the build
	// then also ignores VCS stamping (-buildvcs=false), so a clone, a
	// worktree and an exported tree of one commit build the same bytes.
	Version string
	// Revision, when set, is the revision label (a release passes the
	// commit it builds); otherwise the label is the revision the build
	// stamped, if any.
	Revision string
	// Source is the org.opencontainers.image.source label (default
	// https://github.com/musterhq/muster).
	Source string
	// Licenses is the org.opencontainers.image.licenses label, an SPDX
	// expression (default NOASSERTION: the repository states no licence).
	Licenses string
	// Created, when not zero, is the image's creation time and every
	// file's mtime (cmd/muster-image passes SOURCE_DATE_EPOCH here).
	Created time.Time
	// BuildOutput receives go build's output (default discarded).
	BuildOutput io.Writer
}

func (c *Config) setDefaults() {
	if c.Go == "" {
		c.Go = "go"
	}
	if c.GOARCH == "" {
		c.GOARCH = "amd64"
	}
	if c.Source == "" {
		c.Source = "https://github.com/musterhq/muster"
	}
	if c.Licenses == "" {
		c.Licenses = "NOASSERTION"
	}
	if c.BuildOutput == nil {
		c.BuildOutput = io.Discard
	}
}

// Validate reports a configuration Build cannot use, before anything is
// built.
func (c *Config) Validate() error {
	if c.Src == "" {
		return errors.New("no source directory")
	}
	if _, err := os.Stat(filepath.Join(c.Src, "cmd", "muster")); err != nil {
		return fmt.Errorf("source directory %s holds no cmd/muster: %w", c.Src, err)
	}
	if strings.ContainsAny(c.GOARCH, " /") {
		return fmt.Errorf("GOARCH %q", c.GOARCH)
	}
	return nil
}

// Built is an image Build assembled, with what it was built from.
type Built struct {
	Image v1.Image
	// Version and Revision are the binary's own: the main module's version
	// and the VCS revision its build stamped ("" when built with
	// -buildvcs=false or outside a repository).
	Version, Revision string
	// Modified is the build's vcs.modified: the tree had local changes.
	Modified bool
	Created  time.Time
	// Binary is the compiled muster and Info its build information.
	Binary []byte
	Info   *debug.BuildInfo
}

// Build compiles muster from cfg.Src and assembles its image.
func Build(ctx context.Context, cfg Config) (*Built, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	// The CA bundle is read first, so a machine without one fails at once,
	// not after a minute of compiling.
	var caCerts []byte
	if cfg.CACerts != "" {
		var err error
		if caCerts, err = os.ReadFile(cfg.CACerts); err != nil {
			return nil, fmt.Errorf("read the CA bundle for %s: %w", CACertPath, err)
		}
		if !bytes.Contains(caCerts, []byte("-----BEGIN CERTIFICATE-----")) {
			return nil, fmt.Errorf("CA bundle %s holds no PEM certificate", cfg.CACerts)
		}
	}

	tmp, err := os.MkdirTemp("", "muster-image-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	bin := filepath.Join(tmp, "muster")
	if err := goBuild(ctx, cfg, bin); err != nil {
		return nil, err
	}
	binary, err := os.ReadFile(bin)
	if err != nil {
		return nil, fmt.Errorf("read the built binary: %w", err)
	}
	info, err := buildinfo.ReadFile(bin)
	if err != nil {
		return nil, fmt.Errorf("read the built binary's build information: %w", err)
	}
	settings := map[string]string{}
	for _, s := range info.Settings {
		settings[s.Key] = s.Value
	}
	b := &Built{
		Version:  info.Main.Version,
		Revision: settings["vcs.revision"],
		Modified: settings["vcs.modified"] == "true",
		Created:  cfg.Created,
		Binary:   binary,
		Info:     info,
	}
	if cfg.Version != "" {
		b.Version = cfg.Version
	}
	if cfg.Revision != "" {
		b.Revision, b.Modified = cfg.Revision, false
	}
	if b.Version == "" {
		b.Version = "(devel)"
	}
	if b.Created.IsZero() {
		if t, err := time.Parse(time.RFC3339, settings["vcs.time"]); err == nil {
			b.Created = t
		} else {
			b.Created = time.Unix(0, 0)
		}
	}
	b.Created = b.Created.UTC().Truncate(time.Second)

	base, err := layer(b.Created, baseFiles(caCerts))
	if err != nil {
		return nil, fmt.Errorf("assemble the base layer: %w", err)
	}
	app, err := layer(b.Created, []file{
		{name: "usr/", mode: 0o755, dir: true},
		{name: "usr/local/", mode: 0o755, dir: true},
		{name: "usr/local/bin/", mode: 0o755, dir: true},
		{name: strings.TrimPrefix(BinaryPath, "/"), mode: 0o755, data: binary},
	})
	if err != nil {
		return nil, fmt.Errorf("assemble the binary's layer: %w", err)
	}

	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	created := v1.Time{Time: b.Created}
	img, err = mutate.Append(img,
		mutate.Addendum{Layer: base, MediaType: types.OCILayer, History: v1.History{
			Created: created, CreatedBy: "muster-image: passwd, group", Comment: "base"}},
		mutate.Addendum{Layer: app, MediaType: types.OCILayer, History: v1.History{
			Created: created, CreatedBy: "muster-image: go build -trimpath ./cmd/muster (CGO_ENABLED=0)"}},
	)
	if err != nil {
		return nil, fmt.Errorf("append the layers: %w", err)
	}

	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS = "linux"
	cf.Architecture = cfg.GOARCH
	if arm := settings["GOARM"]; cfg.GOARCH == "arm" && arm != "" {
		v, _, _ := strings.Cut(arm, ",") // "7,softfloat"
		cf.Variant = "v" + v
	}
	cf.Created = created
	cf.Config = v1.Config{
		User:       fmt.Sprintf("%d:%d", UID, UID),
		Entrypoint: []string{BinaryPath},
		Cmd:        []string{"serve"},
		Env:        []string{"PATH=/usr/local/bin"},
		WorkingDir: HomeDir,
		ExposedPorts: map[string]struct{}{
			strconv.Itoa(APIPort) + "/tcp": {},
			strconv.Itoa(XDSPort) + "/tcp": {},
		},
		Labels: map[string]string{
			LabelSource:   cfg.Source,
			LabelVersion:  b.Version,
			LabelCreated:  b.Created.Format(time.RFC3339),
			LabelLicenses: cfg.Licenses,
			LabelTitle:    "muster",
		},
	}
	if b.Revision != "" {
		cf.Config.Labels[LabelRevision] = b.Revision
	}
	if b.Image, err = mutate.ConfigFile(img, cf); err != nil {
		return nil, fmt.Errorf("set the image config: %w", err)
	}
	return b, nil
}

// goBuild compiles ./cmd/muster in cfg.Src to out, statically, for linux
// and cfg.GOARCH. The caller's GOFLAGS still apply (CI's -buildvcs=false
// leaves the revision out).
func goBuild(ctx context.Context, cfg Config, out string) error {
	args := []string{"build", "-trimpath", "-ldflags=-s -w"}
	if cfg.Version != "" {
		args = []string{"build", "-trimpath", "-buildvcs=false", "-ldflags=-s -w -X main.version=" + cfg.Version}
	}
	cmd := exec.CommandContext(ctx, cfg.Go, append(args, "-o", out, "./cmd/muster")...)
	cmd.Dir = cfg.Src
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+cfg.GOARCH)
	cmd.Stdout = cfg.BuildOutput
	var stderr bytes.Buffer
	cmd.Stderr = io.MultiWriter(cfg.BuildOutput, &stderr)
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build ./cmd/muster for linux/%s: %w\n%s", cfg.GOARCH, err, stderr.Bytes())
	}
	return nil
}

// file is one entry of a layer. Directories' names end in "/".
type file struct {
	name     string
	mode     int64
	dir      bool
	uid, gid int
	data     []byte
}

// baseFiles is the base layer: the user database, the CA bundle when one
// was given, /tmp and the user's home. Both users' shells are /sbin/nologin, which the image
// does not even hold.
func baseFiles(caCerts []byte) []file {
	passwd := fmt.Sprintf("root:x:0:0:root:/root:/sbin/nologin\n%s:x:%d:%d:%s:%s:/sbin/nologin\n", UserName, UID, UID, UserName, HomeDir)
	group := fmt.Sprintf("root:x:0:\n%s:x:%d:\n", UserName, UID)
	files := []file{
		{name: "etc/", mode: 0o755, dir: true},
		{name: "etc/group", mode: 0o644, data: []byte(group)},
		{name: "etc/passwd", mode: 0o644, data: []byte(passwd)},
	}
	if caCerts != nil {
		files = append(files,
			file{name: "etc/ssl/", mode: 0o755, dir: true},
			file{name: "etc/ssl/certs/", mode: 0o755, dir: true},
			file{name: strings.TrimPrefix(CACertPath, "/"), mode: 0o644, data: caCerts})
	}
	return append(files, []file{
		{name: "home/", mode: 0o755, dir: true},
		{name: strings.TrimPrefix(HomeDir, "/") + "/", mode: 0o700, dir: true, uid: UID, gid: UID},
		{name: "tmp/", mode: 0o1777, dir: true},
	}...)
}

// layer writes files, in order, into an uncompressed tar with fixed
// owners and mtimes, and makes it a gzip-compressed OCI layer.
func layer(mtime time.Time, files []file) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		h := &tar.Header{
			Name:    f.name,
			Mode:    f.mode,
			Uid:     f.uid,
			Gid:     f.gid,
			ModTime: mtime,
		}
		if f.dir {
			h.Typeflag = tar.TypeDir
		} else {
			h.Typeflag = tar.TypeReg
			h.Size = int64(len(f.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("tar %s: %w", f.name, err)
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, fmt.Errorf("tar %s: %w", f.name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	data := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(data)), nil
	}, tarball.WithMediaType(types.OCILayer), tarball.WithCompressedCaching)
}

// ModuleRoot is the directory of the go.mod governing dir.
func ModuleRoot(ctx context.Context, dir string) (string, error) {
	cmd := exec.CommandContext(ctx, "go", "env", "GOMOD")
	cmd.Dir = dir
	b, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("find the module root (go env GOMOD): %w", err)
	}
	gomod := strings.TrimSpace(string(b))
	if gomod == "" || gomod == os.DevNull {
		return "", errors.New("not inside a Go module: run from the muster repository or pass its root")
	}
	return filepath.Dir(gomod), nil
}
