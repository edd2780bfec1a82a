package main

import (
	"bytes"
	"context"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/loadgen"
	"github.com/musterhq/muster/internal/wait"
)

// TestLoadgenWatchRestart runs `muster loadgen watch --restart` at small
// scale: 300 subscribers of a real `muster dev` child process (this test
// binary), a real restart (SIGTERM, a new process with no memory of
// them), and readmission through 1 s admission windows at 5% of the
// population (floor 1). It passes only if every client was admitted
// exactly once by the new process, never more than 15 (5%) within one
// window, and none got synced before its views.
func TestLoadgenWatchRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two muster processes for about half a minute")
	}
	t.Parallel()
	dir := devDir(t)
	ctx := context.Background()
	cluster, err := db.StartCluster(ctx, db.ClusterConfig{Dir: dir, Fast: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cluster.Stop() })
	var out, errb bytes.Buffer
	if err := run(ctx, []string{"loadgen", "seed", "--data", dir, "--services", "12", "--instances", "120", "--minutes", "1"}, &out, &errb); err != nil {
		t.Fatalf("seed: %v\n%s", err, errb.String())
	}
	// Run as `muster loadgen watch` runs it, its children muster built
	// from this tree.
	env := loadgen.Env{OpenDB: openToolDB, SealKey: toolSealKey, Exe: musterBinary(t)}
	out.Reset()
	err = loadgen.Run(ctx, env, []string{"watch", "--restart", "--data", dir, "--clients", "300", "--services-per-client", "2",
		"--admission-window", "1s", "--admission-floor", "1", "--readmit-timeout", "2m"}, &out, &errb)
	t.Logf("loadgen watch --restart:\n%s", out.String())
	if err != nil {
		t.Fatalf("%v\nstderr:\n%s", err, errb.String())
	}
	for _, want := range []string{
		"process 2 admission: expected population 300 (read from PostgreSQL), budget 15 per 1s",
		"readmission: all 300 readmitted",
		"assert exactly-once: ok",
		"assert 5%-per-window: ok",
		"assert synced-after-view: ok",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q", want)
		}
	}
}

// TestLoadgenRebuild runs `muster loadgen rebuild` at small scale: on an
// empty database it seeds live and ended instances (sealed with the dev
// key, as muster would have) and times a rebuild from them, which reads the
// live ones and those ended within the hour only; run again it rebuilds
// from what is there, and refuses seed flags that would no longer apply.
func TestLoadgenRebuild(t *testing.T) {
	if testing.Short() {
		t.Skip("seeds and rebuilds a small region")
	}
	t.Parallel()
	dir := devDir(t)
	ctx := context.Background()
	cluster, err := db.StartCluster(ctx, db.ClusterConfig{Dir: dir, Fast: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cluster.Stop() })
	var out, errb bytes.Buffer
	args := []string{"loadgen", "rebuild", "--data", dir, "--services", "12", "--instances", "200", "--ended", "2000",
		"--ended-per-hour", "500", "--minutes", "1", "--history", "2", "--quarantined", "10"}
	if err := run(ctx, args, &out, &errb); err != nil {
		t.Fatalf("%v: %v\n%s%s", args, err, out.String(), errb.String())
	}
	t.Logf("loadgen rebuild:\n%s", out.String())
	for _, want := range []string{
		"seeded 2000 ended instances (500 a hour back from now, 500 within the last hour)",
		"seeded 12 services and 200 instances",
		"rebuild: 12 services, 200 instances,",
		"rebuild at 200 live and 2000 ended instances: ",
		"instance rows (in ",
		"CPU ",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if strings.Contains(errb.String(), "seal does not verify") {
		t.Errorf("the seeded rows are not sealed as muster seals them:\n%s", errb.String())
	}
	// The live ones and those ended within the last hour (at most 500):
	// not every row ever written.
	var read int
	if m := regexp.MustCompile(`it read (\d+) instance rows`).FindStringSubmatch(out.String()); m != nil {
		read, _ = strconv.Atoi(m[1])
	}
	if read < 200 || read > 700 {
		t.Errorf("the rebuild read %d instance rows, want the 200 live and at most the 500 ended within the hour", read)
	}

	out.Reset()
	if err := run(ctx, []string{"loadgen", "rebuild", "--data", dir}, &out, &errb); err != nil {
		t.Fatalf("rebuild again: %v\n%s", err, errb.String())
	}
	if want := "rebuild at 200 live and 2000 ended instances: "; !strings.Contains(out.String(), want) {
		t.Errorf("rebuilding from the seeded data: output lacks %q:\n%s", want, out.String())
	}
	if err := run(ctx, []string{"loadgen", "rebuild", "--data", dir, "--ended", "0"}, &out, &errb); err == nil || !strings.Contains(err.Error(), "fresh --data") {
		t.Errorf("seed flags on a seeded database: %v, want a refusal naming a fresh --data folder", err)
	}
}

// TestLoadgenXDS runs `muster loadgen xds` at small scale against a real
// `muster dev`: 20 ADS streams per protocol (under the admission floor), two changes,
// both protocols; each must reach every stream and print its figures.
func TestLoadgenXDS(t *testing.T) {
	if testing.Short() {
		t.Skip("runs muster dev and 40 xDS streams for about 20 s")
	}
	t.Parallel()
	dir := devDir(t)
	xaddr := freeAddr(t)
	d := startDev(t, dir, "--xds-addr", xaddr)
	for _, proto := range [][]string{nil, {"--delta"}} {
		var out, errb bytes.Buffer
		args := append([]string{"loadgen", "xds", "--url", d.url, "--xds", xaddr, "--data", dir, "--clients", "20", "--conns", "2",
			"--changes", "2", "--interval", "100ms"}, proto...)
		if err := run(context.Background(), args, &out, &errb); err != nil {
			t.Fatalf("%v: %v\n%s%s", args, err, out.String(), errb.String())
		}
		t.Logf("loadgen xds %v:\n%s", proto, out.String())
		for _, want := range []string{"20 ", "change  2:", "time to all 20 streams, from the API call (2 changes): p50"} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("output lacks %q", want)
			}
		}
	}
}

