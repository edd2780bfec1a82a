// Package archtest holds the tests that keep muster's layout honest: the
// import rules of docs/ARCHITECTURE.md, checked on the packages as `go
// list` sees them, so a rule broken anywhere fails CI with the import
// that broke it.
package archtest

import (
	"bufio"
	"bytes"
	"os"
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

// TestPureCoresDoNoIO: eligibility/, assembler/ and preview/ are
// functions of (state, input, now). They import only standard packages
// that do no I/O, uuid, and (the assembler, the preview) the cores below
// them; nothing of muster's that touches the network or the database.
func TestPureCoresDoNoIO(t *testing.T) {
	pkgs := listPackages(t)
	allowed := map[string][]string{
		"internal/eligibility": {"github.com/google/uuid"},
		"internal/assembler":   {"github.com/google/uuid", module + "/internal/eligibility"},
		"internal/preview":     {"github.com/google/uuid", module + "/internal/eligibility", module + "/internal/assembler"},
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

// TestHandlersNeverImportDB: the HTTP surface (server/), the UI's
// handlers (internal/webui) and its components (views/) decode, call a
// domain package and encode; SQL and sqlc's types stay behind the domain
// packages (STYLE.md habits 3 and 5). (webui holds a pool for its session
// store, which needs a database/sql handle; it runs no query.)
func TestHandlersNeverImportDB(t *testing.T) {
	pkgs := listPackages(t)
	seen := 0
	for name, p := range pkgs {
		if !under(name, "server") && !under(name, "views") && !under(name, "internal/webui") {
			continue
		}
		if strings.HasSuffix(name, "test") {
			continue // test harnesses (servertest, apptest) build the stack
		}
		seen++
		for _, imp := range p.imports {
			if under(strings.TrimPrefix(imp, module+"/"), "db") && strings.HasPrefix(imp, module+"/") {
				t.Errorf("%s imports %s: handlers call domain packages, never the database", name, imp)
			}
		}
	}
	if seen < 3 {
		t.Fatalf("found %d handler packages; the rule checks nothing", seen)
	}
}

// TestDomainKnowsNoHTTPSurface: the domain packages under internal/ know
// nothing of HTTP's surface. Only the composition root (internal/app and
// its test harness), the UI's handlers (internal/webui) and the command
// import server/, views/, static/ or openapi/; server/ and views/ import
// internal/ packages, never the other way round.
func TestDomainKnowsNoHTTPSurface(t *testing.T) {
	surface := []string{"server", "views", "static", "openapi"}
	allowed := []string{"internal/app", "internal/webui", "cmd"}
	for name, p := range listPackages(t) {
		if !under(name, "internal") || slices.ContainsFunc(allowed, func(a string) bool { return under(name, a) }) {
			continue
		}
		for _, imp := range p.imports {
			rel, ok := strings.CutPrefix(imp, module+"/")
			if ok && slices.ContainsFunc(surface, func(s string) bool { return under(rel, s) }) {
				t.Errorf("%s imports %s: a domain package knows nothing of the HTTP surface; let server/ or internal/app call it instead", name, imp)
			}
		}
	}
}

// under reports whether the module-relative package path is dir or a
// package below it.
func under(path, dir string) bool {
	return path == dir || strings.HasPrefix(path, dir+"/")
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

// cardTop is the design card's top level: the packages that stand at the
// module's root. Everything else lives under internal/ (or is the public
// client, resolver/, or the command, cmd/).
var cardTop = []string{"server", "db", "queries", "views", "static", "openapi", "migrations"}

// TestPackagesFollowTheCard: every package is one of the card's top-level
// packages (or below one: db/dbtest), the public client, the command, or
// under internal/, so no other package becomes importable by accident.
func TestPackagesFollowTheCard(t *testing.T) {
	pkgs := listPackages(t)
	for name := range pkgs {
		top, _, _ := strings.Cut(name, "/")
		switch {
		case slices.Contains(cardTop, top), top == "resolver", top == "cmd", top == "internal":
		default:
			t.Errorf("package %s stands outside the card's layout; move it under internal/ (the card's top level is %v, with resolver/ and cmd/)", name, cardTop)
		}
	}
	for _, want := range []string{"server", "db", "db/dbtest", "views", "static", "openapi", "migrations", "resolver", "cmd/muster"} {
		if _, ok := pkgs[want]; !ok {
			t.Errorf("package %s is missing from the card's top level", want)
		}
	}
}

// TestTopLevelIsTheCard: a newcomer's ls shows the design card: its
// folders and files are there, and no other folder is, but internal/
// (every other package), resolver/ (the public client), docs/, scripts/,
// deploy/ (the Helm chart, issue 28: no Go there, which
// TestPackagesFollowTheCard holds) and the dot-folders.
func TestTopLevelIsTheCard(t *testing.T) {
	root := moduleRoot(t)
	entries, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, e := range entries {
		have[e.Name()] = true
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		if !slices.Contains(cardTop, e.Name()) && !slices.Contains([]string{"cmd", "internal", "resolver", "docs", "scripts", "deploy"}, e.Name()) {
			t.Errorf("folder %s/ at the top level is not on the design card; move it under internal/ (or docs/)", e.Name())
		}
	}
	for _, want := range append(slices.Clone(cardTop), "cmd", "go.mod", "sqlc.yaml", "README.md") {
		if !have[want] {
			t.Errorf("%s is missing from the top level", want)
		}
	}
}
