// Package image builds muster's OCI image without a Docker daemon or a
// registry: it runs `go build` for a static linux binary (CGO_ENABLED=0,
// -trimpath) and assembles the image from scratch with go-containerregistry,
// then writes it as an OCI image layout directory or a `docker load`
// tarball. cmd/muster-image is its command line.
//
// The image holds two layers and nothing else: a base (a minimal
// /etc/passwd and /etc/group naming one non-root user, uid and gid 65532,
// /tmp and the user's home; a CA bundle only when one is asked for) and
// the binary at /usr/local/bin/muster, which carries Mozilla's root
// certificates itself. There is no shell and no package manager, so a
// compromised process finds no tools, and the image has no base image to
// patch: rebuilding it is the update.
//
// Two builds of the same tree with the same toolchain give the same
// digest: -trimpath keeps build paths out of the binary, every tar entry
// has fixed owners and one fixed mtime, nothing is read from the build
// machine, and the image's creation time is SOURCE_DATE_EPOCH when set,
// else the commit time the build stamped (vcs.time), else the Unix epoch.
// The labels are read back from the built binary's own build information,
// so the image's revision label and what `muster version` prints inside
// it cannot disagree.
//
// BuildRelease builds the image the Helm chart runs by default: an OCI
// image index for linux/amd64 and linux/arm64 whose version (label, tag,
// and the version linked into the binary) is the chart's appVersion and
// whose time is the release commit's; SBOM writes an SPDX document per
// architecture from the binary's build information.
package image
