package main

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/db/dbtest"
	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/ownership"
	"github.com/musterhq/muster/internal/streamcheck"
	"github.com/musterhq/muster/internal/wait"
)

// previousRelease is the last release before this one: the upgrade test
// builds it from git and runs it beside this release. Move it forward at
// every release (to the commit released), so that each release is shown
// to work in a region with the one before it.
const previousRelease = "7b2f2e198920a60a307326457c43a57d2af13a88"

// buildRelease builds muster at commit as musterBinary builds this tree
// (-trimpath, cgo off; -race with MUSTER_TEST_CHILD_RACE=1), so the
// dependencies' packages come from the build cache, and returns the
// binary. The source is taken with git archive, so the repository's
// worktrees and refs are not touched. Source and binary are kept under
// the system's temporary folder by commit, Go version and race detector,
// and reused by later runs. A repository without history (a shallow
// clone) skips the test.
func buildRelease(t *testing.T, commit string) string {
	t.Helper()
	git := func(args ...string) (string, error) {
		out, err := exec.Command("git", args...).Output()
		return strings.TrimSpace(string(out)), err
	}
	top, err := git("rev-parse", "--show-toplevel")
	if err != nil {
		t.Skipf("not a git repository (%v): the previous release cannot be built from history", err)
	}
	if shallow, _ := git("-C", top, "rev-parse", "--is-shallow-repository"); shallow == "true" {
		if _, err := git("-C", top, "cat-file", "-e", commit+"^{commit}"); err != nil {
			t.Skipf("a shallow clone without the previous release %s: fetch the history (git fetch --unshallow) to run this test", commit[:12])
		}
	}
	if _, err := git("-C", top, "cat-file", "-e", commit+"^{commit}"); err != nil {
		t.Fatalf("the previous release %s is not in this repository's history: %v", commit, err)
	}
	// The go command that runs these tests is on PATH (go test).
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("no go command to build the previous release: %v", err)
	}
	flavour := "norace"
	if childRace() {
		flavour = "race"
	}
	home := filepath.Join(os.TempDir(), fmt.Sprintf("muster-release-%s-%s-%s", commit[:12], runtime.Version(), flavour))
	src, exe := filepath.Join(home, "src"), filepath.Join(home, "muster")
	if _, err := os.Stat(exe); err == nil {
		return exe
	}
	if err := os.MkdirAll(home, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(src); err != nil {
		// Extracted beside, then renamed: a run beside this one never
		// sees half a tree.
		tmp, err := os.MkdirTemp(home, "src-")
		if err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(tmp)
		if err := gitArchive(top, commit, tmp); err != nil {
			t.Fatalf("extract the previous release %s: %v", commit[:12], err)
		}
		if err := os.Rename(tmp, src); err != nil && !errors.Is(err, os.ErrExist) {
			if _, serr := os.Stat(src); serr != nil {
				t.Fatal(err)
			}
		}
	}
	out, err := os.CreateTemp(home, "muster-*.tmp")
	if err != nil {
		t.Fatal(err)
	}
	out.Close()
	defer os.Remove(out.Name())
	began := time.Now()
	args := []string{"build", "-trimpath", "-buildvcs=false", "-o", out.Name()}
	env := append(os.Environ(), "GOTOOLCHAIN=local", "GOWORK=off", "GOFLAGS=-buildvcs=false")
	if childRace() {
		args = append(args, "-race")
	} else {
		env = append(env, "CGO_ENABLED=0")
	}
	cmd := exec.Command(goTool, append(args, "./cmd/muster")...)
	cmd.Dir = src
	cmd.Env = env
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the previous release %s: %v\n%s", commit[:12], err, b)
	}
	if err := os.Rename(out.Name(), exe); err != nil {
		t.Fatal(err)
	}
	t.Logf("built the previous release %s in %s", commit[:12], time.Since(began).Round(time.Second))
	return exe
}

// gitArchive writes the tree of commit, from the repository at top, into
// dir.
func gitArchive(top, commit, dir string) error {
	cmd := exec.Command("git", "-C", top, "archive", "--format=tar", commit)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	rd := tar.NewReader(out)
	var werr error
	for werr == nil {
		h, err := rd.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			werr = err
			break
		}
		name := filepath.Join(dir, filepath.FromSlash(h.Name))
		if !strings.HasPrefix(name, filepath.Clean(dir)+string(filepath.Separator)) {
			werr = fmt.Errorf("archive entry %q outside the tree", h.Name)
			break
		}
		switch h.Typeflag {
		case tar.TypeDir:
			werr = os.MkdirAll(name, 0o755)
		case tar.TypeReg:
			werr = writeFile(name, rd, os.FileMode(h.Mode).Perm())
		case tar.TypeSymlink:
			werr = os.Symlink(h.Linkname, name)
		}
	}
	if werr != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return werr
	}
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("git archive: %w: %s", err, stderr.String())
	}
	return nil
}