// TestLoadgenXDSWithdrawals runs `muster loadgen xds --withdrawals` at
// small scale against a real `muster dev`: 20 ADS streams per protocol
// over 2 connections, 12 routable instances, 3 hard failures reported by
// a prober; every withdrawal must reach every stream (loadgen fails
// otherwise) and the figures must be printed, deliveries adding up to
// streams x withdrawals.
func TestLoadgenXDSWithdrawals(t *testing.T) {
	if testing.Short() {
		t.Skip("runs muster dev and 40 xDS streams for about 10 s")
	}
	t.Parallel()
	dir := devDir(t)
	xaddr := freeAddr(t)
	d := startDev(t, dir, "--xds-addr", xaddr)
	for _, proto := range [][]string{nil, {"--delta"}} {
		var out, errb bytes.Buffer
		args := append([]string{"loadgen", "xds", "--withdrawals", "--url", d.url, "--xds", xaddr, "--data", dir,
			"--clients", "20", "--conns", "2", "--instances", "12", "--changes", "3", "--interval", "100ms"}, proto...)
		if err := run(context.Background(), args, &out, &errb); err != nil {
			t.Fatalf("%v: %v\n%s%s", args, err, out.String(), errb.String())
		}
		t.Logf("loadgen xds --withdrawals %v:\n%s", proto, out.String())
		for _, want := range []string{
			"20 ", "with 12 routable instances", "withdrawal  3:",
			"withdrawal time to all 20 streams, from the report's 200 (3 withdrawals): p50",
			"withdrawal time to the first stream: p50",
			"every delivery (60 of 20 streams x 3 withdrawals): p50",
			"muster CPU per withdrawal: ",
		} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("output lacks %q", want)
			}
		}
	}
}

