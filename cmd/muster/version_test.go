package main

import (
	"runtime"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestVersion: `muster version` names the toolchain and platform this test
// binary was built with, and refuses arguments like every subcommand.
func TestVersion(t *testing.T) {
	t.Parallel()
	out, errOut, err := runCmd(t, "version")
	if err != nil {
		t.Fatalf("muster version: %v %s", err, errOut)
	}
	first, _, _ := strings.Cut(out, "\n")
	f := strings.Fields(first)
	if len(f) != 4 || f[0] != "muster" || f[2] != runtime.Version() || f[3] != runtime.GOOS+"/"+runtime.GOARCH {
		t.Errorf("muster version printed %q, want muster VERSION %s %s/%s", out, runtime.Version(), runtime.GOOS, runtime.GOARCH)
	}
	_, _, err = runCmd(t, "version", "extra")
	if exitCode(err) != 2 {
		t.Errorf("muster version extra: exit %d (%v), want 2", exitCode(err), err)
	}
	usage, _, _ := runCmd(t, "help")
	if !strings.Contains(usage, "muster version") {
		t.Errorf("usage does not mention muster version:\n%s", usage)
	}
}

func TestVersionText(t *testing.T) {
	t.Parallel()
	settings := func(kv ...string) []debug.BuildSetting {
		var s []debug.BuildSetting
		for i := 0; i < len(kv); i += 2 {
			s = append(s, debug.BuildSetting{Key: kv[i], Value: kv[i+1]})
		}
		return s
	}
	for _, tc := range []struct {
		name string
		info debug.BuildInfo
		want string
	}{{
		name: "built with -buildvcs=false",
		info: debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"},
			Settings: settings("GOOS", "linux", "GOARCH", "arm64", "CGO_ENABLED", "0")},
		want: "muster (devel) go1.26.8 linux/arm64\n",
	}, {
		name: "stamped clean",
		info: debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v0.3.0"},
			Settings: settings("GOOS", "linux", "GOARCH", "amd64", "vcs.revision", "0b96531", "vcs.time", "2026-12-03T09:00:00Z", "vcs.modified", "false")},
		want: "muster v0.3.0 go1.26.8 linux/amd64\nrevision 0b96531 2026-12-03T09:00:00Z\n",
	}, {
		name: "stamped with local changes",
		info: debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v0.0.0-20261203090000-0b96531+dirty"},
			Settings: settings("GOOS", "linux", "GOARCH", "amd64", "vcs.revision", "0b96531", "vcs.time", "2026-12-03T09:00:00Z", "vcs.modified", "true")},
		want: "muster v0.0.0-20261203090000-0b96531+dirty go1.26.8 linux/amd64\nrevision 0b96531 2026-12-03T09:00:00Z (modified)\n",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, versionText(&tc.info)); diff != "" {
				t.Errorf("versionText (-want +got):\n%s", diff)
			}
		})
	}
}
