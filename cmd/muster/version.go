package main

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/musterhq/muster/internal/cli"
)

// version, when set by the linker (-ldflags "-X main.version=0.1.0", as
// the release image build does), is the release this binary is: the Helm
// chart's appVersion. Without it the module version Go stamped is printed,
// which is "(devel)" for a build of a checkout.
var version string

// cmdVersion prints what the binary knows of its own build: the module
// version, the Go toolchain and platform, and the VCS revision and commit
// time when the build stamped them. Builds with -buildvcs=false (CI's) or
// outside a repository carry no revision, and it prints none rather than
// guessing one.
func cmdVersion(args []string, stdout, stderr io.Writer) error {
	fs := cli.NewFlags("version", stderr)
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		// Only a binary built without module support lacks build info.
		info = &debug.BuildInfo{GoVersion: runtime.Version()}
	}
	fmt.Fprint(stdout, versionText(info))
	return nil
}

// versionText renders info as `muster version` prints it:
//
//	muster v1.2.3 go1.26.8 linux/amd64
//	revision 0b96531… 2026-12-03T09:00:00Z (modified)
//
// The second line is there only when the build recorded a revision.
func versionText(info *debug.BuildInfo) string {
	v := info.Main.Version
	if version != "" {
		v = version
	}
	if v == "" {
		v = "(devel)"
	}
	settings := map[string]string{}
	for _, s := range info.Settings {
		settings[s.Key] = s.Value
	}
	goos, goarch := settings["GOOS"], settings["GOARCH"]
	if goos == "" {
		goos, goarch = runtime.GOOS, runtime.GOARCH
	}
	var b strings.Builder
	fmt.Fprintf(&b, "muster %s %s %s/%s\n", v, info.GoVersion, goos, goarch)
	if rev := settings["vcs.revision"]; rev != "" {
		b.WriteString("revision " + rev)
		if t := settings["vcs.time"]; t != "" {
			b.WriteString(" " + t)
		}
		if settings["vcs.modified"] == "true" {
			b.WriteString(" (modified)")
		}
		b.WriteString("\n")
	}
	return b.String()
}