func writeFile(name string, r io.Reader, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(name, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// metricSum sums the samples of metric name in a Prometheus text
// exposition whose labels include every one of want ("peer=\"x\"").
func metricSum(exposition []byte, name string, want ...string) (sum float64, series int) {
	for _, line := range strings.Split(string(exposition), "\n") {
		rest, ok := strings.CutPrefix(line, name)
		if !ok || (rest != "" && rest[0] != '{' && rest[0] != ' ') {
			continue
		}
		labels, value := "", rest
		if strings.HasPrefix(rest, "{") {
			end := strings.IndexByte(rest, '}')
			labels, value = rest[:end+1], rest[end+1:]
		}
		if slices.ContainsFunc(want, func(w string) bool { return !strings.Contains(labels, w) }) {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			continue
		}
		sum += v
		series++
	}
	return sum, series
}

// TestPreviousReleaseBesideThisOne: a rolling upgrade runs two releases in
// one region. The previous release (previousRelease, built from git) is
// started first on a fresh data folder, then this release on the same
// folder: two replicas on one PostgreSQL. For a service each of them
// owns (read from GET /v1/replicas and ownership.ShardOf, whatever the
// split), a hard failure is reported to the other one: evidence flows
// from the old release to the new and from the new to the old, and each
// withdrawal reaches a subscriber on both replicas. Neither forwarder
// dropped or had refused anything, and no frame a subscriber took was
// out of order or left a service empty. The release before neither seals
// its row of table replicas nor signs its requests the new way, so this
// release runs in upgrade mode (MUSTER_PEER_TRUST=upgrade), as a rolling
// upgrade from it must, and raises peer_trust_upgrade; a third replica
// of this release started strict at the end does not follow the old one
// and names its row in replica_unsealed.
func TestPreviousReleaseBesideThisOne(t *testing.T) {
	realTime(t, "the previous release built from git and run beside this one")
	t.Parallel()
	exe := buildRelease(t, previousRelease)
	began := time.Now()

	dir := devDir(t)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = db.StopDir(ctx, dir)
	})
	env := []string{"MUSTER_LEASE_TTL=10m", "MUSTER_REGISTRATION_LIMIT=1000000/1m"}
	oldAddr, newAddr := freeAddr(t), freeAddr(t)
	// The previous release first: it refuses a schema newer than it knows.
	oldProc, _ := startBinaryServing(t, exe, dir, oldAddr, env...)
	newProc := startProcess(t, dir, newAddr, append([]string{"MUSTER_PEER_TRUST=upgrade"}, env...)...)
	t.Cleanup(func() {
		for _, p := range []*exec.Cmd{oldProc, newProc} {
			_ = p.Process.Signal(os.Interrupt)
		}
		_ = oldProc.Wait()
		_ = newProc.Wait()
	})
	bases := map[string]string{"old": "http://" + oldAddr, "new": "http://" + newAddr}
	admin := token(t, dir, "--kind", "operator", "--subject", "alice", "--role", "admin")
	viewer := token(t, dir, "--kind", "operator", "--subject", "vera", "--role", "viewer")
	prober := token(t, dir, "--kind", "prober", "--subject", "prober-1")

	region := func(base string) ownership.RegionStatus {
		t.Helper()
		code, body := call(t, "GET", base+"/v1/replicas", admin, "")
		if code != http.StatusOK {
			t.Fatalf("GET /v1/replicas at %s: %d %s", base, code, body)
		}
		var r ownership.RegionStatus
		if err := json.Unmarshal(body, &r); err != nil {
			t.Fatalf("GET /v1/replicas at %s: %v", base, err)
		}
		return r
	}
	// owned is the shards each release's replica holds now, as each says.
	owned := func() map[string]map[int]bool {
		out := map[string]map[int]bool{}
		for rel, b := range bases {
			out[rel] = map[int]bool{}
			for _, s := range region(b).Owned {
				out[rel][s.Shard] = true
			}
		}
		return out
	}
	// Until the handover from the old replica (which started alone) is
	// done, a shard it offered is listed by both for a moment: wait for
	// the two to hold every shard between them, each its own.
	wait.For(t, time.Minute, "both releases holding shards, none unowned, none listed by both", func() bool {
		for _, b := range bases {
			r := region(b)
			if len(r.Replicas) != 2 || len(r.Unowned) != 0 || len(r.Owned) == 0 || len(r.Offered) != 0 || len(r.HandedOver) != 0 {
				return false
			}
		}
		own := owned()
		for s := range own["old"] {
			if own["new"][s] {
				return false
			}
		}
		return len(own["old"])+len(own["new"]) == 64
	})

	// A service each replica owns now.
	services := map[string]string{} // release -> service it owns
	own := owned()
	for i := 0; len(services) < 2 && i < 1000; i++ {
		name := fmt.Sprintf("mixed-%03d", i)
		for rel, shards := range own {
			// A shard being handed over is listed by both for a moment:
			// one name per release.
			if _, ok := services[rel]; !ok && shards[ownership.ShardOf(name, 64)] && !slices.Contains(slices.Collect(maps.Values(services)), name) {
				services[rel] = name
			}
		}
	}
	if len(services) != 2 {
		t.Fatalf("no service owned by each release among 1,000 names: %v (shards %v)", services, own)
	}
	const perService = 4
	instances := map[string][]uuid.UUID{}
	for _, name := range services {
		if code, body := call(t, "PUT", bases["old"]+"/v1/services/"+name, admin, `{"owner":"payments","capabilities":["probe"]}`); code != http.StatusCreated {
			t.Fatalf("create %s: %d %s", name, code, body)
		}
		if code, body := call(t, "PUT", bases["new"]+"/v1/services/"+name+"/contract", admin, `{"min_dwell_seconds":5,"slow_start_seconds":0}`); code != http.StatusOK {
			t.Fatalf("contract of %s: %d %s", name, code, body)
		}
		for i := range perService {
			base := bases["old"]
			if i%2 == 1 {
				base = bases["new"]
			}
			code, body := call(t, "POST", base+"/v1/services/"+name+"/instances", admin, fmt.Sprintf(`{"address":"10.9.%d.%d","port":8080,"zone":"az1"}`, len(instances), i+1))
			if code != http.StatusCreated {
				t.Fatalf("register in %s: %d %s", name, code, body)
			}
			var r struct{ ID uuid.UUID }
			if err := json.Unmarshal(body, &r); err != nil {
				t.Fatal(err)
			}
			instances[name] = append(instances[name], r.ID)
		}
	}
	names := []string{services["old"], services["new"]}
	if code, body := call(t, "PUT", bases["new"]+"/v1/probers/prober-1/assignments", admin, fmt.Sprintf(`{"services":[%q,%q]}`, names[0], names[1])); code != http.StatusOK {
		t.Fatalf("assignment: %d %s", code, body)
	}

	// The prober reports success every 500 ms on every instance but
	// those withdrawn, to each release in turn: an instance is eligible
	// only on evidence, and a hard failure removes only an instance
	// known (ADR-05).
	ctx, cancel := context.WithCancel(context.Background())
	var running sync.WaitGroup
	t.Cleanup(func() { cancel(); running.Wait() })
	var downMu sync.Mutex
	down := map[uuid.UUID]bool{}
	hc := &http.Client{Timeout: 5 * time.Second}
	report := func(base, body string) (int, string) {
		req, err := http.NewRequestWithContext(ctx, "POST", base+"/v1/reports", strings.NewReader(body))
		if err != nil {
			return 0, err.Error()
		}
		req.Header.Set("Authorization", "Bearer "+prober)
		req.Header.Set("Content-Type", "application/json")
		res, err := hc.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	running.Go(func() {
		tick := time.NewTicker(500 * time.Millisecond)
		defer tick.Stop()
		for n := 0; ; n++ {
			var items []string
			downMu.Lock()
			for _, name := range names {
				for _, id := range instances[name] {
					if !down[id] {
						items = append(items, fmt.Sprintf(`{"instance_id":%q,"class":"probe","outcome":"success"}`, id))
					}
				}
			}
			downMu.Unlock()
			base := bases["old"]
			if n%2 == 1 {
				base = bases["new"]
			}
			if code, body := report(base, `{"reports":[`+strings.Join(items, ",")+`]}`); code != http.StatusOK && ctx.Err() == nil {
				t.Errorf("probe reports to %s: %d %s", base, code, body)
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	})

	// A new service's view is empty until its instances' first probes
	// (rightly): the subscribers start once both replicas route to every
	// instance, so that no view they take may be empty.
	wait.For(t, time.Minute, "both replicas routing to every instance", func() bool {
		for _, b := range bases {
			for _, name := range names {
				code, body := call(t, "GET", b+"/v1/resolve/"+name, viewer, "")
				var v assembler.View
				if code != http.StatusOK || json.Unmarshal(body, &v) != nil {
					return false
				}
				n := 0
				for _, ep := range v.Endpoints {
					if ep.Weight > 0 {
						n++
					}
				}
				if n != perService {
					return false
				}
			}
		}
		return true
	})
	// A subscriber of both services on each replica.
	checkers := map[string]*streamcheck.Checker{}
	for rel, b := range bases {
		c, err := streamcheck.New(streamcheck.Config{URL: b, Services: names, Token: viewer,
			BaseBackoff: 50 * time.Millisecond, MaxBackoff: time.Second, HeartbeatTimeout: 20 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		checkers[rel] = c
		running.Go(func() { c.Run(ctx) })
	}
	routable := func(name string, id uuid.UUID, want bool) func() bool {
		return func() bool {
			for _, c := range checkers {
				if c.Routable(name, id) != want {
					return false
				}
			}
			return true
		}
	}
	wait.For(t, time.Minute, "both subscribers routing to every instance", func() bool {
		for _, name := range names {
			for _, id := range instances[name] {
				if !routable(name, id, true)() {
					return false
				}
			}
		}
		return true
	})

	// A hard failure reported to the replica that does not own the
	// service, for each direction.
	metrics := func(rel string) []byte {
		t.Helper()
		code, body := call(t, "GET", bases[rel]+"/metrics", admin, "")
		if code != http.StatusOK {
			t.Fatalf("GET /metrics at the %s release: %d", rel, code)
		}
		return body
	}
	// Items a replica refuses one by one (not the request) while its
	// copy of the registry has not yet read an instance or assignment
	// made on the other are the region's ordinary start-up, whatever the
	// releases: counted from here, once both serve every instance.
	// The sender counts the same refusals (this release reads them from
	// the answer; an old receiver gives only counts, "unreported").
	setupRefused, setupSenderRefused := map[string]float64{}, map[string]float64{}
	for rel := range bases {
		m := metrics(rel)
		setupRefused[rel], _ = metricSum(m, "muster_samples_forwarded_total", `result="refused"`)
		setupSenderRefused[rel], _ = metricSum(m, "muster_evidence_forward_refused_total")
	}
	var took []string
	for _, from := range []string{"old", "new"} {
		// The owner now, which may have moved since the service was
		// chosen: the report goes to the other replica.
		name := ""
		wait.For(t, 30*time.Second, fmt.Sprintf("one of %v owned by the release other than the %s", names, from), func() bool {
			for rel, shards := range owned() {
				for _, n := range names {
					if rel != from && shards[ownership.ShardOf(n, 64)] {
						name = n
					}
				}
			}
			return name != ""
		})
		target := instances[name][1]
		downMu.Lock()
		down[target] = true
		downMu.Unlock()
		owner := map[string]string{"old": "new", "new": "old"}[from]
		before, _ := metricSum(metrics(owner), "muster_samples_forwarded_total", `result="accepted"`)
		reported := time.Now()
		if code, body := report(bases[from], fmt.Sprintf(`{"reports":[{"instance_id":%q,"class":"probe","outcome":"hard_failure"}]}`, target)); code != http.StatusOK {
			t.Fatalf("hard failure reported to the %s release: %d %s", from, code, body)
		}
		wait.For(t, 30*time.Second, fmt.Sprintf("the withdrawal of %s of %s (owned by the %s release, reported to the %s) at both subscribers", target, name, owner, from),
			routable(name, target, false))
		took = append(took, fmt.Sprintf("reported to the %s release, withdrawn at both subscribers in %s", from, time.Since(reported).Round(time.Millisecond)))
		if after, _ := metricSum(metrics(owner), "muster_samples_forwarded_total", `result="accepted"`); after <= before {
			t.Errorf("the %s release (the owner) took no forwarded evidence from the %s while the withdrawal went through (%v, then %v)", owner, from, before, after)
		}
	}

	// Nothing dropped, nothing refused, evidence forwarded both ways.
	for rel, other := range map[string]string{"old": "new", "new": "old"} {
		m := metrics(rel)
		ids := region(bases[rel])
		peer := ""
		for _, r := range ids.Replicas {
			if r.ID != ids.Self {
				peer = r.ID
			}
		}
		if n, _ := metricSum(m, "muster_evidence_forwarded_total", fmt.Sprintf("peer=%q", peer)); n == 0 {
			t.Errorf("the %s release forwarded no evidence to the %s (%s):\n%s", rel, other, peer, grepLines(m, "muster_evidence_forward"))
		}
		if n, _ := metricSum(m, "muster_evidence_forward_dropped_total"); n != 0 {
			t.Errorf("the %s release: muster_evidence_forward_dropped_total = %v, want 0:\n%s", rel, n, grepLines(m, "muster_evidence_forward"))
		}
		if n, _ := metricSum(m, "muster_evidence_forward_refused_total"); n != setupSenderRefused[rel] {
			t.Errorf("the %s release: muster_evidence_forward_refused_total = %v, %v of them once set up, want none:\n%s",
				rel, n, n-setupSenderRefused[rel], grepLines(m, "muster_evidence_forward"))
		}
		if n, _ := metricSum(m, "muster_samples_forwarded_total", `result="refused"`); n != setupRefused[rel] {
			t.Errorf("the %s release refused %v items forwarded to it once set up:\n%s", rel, n-setupRefused[rel], grepLines(m, "muster_samples_forwarded_total"))
		} else if n > 0 {
			t.Logf("the %s release refused %v items forwarded to it while the services were set up (its registry copy not yet read)", rel, n)
		}
		if n, _ := metricSum(m, "muster_peer_unknown_fields_total"); n != 0 {
			t.Logf("the %s release ignored members it does not know in %v peer requests", rel, n)
		}
	}
	for rel, c := range checkers {
		if n := c.Counts(); n.Problems() != 0 || n.Emptied != 0 {
			t.Errorf("the subscriber on the %s release: %v; first: %v", rel, n, c.Events()[:min(5, len(c.Events()))])
		}
	}
	if code, body := call(t, "GET", bases["new"]+"/v1/alarms", admin, ""); code != http.StatusOK || !strings.Contains(string(body), `"kind":"peer_trust_upgrade"`) {
		t.Errorf("the new release in upgrade mode: GET /v1/alarms %d without peer_trust_upgrade: %s", code, body)
	}

	// Strict, this release believes none of the old replica's unsealed
	// row: it does not follow it, and names it.
	oldID := region(bases["old"]).Self
	strictAddr := freeAddr(t)
	strictProc := startProcess(t, dir, strictAddr, env...)
	t.Cleanup(func() { _ = strictProc.Process.Signal(os.Interrupt); _ = strictProc.Wait() })
	strictBase := "http://" + strictAddr
	var seen string
	wait.For(t, time.Minute, "the strict replica naming the old replica's row unbelieved", func() bool {
		code, body := call(t, "GET", strictBase+"/v1/replicas", admin, "")
		seen = string(body)
		var r struct {
			ownership.RegionStatus
			Relay []struct{ Peer string } `json:"relay"`
		}
		if code != http.StatusOK || json.Unmarshal(body, &r) != nil || len(r.Unbelieved) != 1 || r.Unbelieved[0].ID != oldID {
			return false
		}
		for _, p := range r.Relay {
			if p.Peer == oldID {
				t.Fatalf("the strict replica follows the old one: %s", body)
			}
		}
		for _, rep := range r.Replicas {
			if rep.ID == oldID {
				t.Fatalf("the strict replica lists the old one as a member: %s", body)
			}
		}
		return slices.ContainsFunc(r.Relay, func(p struct{ Peer string }) bool { return p.Peer == region(bases["new"]).Self })
	})
	if code, body := call(t, "GET", strictBase+"/v1/alarms", admin, ""); code != http.StatusOK ||
		!strings.Contains(string(body), `"kind":"replica_unsealed"`) || !strings.Contains(string(body), oldID) || strings.Contains(string(body), `"kind":"peer_trust_upgrade"`) {
		t.Errorf("the strict replica's alarms: %d %s, want replica_unsealed naming %s and no peer_trust_upgrade (replicas: %s)", code, body, oldID, seen)
	}
	t.Logf("previous release %s beside this one on one PostgreSQL: %s; %s (run %s after the build)",
		previousRelease[:12], strings.Join(took, "; "), fmt.Sprint(checkers["old"].Counts()), time.Since(began).Round(time.Millisecond))
}

// TestAReleaseStartsOnASchemaANewerOneMigrated: during a rolling upgrade
// the newer release migrates first, and a replica of the older one that
// restarts must still start. Shown with this release against a database
// one migration ahead of it (an additive column, as the policy wants):
// muster dev starts (with a warning) and serves, writes included; the
// schema is left as it was. The same database left dirty by a failed migration is
// refused: the process exits with the reason and the command that clears
// it; after `muster migrate force` it starts.
func TestAReleaseStartsOnASchemaANewerOneMigrated(t *testing.T) {
	realTime(t, "muster dev started on a schema ahead of it")
	t.Parallel()
	ctx := context.Background()
	u := dbtest.URL(t)
	pool, err := db.Open(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var known uint
	if err := pool.QueryRow(ctx, `SELECT version FROM schema_migrations`).Scan(&known); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `ALTER TABLE services ADD COLUMN next_release_note text NOT NULL DEFAULT ''`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE schema_migrations SET version = $1, dirty = false`, known+1); err != nil {
		t.Fatal(err)
	}
	dir, addr := devDir(t), freeAddr(t)
	p, _ := startProcessServing(t, dir, addr, "DATABASE_URL="+u)
	admin := token(t, dir, "--kind", "operator", "--subject", "alice", "--role", "admin")
	wait.For(t, time.Minute, "ready", func() bool { code, _ := call(t, "GET", "http://"+addr+"/readyz", "", ""); return code == http.StatusOK })
	if code, body := call(t, "PUT", "http://"+addr+"/v1/services/web", admin, `{"owner":"payments","capabilities":[]}`); code != http.StatusCreated {
		t.Fatalf("a write on the schema ahead: %d %s", code, body)
	}
	_ = p.Process.Signal(os.Interrupt)
	_ = p.Wait()
	var v uint
	var dirty bool
	if err := pool.QueryRow(ctx, `SELECT version, dirty FROM schema_migrations`).Scan(&v, &dirty); err != nil || v != known+1 || dirty {
		t.Fatalf("the schema after the start: version %d dirty %v (%v), want %d clean", v, dirty, err, known+1)
	}

	// Dirty: refused.
	if _, err := pool.Exec(ctx, `UPDATE schema_migrations SET dirty = true`); err != nil {
		t.Fatal(err)
	}
	exe := musterBinary(t)
	cmd := exec.Command(exe, "dev", "--addr", freeAddr(t), "--data", dir)
	cmd.Env = append(os.Environ(), "DATABASE_URL="+u)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(stderr.String(), "dirty") {
			t.Fatalf("muster dev on a dirty schema: exit %v, stderr:\n%s", err, stderr.String())
		}
	case <-time.After(time.Minute):
		_ = cmd.Process.Kill()
		t.Fatalf("muster dev on a dirty schema still runs after a minute:\n%s", stderr.String())
	}
	if !strings.Contains(stderr.String(), "muster migrate force VERSION") {
		t.Errorf("the refusal does not name the command that clears it:\n%s", stderr.String())
	}

	// The operator checks the schema (the newer release's column is
	// there, nothing else of its migration), records this release's last
	// version with `muster migrate force`, and muster starts again.
	force := exec.Command(exe, "migrate", "force", fmt.Sprint(known), "--data", dir)
	force.Env = append(os.Environ(), "DATABASE_URL="+u)
	if out, err := force.CombinedOutput(); err != nil || !strings.Contains(string(out), fmt.Sprintf("schema version %d\n", known)) {
		t.Fatalf("muster migrate force %d: %v\n%s", known, err, out)
	}
	addr = freeAddr(t)
	p, _ = startProcessServing(t, dir, addr, "DATABASE_URL="+u)
	wait.For(t, time.Minute, "ready after the force", func() bool { code, _ := call(t, "GET", "http://"+addr+"/readyz", "", ""); return code == http.StatusOK })
	_ = p.Process.Signal(os.Interrupt)
	_ = p.Wait()
	if err := pool.QueryRow(ctx, `SELECT version, dirty FROM schema_migrations`).Scan(&v, &dirty); err != nil || v != known || dirty {
		t.Fatalf("the schema after the start: version %d dirty %v (%v), want %d clean", v, dirty, err, known)
	}
}
