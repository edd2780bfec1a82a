package image

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"go.yaml.in/yaml/v3"
)

// ChartPath is the Helm chart whose appVersion names the release: its
// default image is ghcr.io/musterhq/muster:appVersion, so the release is
// tagged and labelled with exactly that.
const ChartPath = "deploy/helm/muster/Chart.yaml"

// ReleasePlatforms are the architectures a release builds, all linux.
var ReleasePlatforms = []string{"amd64", "arm64"}

// ReleaseConfig is what BuildRelease needs.
type ReleaseConfig struct {
	// Src is the module root (a checkout or an exported tree).
	Src string
	// Created is the release's time. Zero means the time of the commit
	// checked out in Src (what SOURCE_DATE_EPOCH would say); a tree that
	// is not a git checkout must be given one.
	Created time.Time
	// Revision is the revision label. Empty means the commit checked out
	// in Src, if Src is a git checkout.
	Revision string
	// Source and Licenses are the labels, as in Config.
	Source, Licenses string
	// Go is the go command (default "go"); BuildOutput gets go build's
	// output.
	Go          string
	BuildOutput io.Writer
}

// Release is a built multi-architecture image.
type Release struct {
	Index   v1.ImageIndex
	Version string // the chart's appVersion: the tag, the label, `muster version`
	Created time.Time
	// Images are the per-architecture images, in ReleasePlatforms' order.
	Images []*Built
}

// BuildRelease builds muster for every ReleasePlatforms architecture from
// rc.Src and puts the images in one OCI image index. Everything that goes
// into it is fixed by the tree: the version is the chart's appVersion,
// the time is the commit's, the binaries are built with -trimpath and
// -buildvcs=false, and no file comes from the build machine (no CA
// bundle: the binary carries its roots). Two builds of one commit with one
// Go toolchain, from any two checkouts, therefore give one index digest.
func BuildRelease(ctx context.Context, rc ReleaseConfig) (*Release, error) {
	version, err := ChartAppVersion(rc.Src)
	if err != nil {
		return nil, err
	}
	if rc.Created.IsZero() || rc.Revision == "" {
		rev, at, err := commitOf(ctx, rc.Src)
		switch {
		case err != nil && rc.Created.IsZero():
			return nil, fmt.Errorf("%s is not a git checkout to take the release time from, and no SOURCE_DATE_EPOCH was given: %w", rc.Src, err)
		case err == nil:
			// A release is labelled with its commit, so it must be built
			// from exactly that commit, not from local changes on top.
			if dirty, err := dirtyFiles(ctx, rc.Src); err != nil {
				return nil, err
			} else if dirty != "" {
				return nil, fmt.Errorf("%s has changes not committed; a release is built from a commit as it is:\n%s", rc.Src, dirty)
			}
			if rc.Created.IsZero() {
				rc.Created = at
			}
			if rc.Revision == "" {
				rc.Revision = rev
			}
		}
	}
	r := &Release{Version: version, Created: rc.Created.UTC().Truncate(time.Second)}
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, arch := range ReleasePlatforms {
		b, err := Build(ctx, Config{
			Src: rc.Src, Go: rc.Go, GOARCH: arch, Version: version, Revision: rc.Revision,
			Source: rc.Source, Licenses: rc.Licenses, Created: r.Created, BuildOutput: rc.BuildOutput,
		})
		if err != nil {
			return nil, err
		}
		r.Images = append(r.Images, b)
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
			Add: b.Image,
			Descriptor: v1.Descriptor{
				MediaType: types.OCIManifestSchema1,
				Platform:  &v1.Platform{OS: "linux", Architecture: arch},
			},
		})
	}
	r.Index = idx
	return r, nil
}

// semver is the shape of an appVersion the release accepts: it becomes
// an image tag, a linker flag and a label, so nothing else gets through.
var semver = regexp.MustCompile(`^v?[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$`)

// ChartAppVersion reads appVersion from the chart in the module root src.
func ChartAppVersion(src string) (string, error) {
	path := filepath.Join(src, ChartPath)
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read the chart for its appVersion: %w", err)
	}
	var chart struct {
		AppVersion string `yaml:"appVersion"`
	}
	if err := yaml.Unmarshal(b, &chart); err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	if !semver.MatchString(chart.AppVersion) {
		return "", fmt.Errorf("%s: appVersion %q is not a version like 1.2.3", path, chart.AppVersion)
	}
	return chart.AppVersion, nil
}

// commitOf is the commit checked out in dir and its committer time.
func commitOf(ctx context.Context, dir string) (string, time.Time, error) {
	cmd := exec.CommandContext(ctx, "git", "log", "-1", "--format=%H %ct", "HEAD")
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		return "", time.Time{}, fmt.Errorf("git log: %w", err)
	}
	rev, sec, ok := strings.Cut(strings.TrimSpace(string(out)), " ")
	n, err := strconv.ParseInt(sec, 10, 64)
	if !ok || err != nil {
		return "", time.Time{}, fmt.Errorf("git log printed %q", out)
	}
	return rev, time.Unix(n, 0), nil
}

