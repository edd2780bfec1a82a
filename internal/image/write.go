package image

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/match"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// refName is the index annotation naming an image in an OCI layout; umoci
// and skopeo address the image as DIR:TAG by it.
const refName = "org.opencontainers.image.ref.name"

// WriteLayout writes img into the OCI image layout directory dir under
// tag. A dir that does not exist or is empty becomes a new layout; in an
// existing layout the image replaces the one tagged tag, and the other
// images stay (the replaced one's blobs stay too, unreferenced). Any other
// non-empty directory is refused rather than written into.
func WriteLayout(dir string, img v1.Image, tag string) error {
	opt := layout.WithAnnotations(map[string]string{refName: tag})
	if _, err := os.Stat(filepath.Join(dir, "index.json")); err == nil {
		p, err := layout.FromPath(dir)
		if err != nil {
			return fmt.Errorf("open the OCI layout %s: %w", dir, err)
		}
		if err := p.ReplaceImage(img, match.Annotation(refName, tag), opt); err != nil {
			return fmt.Errorf("write the image into %s: %w", dir, err)
		}
		return nil
	}
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if len(entries) > 0 {
		return fmt.Errorf("%s is neither empty nor an OCI image layout (it has no index.json); refusing to write into it", dir)
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return fmt.Errorf("create the OCI layout %s: %w", dir, err)
	}
	if err := p.AppendImage(img, opt); err != nil {
		return fmt.Errorf("write the image into %s: %w", dir, err)
	}
	return nil
}

// WriteTar writes img to file as a tarball `docker load` and `podman load`
// take, named ref (e.g. muster:latest).
func WriteTar(file string, img v1.Image, ref string) error {
	tag, err := name.NewTag(ref)
	if err != nil {
		return fmt.Errorf("image name %q: %w", ref, err)
	}
	if err := tarball.WriteToFile(file, tag, img); err != nil {
		return fmt.Errorf("write %s: %w", file, err)
	}
	return nil
}
