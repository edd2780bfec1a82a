// Command muster-image builds muster's OCI image from this repository
// without a Docker daemon or a registry:
//
//	go run ./cmd/muster-image --out DIR [--tar FILE] [--goarch amd64] [--tag latest]
//	go run ./cmd/muster-image --release --out DIR [--sbom-dir DIR]
//
// --release builds the image the Helm chart runs by default: an OCI image
// index for linux/amd64 and linux/arm64, tagged and labelled with the
// chart's appVersion, dated by the checked-out commit (or
// SOURCE_DATE_EPOCH), with an SPDX SBOM per architecture written beside
// the layout. Two release builds of one commit give one index digest.
//
// It compiles ./cmd/muster statically for linux (see internal/image) and
// writes an OCI image layout directory (--out), a tarball for `docker load`
// or `podman load` (--tar), or both, then prints the image's digest.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/musterhq/muster/internal/image"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		if errors.Is(err, flag.ErrHelp) || errors.Is(err, errUsage) {
			os.Exit(2)
		}
		fmt.Fprintln(os.Stderr, "muster-image:", err)
		os.Exit(1)
	}
}

var errUsage = errors.New("usage")

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var (
		cfg          image.Config
		out, tarFile string
		tag, repo    string
		verbose      bool
		release      bool
		sbomDir      string
	)
	fs := flag.NewFlagSet("muster-image", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&out, "out", "", "write an OCI image layout to this directory (new, empty, or a layout to update)")
	fs.StringVar(&tarFile, "tar", "", "write a `docker load` tarball to this file")
	fs.StringVar(&tag, "tag", "latest", "the image's tag in the layout and the tarball")
	fs.StringVar(&repo, "repo", "muster", "the image's name in the tarball")
	fs.StringVar(&cfg.GOARCH, "goarch", "amd64", "target architecture (GOOS is linux)")
	fs.StringVar(&cfg.Src, "src", "", "module root to build (default: the module holding the current directory)")
	fs.StringVar(&cfg.CACerts, "ca-certs", "", "PEM CA bundle to copy to "+image.CACertPath+" (default none: the binary carries Mozilla's roots)")
	fs.BoolVar(&release, "release", false, "build the release: an index for linux/amd64 and linux/arm64 tagged with the chart's appVersion (needs --out)")
	fs.StringVar(&sbomDir, "sbom-dir", "", "with --release, where the SPDX SBOMs go (default the directory holding --out)")
	fs.StringVar(&cfg.Source, "source", "https://github.com/musterhq/muster", "the "+image.LabelSource+" label")
	fs.StringVar(&cfg.Licenses, "licenses", "NOASSERTION", "the "+image.LabelLicenses+" label (an SPDX expression)")
	fs.BoolVar(&verbose, "v", false, "show go build's output")
	if err := fs.Parse(args); err != nil {
		return errUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "muster-image: unexpected argument %q\n", fs.Arg(0))
		return errUsage
	}
	if release {
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		for _, n := range []string{"tar", "tag", "goarch", "ca-certs", "repo"} {
			if set[n] {
				fmt.Fprintf(stderr, "muster-image: --release fixes what --%s would set; leave it out\n", n)
				return errUsage
			}
		}
		if out == "" {
			fmt.Fprintln(stderr, "muster-image: --release needs --out DIR, a new directory for the OCI layout")
			return errUsage
		}
	}
	if out == "" && tarFile == "" {
		fmt.Fprintln(stderr, "muster-image: say where the image goes: --out DIR and/or --tar FILE")
		return errUsage
	}
	if v := os.Getenv("SOURCE_DATE_EPOCH"); v != "" {
		sec, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return fmt.Errorf("SOURCE_DATE_EPOCH %q is not a number of seconds: %w", v, err)
		}
		cfg.Created = time.Unix(sec, 0)
	}
	if cfg.Src == "" {
		root, err := image.ModuleRoot(ctx, ".")
		if err != nil {
			return err
		}
		cfg.Src = root
	}
	if verbose {
		cfg.BuildOutput = stderr
	}
	if release {
		if sbomDir == "" {
			sbomDir = filepath.Dir(filepath.Clean(out))
		}
		return runRelease(ctx, cfg, out, sbomDir, stdout)
	}

	built, err := image.Build(ctx, cfg)
	if err != nil {
		return err
	}
	digest, err := built.Image.Digest()
	if err != nil {
		return err
	}
	if out != "" {
		if err := image.WriteLayout(out, built.Image, tag); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "wrote %s:%s\n", out, tag)
	}
	if tarFile != "" {
		if err := image.WriteTar(tarFile, built.Image, repo+":"+tag); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "wrote %s (%s:%s)\n", tarFile, repo, tag)
	}
	rev := built.Revision
	if rev == "" {
		rev = "unknown (built with -buildvcs=false or outside a repository)"
	} else if built.Modified {
		rev += " (modified)"
	}
	fmt.Fprintf(stdout, "muster %s linux/%s, revision %s, created %s\n%s\n",
		built.Version, cfg.GOARCH, rev, built.Created.Format(time.RFC3339), digest)
	return nil
}

func runRelease(ctx context.Context, cfg image.Config, out, sbomDir string, stdout io.Writer) error {
	r, err := image.BuildRelease(ctx, image.ReleaseConfig{
		Src: cfg.Src, Created: cfg.Created, Source: cfg.Source, Licenses: cfg.Licenses,
		BuildOutput: cfg.BuildOutput,
	})
	if err != nil {
		return err
	}
	if err := image.WriteIndexLayout(out, r.Index, r.Version); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote %s:%s\n", out, r.Version)
	for i, arch := range image.ReleasePlatforms {
		sbom, err := image.SBOM(r.Images[i], arch, cfg.Source)
		if err != nil {
			return err
		}
		path := filepath.Join(sbomDir, image.SBOMName(r.Version, arch))
		if err := os.WriteFile(path, sbom, 0o644); err != nil {
			return err
		}
		d, err := r.Images[i].Image.Digest()
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "linux/%s %s, SBOM %s\n", arch, d, path)
	}
	digest, err := r.Index.Digest()
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "muster %s (linux/amd64, linux/arm64), revision %s, created %s\n%s\n",
		r.Version, r.Images[0].Revision, r.Created.Format(time.RFC3339), digest)
	return nil
}