// dirtyFiles is `git status --porcelain` in dir: empty when the checkout
// is exactly its commit.
func dirtyFiles(ctx context.Context, dir string) (string, error) {
	cmd := exec.CommandContext(ctx, "git", "status", "--porcelain")
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("git status in %s: %w", dir, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// WriteIndexLayout writes idx as a new OCI image layout in dir (which must
// not exist or be empty: a release is never mixed into an older one),
// tagged tag.
func WriteIndexLayout(dir string, idx v1.ImageIndex, tag string) error {
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if len(entries) > 0 {
		return fmt.Errorf("%s is not empty; a release goes into a new directory", dir)
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return fmt.Errorf("create the OCI layout %s: %w", dir, err)
	}
	if err := p.AppendIndex(idx, layout.WithAnnotations(map[string]string{refName: tag})); err != nil {
		return fmt.Errorf("write the index into %s: %w", dir, err)
	}
	return nil
}

// SBOM is an SPDX 2.3 document for one image's binary, made from the build
// information Go records in it (what `go version -m` prints): the main
// module at the release version, the Go toolchain, and every module linked
// in. It holds nothing that varies between builds of one commit, so it is
// as reproducible as the image.
func SBOM(b *Built, goarch, source string) ([]byte, error) {
	digest, err := b.Image.Digest()
	if err != nil {
		return nil, err
	}
	type ref struct {
		Category string `json:"referenceCategory"`
		Type     string `json:"referenceType"`
		Locator  string `json:"referenceLocator"`
	}
	type pkg struct {
		Name             string `json:"name"`
		SPDXID           string `json:"SPDXID"`
		VersionInfo      string `json:"versionInfo"`
		DownloadLocation string `json:"downloadLocation"`
		FilesAnalyzed    bool   `json:"filesAnalyzed"`
		Purpose          string `json:"primaryPackagePurpose,omitempty"`
		Comment          string `json:"comment,omitempty"`
		ExternalRefs     []ref  `json:"externalRefs,omitempty"`
	}
	type rel struct {
		Element string `json:"spdxElementId"`
		Type    string `json:"relationshipType"`
		Related string `json:"relatedSpdxElement"`
	}
	purl := func(path, version string) []ref {
		return []ref{{"PACKAGE-MANAGER", "purl", "pkg:golang/" + path + "@" + version}}
	}
	main := pkg{
		Name: "muster", SPDXID: "SPDXRef-Package-muster", VersionInfo: b.Version,
		DownloadLocation: source, Purpose: "APPLICATION",
		Comment: fmt.Sprintf("linux/%s binary %s in image %s", goarch, BinaryPath, digest),
		ExternalRefs: []ref{{"PACKAGE-MANAGER", "purl",
			"pkg:oci/muster@" + digest.String() + "?arch=" + goarch}},
	}
	pkgs := []pkg{main, {
		Name: "go", SPDXID: "SPDXRef-Package-go", VersionInfo: strings.TrimPrefix(b.Info.GoVersion, "go"),
		DownloadLocation: "https://go.dev/dl/", Comment: "the Go toolchain and standard library",
	}}
	rels := []rel{
		{"SPDXRef-DOCUMENT", "DESCRIBES", main.SPDXID},
		{main.SPDXID, "DEPENDS_ON", "SPDXRef-Package-go"},
	}
	for i, m := range b.Info.Deps {
		if m.Replace != nil {
			m = m.Replace
		}
		p := pkg{
			Name: m.Path, SPDXID: fmt.Sprintf("SPDXRef-Package-dep-%d", i), VersionInfo: m.Version,
			DownloadLocation: "NOASSERTION", ExternalRefs: purl(m.Path, m.Version),
		}
		if m.Sum != "" {
			p.Comment = "go.sum " + m.Sum
		}
		pkgs = append(pkgs, p)
		rels = append(rels, rel{main.SPDXID, "DEPENDS_ON", p.SPDXID})
	}
	doc := map[string]any{
		"spdxVersion":       "SPDX-2.3",
		"dataLicense":       "CC0-1.0",
		"SPDXID":            "SPDXRef-DOCUMENT",
		"name":              fmt.Sprintf("muster-%s-linux-%s", b.Version, goarch),
		"documentNamespace": fmt.Sprintf("%s/spdx/muster-%s-linux-%s-%s", source, b.Version, goarch, digest.Hex),
		"creationInfo": map[string]any{
			"created":  b.Created.UTC().Format(time.RFC3339),
			"creators": []string{"Tool: muster-image"},
		},
		"packages":      pkgs,
		"relationships": rels,
	}
	out, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(out, '\n'), nil
}

// SBOMName is the file name of the SBOM of a release's goarch image.
func SBOMName(version, goarch string) string {
	return fmt.Sprintf("muster-%s-linux-%s.spdx.json", version, goarch)
}