// TestLoadgenWatchReplicas runs `muster loadgen watch --replicas` at small
// scale against a real `muster dev`, given twice in --replicas: a second
// replica that serves every view and takes every report is not wired yet
// (publication does not follow shard ownership), so both "replicas" are
// one process, and each list entry is still a replica of its own to the
// load generator (its subscribers, streams, reports and lags). It checks
// that the per-replica lines parse and add up: subscribers to --clients,
// reports to the failures injected, applications to the overall figure
// and to the first-failed-sample lag's count, percentiles in order.
func TestLoadgenWatchReplicas(t *testing.T) {
	if testing.Short() {
		t.Skip("runs muster dev and 40 watch streams for about half a minute")
	}
	t.Parallel()
	dir := devDir(t)
	ctx := context.Background()
	cluster, err := db.StartCluster(ctx, db.ClusterConfig{Dir: dir, Fast: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cluster.Stop() })
	var out, errb bytes.Buffer
	// 4 services of 30 instances, 10 a zone: room for several failures
	// per zone above its guard's minimum. No quarantine (seed's default
	// quarantines 600 instances: all of these, so none would become
	// eligible) and no observed windows (seeded passive successes from
	// the last minute contradict a probe's hard failure, so it degrades
	// instead of withdrawing: no single class drains an instance).
	if err := run(ctx, []string{"loadgen", "seed", "--data", dir, "--services", "4", "--instances", "120", "--minutes", "0", "--quarantined", "0"}, &out, &errb); err != nil {
		t.Fatalf("seed: %v\n%s", err, errb.String())
	}
	d := startDev(t, dir)
	wait.For(t, time.Minute, "/readyz", func() bool { code, _ := call(t, "GET", d.url+"/readyz", "", ""); return code == 200 })
	out.Reset()
	args := []string{"loadgen", "watch", "--replicas", d.url + "," + d.url + "/", "--data", dir, "--clients", "40",
		"--services-per-client", "2", "--failures", "8", "--additions", "2", "--duration", "8s"}
	err = run(ctx, args, &out, &errb)
	t.Logf("loadgen watch --replicas:\n%s", out.String())
	if err != nil {
		t.Fatalf("%v\nstderr:\n%s", err, errb.String())
	}
	text := out.String()

	dur := func(s string) time.Duration {
		t.Helper()
		d, err := time.ParseDuration(s)
		if err != nil || d < 0 {
			t.Fatalf("%q is not a duration of at least 0: %v", s, err)
		}
		return d
	}
	num := func(s string) int {
		t.Helper()
		n, err := strconv.Atoi(s)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	ordered := func(what string, ps ...string) {
		t.Helper()
		for i := 1; i < len(ps); i++ {
			if dur(ps[i-1]) > dur(ps[i]) {
				t.Errorf("%s: percentiles out of order: %v", what, ps)
			}
		}
	}
	base := regexp.MustCompile(`withdrawal lag \(first failed sample -> applied by subscriber\): p50 \S+ p99 \S+ p99\.9 \S+ max \S+ over (\d+) applications of (\d+) failures \(\d+ expected; \d+ skipped for zone headroom, (\d+) refused\)`).FindStringSubmatch(text)
	if base == nil {
		t.Fatal("no withdrawal lag line")
	}
	applied, failures, refused := num(base[1]), num(base[2]), num(base[3])
	all := regexp.MustCompile(`replicas: withdrawal lag \(report acknowledged -> seen by subscriber\): p50 (\S+) p99 (\S+) p99\.9 (\S+) max (\S+) over (\d+) applications \((\d+) seen before the acknowledgement, counted as 0\); (\d+) subscribers over (\d+) replicas`).FindStringSubmatch(text)
	if all == nil {
		t.Fatal("no overall replicas line")
	}
	ordered("overall", all[1:5]...)
	if n := num(all[5]); n != applied {
		t.Errorf("%d applications measured from the acknowledgement, %d from the first failed sample", n, applied)
	}
	if num(all[7]) != 40 || num(all[8]) != 2 {
		t.Errorf("overall line: %s subscribers over %s replicas, want 40 over 2", all[7], all[8])
	}
	lines := regexp.MustCompile(`(?m)^replica (\d+) (\S+): (\d+) subscribers at the end, (\d+) streams admitted, (\d+) hard-failure reports sent; withdrawal lag \(report acknowledged -> seen by a subscriber on it\): p50 (\S+) p99 (\S+) p99\.9 (\S+) max (\S+) over (\d+) applications$`).FindAllStringSubmatch(text, -1)
	if len(lines) != 2 {
		t.Fatalf("%d per-replica lines, want 2", len(lines))
	}
	var subscribers, reports, apps int
	for i, m := range lines {
		if num(m[1]) != i+1 || m[2] != d.url {
			t.Errorf("replica line %d names replica %s at %s, want %d at %s", i, m[1], m[2], i+1, d.url)
		}
		ordered("replica "+m[1], m[6:10]...)
		subscribers += num(m[3])
		// Every subscriber's first stream goes to its round-robin
		// replica: 20 each at least.
		if num(m[4]) < 20 {
			t.Errorf("replica %s admitted %s streams, want at least 20", m[1], m[4])
		}
		reports += num(m[5])
		apps += num(m[10])
	}
	if subscribers != 40 {
		t.Errorf("subscribers per replica add up to %d, want 40", subscribers)
	}
	if reports != failures+refused {
		t.Errorf("hard-failure reports per replica add up to %d, want the %d failures injected and %d refused", reports, failures, refused)
	}
	if d := num(lines[0][5]) - num(lines[1][5]); d < 0 || d > 1 {
		t.Errorf("reports %s and %s: not sent in turn", lines[0][5], lines[1][5])
	}
	if apps != applied {
		t.Errorf("applications per replica add up to %d, want %d", apps, applied)
	}
	if failures == 0 || applied == 0 {
		t.Fatalf("%d failures injected, %d applications seen: the lags measured nothing\nstderr:\n%s", failures, applied, errb.String())
	}
}
