package main

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/testbin"
)

// tourCommands returns the shell lines of the README's first tour of the
// API: its indented code, from "## A first tour of the API" to the next
// section, as a newcomer would paste it.
func tourCommands(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	start := strings.Index(s, "\n## A first tour of the API\n")
	if start < 0 {
		t.Fatal(`the README has no "## A first tour of the API" section`)
	}
	s = s[start+1:]
	if end := strings.Index(s, "\n## "); end >= 0 {
		s = s[:end]
	}
	var cmds []string
	for line := range strings.Lines(s) {
		if code, ok := strings.CutPrefix(line, "    "); ok {
			cmds = append(cmds, strings.TrimRight(code, "\n"))
		}
	}
	if len(cmds) < 20 {
		t.Fatalf("the README's tour has %d lines of commands", len(cmds))
	}
	return strings.Join(cmds, "\n") + "\n"
}

// tourShell runs the README's commands as they stand: `go run
// ./cmd/muster` is muster built from this tree (musterBinary),
// curl is the real curl, its every answer's status written to $CALLS
// ("STATUS METHOD URL"), and a stream read to its --max-time (curl's exit
// status 28) is a success. Any other failing command fails the script.
const tourShell = `set -euo pipefail
go() {
	if [ "${1:-}" = run ] && [ "${2:-}" = ./cmd/muster ]; then
		shift 2
		"$MUSTER_EXE" "$@"
	else
		echo "the tour runs go $*, which is not muster" >&2
		return 1
	fi
}
curl() {
	local out rc=0
	out=$(command curl --max-time 30 -w '\n%{http_code} %{method} %{url_effective}' "$@") || rc=$?
	printf '%s\n' "${out%$'\n'*}"
	printf '%s\n' "${out##*$'\n'}" >>"$CALLS"
	[ "$rc" -eq 0 ] || [ "$rc" -eq 28 ]
}
`

// TestREADMETour runs the README's first tour of the API, line by line as
// it is printed, against a real muster dev started the way the README
// starts it (its data in ./.muster of the folder the commands run in):
// every command must work, and every call must answer what the tour
// says it does. (Not parallel: the tour retries nothing, as a newcomer
// would not, and beside the parallel tests on a loaded machine a
// registration was answered 503, its database past the 1.5 s budget.)
func TestREADMETour(t *testing.T) {
	realTime(t, "the README's tour against muster dev")
	testbin.Require(t, "curl")
	testbin.Require(t, "jq")
	exe := musterBinary(t)
	work := devDir(t)
	dir := filepath.Join(work, ".muster")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	srv := startProcess(t, dir, addr)
	t.Cleanup(func() {
		_ = srv.Process.Signal(os.Interrupt)
		_ = srv.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = db.StopDir(ctx, dir)
	})

	script := strings.ReplaceAll(tourCommands(t), "localhost:8080", addr)
	script = strings.ReplaceAll(script, "/tmp/web-cache", filepath.Join(work, "web-cache"))
	// muster resolve's --server defaults to muster dev's default address.
	script = strings.ReplaceAll(script, "go run ./cmd/muster resolve web", "go run ./cmd/muster resolve web --server http://"+addr)
	calls := filepath.Join(work, "calls")
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", tourShell+script)
	cmd.Dir = work
	cmd.Env = append(os.Environ(), "MUSTER_EXE="+exe, "CALLS="+calls)
	out, err := cmd.CombinedOutput()
	if err != nil {
		recorded, _ := os.ReadFile(calls)
		t.Fatalf("the README's tour failed: %v\n%s\ncalls:\n%s", err, out, recorded)
	}

	// Each call answers what the tour says: the writes succeed, the step
	// inside the dwell and the early confirmation are refused 409, and
	// the override of web's only instance is admitted or refused by the
	// budget (409), never refused as malformed or unauthorised.
	want := []struct {
		method, path string
		status       []string
	}{
		{"PUT", "/v1/services/web", []string{"201"}},
		{"PUT", "/v1/services/web/contract", []string{"200"}},
		{"POST", "/v1/services/web/instances", []string{"201"}},
		{"PUT", "/v1/instances/*/lease", []string{"200", "204"}},
		{"POST", "/v1/services/web/instances", []string{"201"}},
		{"GET", "/v1/audit?limit=20", []string{"200"}},
		{"PUT", "/v1/probers/prober-az1/assignments", []string{"200"}},
		{"POST", "/v1/reports", []string{"200"}},
		{"GET", "/v1/services/web/eligibility", []string{"200"}},
		{"PUT", "/v1/services/api", []string{"201"}},
		{"PUT", "/v1/services/web/grants", []string{"200"}},
		{"GET", "/v1/watch?service=web", []string{"200"}},
		{"GET", "/v1/alarms", []string{"200"}},
		{"POST", "/v1/shifts", []string{"201"}},
		{"POST", "/v1/shifts/*/step", []string{"409"}},
		{"POST", "/v1/shifts/*/confirm", []string{"409"}},
		{"GET", "/v1/shifts?state=pending_confirmation", []string{"200"}},
		{"POST", "/v1/overrides", []string{"201", "409"}},
	}
	f, err := os.Open(calls)
	if err != nil {
		t.Fatalf("no calls recorded: %v\n%s", err, out)
	}
	defer f.Close()
	var got []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		got = append(got, sc.Text())
	}
	if len(got) != len(want) {
		t.Fatalf("the tour made %d calls, want %d:\n%s\n\noutput:\n%s", len(got), len(want), strings.Join(got, "\n"), out)
	}
	for i, w := range want {
		status, rest, _ := strings.Cut(got[i], " ")
		method, url, _ := strings.Cut(rest, " ")
		path := strings.TrimPrefix(url, "http://"+addr)
		if method != w.method || !pathMatches(w.path, path) || !slices.Contains(w.status, status) {
			t.Errorf("call %d: %s, want %s %s answered %v", i+1, got[i], w.method, w.path, w.status)
		}
	}
	// The shell lines that are not calls did their part too: the audit
	// chain verified, and muster resolve answered from the live stream.
	for _, s := range []string{"audit chain intact", "web version", "(live)", `"source":"live"`} {
		if !strings.Contains(string(out), s) {
			t.Errorf("the tour's output lacks %q", s)
		}
	}
	if t.Failed() {
		t.Logf("the tour's output:\n%s\ncalls:\n%s", out, strings.Join(got, "\n"))
	}
}

// pathMatches reports whether path matches pattern, where a * stands
// for one path segment.
func pathMatches(pattern, path string) bool {
	ps, gs := strings.Split(pattern, "/"), strings.Split(path, "/")
	if len(ps) != len(gs) {
		return false
	}
	for i := range ps {
		if ps[i] != "*" && ps[i] != gs[i] {
			return false
		}
	}
	return true
}
