// Package archtest holds the tests that keep muster's layout honest: the
// import rules of docs/ARCHITECTURE.md, checked on the packages as `go
// list` sees them, so a rule broken anywhere fails CI with the import
// that broke it.
package archtest

import (
	"bufio"
	"bytes"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/musterhq/muster"

// pkg is one package of the module as go list reports it.
type pkg struct {
	path    string   // relative to the module, e.g. "internal/assembler"
	imports []string // direct imports, full paths
	deps    []string // every package it depends on, full paths
}

// listPackages runs go list over the module.
func listPackages(t *testing.T) map[string]pkg {
	t.Helper()
	cmd := exec.Command("go", "list", "-f", "{{.ImportPath}}\t{{join .Imports \" \"}}\t{{join .Deps \" \"}}", module+"/...")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	pkgs := map[string]pkg{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 16<<20)
	for sc.Scan() {
		f := strings.Split(sc.Text(), "\t")
		if len(f) != 3 {
			t.Fatalf("go list line %q", sc.Text())
		}
		rel := strings.TrimPrefix(strings.TrimPrefix(f[0], module), "/")
		pkgs[rel] = pkg{path: rel, imports: strings.Fields(f[1]), deps: strings.Fields(f[2])}
	}
	if len(pkgs) < 10 {
		t.Fatalf("go list found %d packages", len(pkgs))
	}
	return pkgs
}

// std reports whether path is in the standard library (its first element
// has no dot).
func std(path string) bool {
	first, _, _ := strings.Cut(path, "/")
	return !strings.Contains(first, ".")
}

// doesIO lists the standard packages through which a package reaches
// the world (network, files, processes, the system, logging) or hidden
// input (randomness): the pure cores take their input and their clock
// as arguments instead.
func doesIO(path string) bool {
	for _, p := range []string{"net", "os", "io/fs", "io/ioutil", "database", "syscall", "log", "runtime/pprof", "crypto/rand", "math/rand", "plugin", "debug"} {
		if path == p || strings.HasPrefix(path, p+"/") {
			return true
		}
	}
	return false
}

// TestPureCoresDoNoIO: eligibility/ and assembler/ are functions of
// (state, input, now). They import only standard packages that do no
// I/O, uuid, and (the assembler) the eligibility core; nothing of
// muster's that touches the network or the database.
func TestPureCoresDoNoIO(t *testing.T) {
	pkgs := listPackages(t)
	allowed := map[string][]string{
		"internal/eligibility": {"github.com/google/uuid"},
		"internal/assembler":   {"github.com/google/uuid", module + "/internal/eligibility"},
	}
	for name, extra := range allowed {
		p, ok := pkgs[name]
		if !ok {
			t.Fatalf("package %s not found", name)
		}
		for _, imp := range p.imports {
			switch {
			case std(imp) && doesIO(imp):
				t.Errorf("%s imports %s, which does I/O; take what it gives as an argument instead", name, imp)
			case !std(imp) && !slices.Contains(extra, imp):
				t.Errorf("%s imports %s; the pure core may import only the standard library and %v", name, imp, extra)
			}
		}
	}
}

// TestHandlersNeverImportDB: the HTTP surface and the UI decode, call a
// domain package and encode; SQL and sqlc's types stay behind the
// domain packages (STYLE.md habits 3 and 5). (webui holds a pool for its
// session store, which needs a database/sql handle; it runs no query.)
func TestHandlersNeverImportDB(t *testing.T) {
	pkgs := listPackages(t)
	for name, p := range pkgs {
		if name != "internal/server" && name != "internal/webui" && name != "internal/views" && !strings.HasPrefix(name, "internal/server/") && !strings.HasPrefix(name, "internal/webui/") {
			continue
		}
		if strings.HasSuffix(name, "test") {
			continue // test harnesses (servertest, apptest) build the stack
		}
		for _, imp := range p.imports {
			if imp == module+"/internal/db" {
				t.Errorf("%s imports %s: handlers call domain packages, never the database", name, imp)
			}
		}
	}
}

// TestResolverIsALeaf: the client library other programs import pulls in
// nothing but the standard library, so importing it costs a caller none
// of the server's dependencies.
func TestResolverIsALeaf(t *testing.T) {
	pkgs := listPackages(t)
	p, ok := pkgs["resolver"]
	if !ok {
		t.Fatal("package resolver not found")
	}
	for _, d := range p.deps {
		if !std(d) {
			t.Errorf("resolver depends on %s; it may depend on the standard library only", d)
		}
	}
}

// TestOnlyTheClientIsPublic: everything but the public client library
// (resolver/) and the command (cmd/) lives under internal/, so no other
// module can come to depend on muster's internals.
func TestOnlyTheClientIsPublic(t *testing.T) {
	for name := range listPackages(t) {
		switch {
		case name == "resolver", strings.HasPrefix(name, "resolver/"):
		case strings.HasPrefix(name, "cmd/"):
		case strings.HasPrefix(name, "internal/"):
		default:
			t.Errorf("package %s is importable by other modules; move it under internal/ (only resolver/ is public)", name)
		}
	}
}
