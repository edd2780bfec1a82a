package loadgen

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/url"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/cli"
	"github.com/musterhq/muster/internal/devissuer"
	"github.com/musterhq/muster/internal/evaluator"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/registry"
	"github.com/musterhq/muster/internal/seal"
)

const loadgenUsage = `usage:
  muster loadgen seed    [--data DIR] [--services 450] [--instances 60000] [--ended 0] [--ended-per-hour 5000] [--minutes 5] [--history 10] [--quarantined 600]
  muster loadgen rebuild [--data DIR] [--instances 60000] [--ended 1000000] [seed's other flags] [--cpuprofile FILE]
  muster loadgen reports --url URL [--data DIR] [--batch 1000] [--concurrency 4] [--probers 8] [--duration 20s]
  muster loadgen reports --replicas URL,URL,... [--route any|owner] [reports' other flags]
  muster loadgen watch   --url URL [--data DIR] [--clients 1000] [--services-per-client 3] [--failures 200] [--additions 50] [--duration 60s]
  muster loadgen watch   --replicas URL,URL,... [watch's other flags]
  muster loadgen watch   --restart [--data DIR] [--clients 10000] [--admission-window 10s] [--admission-floor 50]
  muster loadgen ui      --url URL [--user alice] [--pages /ui/,/ui/audit] [--requests 20]
  muster loadgen tgsync  --url URL [--data DIR] [--instances 60] [--withdrawals 100] [--endpoints 100] [--changes 1000] [--elbv2-only]
  muster loadgen dns     [--addr HOST:PORT [--names N,...]] [--services 450] [--endpoints 130] [--changes 40] [--clients 8] [--duration 10s]
  muster loadgen xds     --url URL --xds ADDR [--data DIR] [--clients 1000] [--changes 20] [--interval 2s] [--delta]
  muster loadgen xds     --withdrawals --url URL --xds ADDR [--data DIR] [--instances 60] [--clients 1000] [--changes 20] [--delta] [--decode wire|proto] [--cpuprofile FILE]
  muster loadgen regions --a URL --a-data DIR --b URL --b-data DIR [--subscribers 100] [--instances 20] [--withdrawals 5]`

// loadgenOwner owns every service loadgen creates, so its data is easy to
// tell apart.
const (
	loadgenOwner  = "loadgen"
	loadgenProber = "loadgen-prober"
)

// Env is what the load generator takes from the muster command that runs
// it.
type Env struct {
	// OpenDB opens a pool on the database muster on the data folder dir
	// works on (DATABASE_URL, or the dev cluster in dir, started or
	// adopted) and returns the region muster serves; closeDB closes the
	// pool and stops what was started. seed, rebuild and watch --restart
	// need it.
	OpenDB func(ctx context.Context, dir string, stderr io.Writer) (pool *pgxpool.Pool, region string, closeDB func() error, err error)
	// SealKey, when set, returns the region's signing key muster on dir
	// seals with (the dev key in dir, or MUSTER_AUDIT_SIGNING_KEY_FILE):
	// seed seals the instances it loads with it, as muster's registry
	// would, so they are routed to. Nil: seed loads them unsealed, and
	// only a muster that has not yet adopted the rows from before the
	// seals (registry.AdoptUnsealed) routes to them.
	SealKey func(dir string) (seal.Signer, error)
	// Exe is the muster binary watch --restart runs as `muster dev`;
	// empty, this binary (muster's own). Tests set it to muster built
	// from their tree.
	Exe string
	// ChildEnv is added to the environment of the muster processes that
	// watch --restart runs.
	ChildEnv []string
}

// Run runs `muster loadgen args...`: seed, rebuild, reports, watch, ui, tgsync, dns, xds or regions.
// A command line it cannot understand is cli.ErrUsage, explained on
// stderr.
func Run(ctx context.Context, env Env, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprintln(stderr, loadgenUsage)
		return cli.ErrUsage
	}
	switch args[0] {
	case "seed":
		return loadgenSeed(ctx, env, args[1:], stdout, stderr)
	case "rebuild":
		return loadgenRebuild(ctx, env, args[1:], stdout, stderr)
	case "reports":
		return loadgenReports(ctx, args[1:], stdout, stderr)
	case "watch":
		return loadgenWatch(ctx, env, args[1:], stdout, stderr)
	case "ui":
		return loadgenUI(ctx, args[1:], stdout, stderr)
	case "tgsync":
		return loadgenTgsync(ctx, args[1:], stdout, stderr)
	case "dns":
		return loadgenDNS(ctx, args[1:], stdout, stderr)
	case "xds":
		return loadgenXDS(ctx, args[1:], stdout, stderr)
	case "regions":
		return loadgenRegions(ctx, args[1:], stdout, stderr)
	}
	fmt.Fprintln(stderr, loadgenUsage)
	return cli.ErrUsage
}

// seedOptions sizes what seed loads.
type seedOptions struct {
	services, instances, minutes, history, quarantined int
	// ended instances are written beside the live ones, endedPerHour of
	// them ended in each hour back from now (see seedEnded).
	ended, endedPerHour int
}

// flags adds seed's flags to fs.
func (o *seedOptions) flags(fs *flag.FlagSet, ended int) {
	fs.IntVar(&o.services, "services", 450, "services to create")
	fs.IntVar(&o.instances, "instances", 60000, "instances to create, spread over the services")
	fs.IntVar(&o.minutes, "minutes", 5, "minutes of observed windows (10 s each) per instance and class")
	fs.IntVar(&o.history, "history", 10, "older transitions per instance on record (every fifth a quarantine, long over)")
	fs.IntVar(&o.quarantined, "quarantined", 600, "instances in quarantine now (as many again came out of one within the hour)")
	fs.IntVar(&o.ended, "ended", ended, "ended instances on record besides the live ones (deregistered, replaced or expired; ids are never reused)")
	fs.IntVar(&o.endedPerHour, "ended-per-hour", 5000, "how many of the ended instances ended in each hour back from now (900 deploys a day of 133 instances each: some 5,000)")
}

func (o seedOptions) validate() error {
	if o.services < 1 || o.instances < 0 || o.ended < 0 || o.minutes < 0 || o.history < 0 || o.quarantined < 0 {
		return fmt.Errorf("seed: --services must be at least 1 and the other counts not negative")
	}
	if o.ended > 0 && o.endedPerHour < 1 {
		return fmt.Errorf("seed: --ended-per-hour %d: want at least 1", o.endedPerHour)
	}
	return nil
}

// loadgenSeed creates services and instances in bulk, assigns the loadgen
// prober to them, and writes minutes of observed windows, as a region at
// scale would have retained before a restart.
func loadgenSeed(ctx context.Context, env Env, args []string, stdout, stderr io.Writer) (err error) {
	var dir string
	var o seedOptions
	fs := cli.NewFlags("loadgen seed", stderr)
	cli.DataFlag(fs, &dir)
	o.flags(fs, 0)
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if err := o.validate(); err != nil {
		return err
	}
	pool, region, closeDB, err := env.OpenDB(ctx, dir, stderr)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, closeDB()) }()
	if err := db.Migrate(pool.Config().ConnString()); err != nil {
		return err
	}
	var key seal.Signer
	if env.SealKey != nil {
		if key, err = env.SealKey(dir); err != nil {
			return err
		}
	}
	return seed(ctx, pool, region, key, o, stdout)
}

// seed loads what o says into the database of pool, sealing the instances
// with key (nil: unsealed).
func seed(ctx context.Context, pool *pgxpool.Pool, region string, key seal.Signer, o seedOptions, stdout io.Writer) error {
	services, instances, minutes, history, quarantined := o.services, o.instances, o.minutes, o.history, o.quarantined
	// The services (and the prober assignment) are sealed with the key
	// the instances are: a region whose instances are sealed believes
	// no unsealed service row, so its views would be empty.
	rc := registry.Config{Pool: pool, Region: region}
	if key != nil {
		rc.Sealer = key
	}
	reg, err := registry.New(rc)
	if err != nil {
		return err
	}
	admin := identity.Principal{Kind: identity.KindTool, Subject: "loadgen", Role: identity.RoleAdmin}

	start := time.Now()
	names := make([]string, services)
	for i := range names {
		names[i] = fmt.Sprintf("lg-%04d", i)
		spec := registry.ServiceSpec{Owner: loadgenOwner, Capabilities: []registry.Capability{registry.CapProbe, registry.CapPassive}}
		if _, _, err := reg.PutService(ctx, admin, names[i], spec); err != nil {
			return fmt.Errorf("seed service %s: %w", names[i], err)
		}
	}
	// The ended instances first: a million of them take a minute to seal
	// and copy, and what follows is stamped relative to now (windows the
	// rebuild replays, quarantines in force), so it must not age meanwhile.
	if o.ended > 0 {
		estart := time.Now()
		if err := seedEnded(ctx, pool, reg.Region(), key, names, time.Now().UTC().Truncate(time.Microsecond), o.ended, o.endedPerHour); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "seeded %d ended instances (%d a hour back from now, %d within the last hour) in %s\n",
			o.ended, o.endedPerHour, min(o.ended, o.endedPerHour), time.Since(estart).Round(time.Millisecond))
		start = start.Add(time.Since(estart)) // reported on its own
	}
	now := time.Now().UTC().Truncate(time.Microsecond) // as stored: the seals cover it
	lease := now.Add(24 * time.Hour)
	rows := make([]db.InstancesCopyParams, instances)
	ids := make([]uuid.UUID, instances)
	for i := range rows {
		ids[i] = uuid.Must(uuid.NewV7())
		rows[i] = db.InstancesCopyParams{
			ID: ids[i], Service: names[i%services], Address: fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255),
			// Zones rotate within a service (i/services), so every service
			// spans zones whatever the service count.
			Port: 8080, Zone: fmt.Sprintf("az%d", (i/services)%3+1), Region: reg.Region(), Source: "loadgen", State: registry.StateActive,
			// Renewed within the last 10 s (a third of the lease TTL),
			// as a live region's rows are.
			LeaseExpiresAt: &lease, RegisteredBy: "tool:loadgen", CreatedAt: now.Add(-24 * time.Hour),
			UpdatedAt: now.Add(-time.Duration(i) * (10 * time.Second / time.Duration(instances)).Truncate(time.Microsecond)),
		}
	}
	if key != nil {
		if err := registry.SealCopy(ctx, key, rows); err != nil {
			return err
		}
	}
	if _, err := db.New(pool).InstancesCopy(ctx, rows); err != nil {
		return fmt.Errorf("seed instances: %w", err)
	}
	if _, err := reg.PutProberAssignments(ctx, admin, loadgenProber, registry.ProberAssignments{Services: names}); err != nil {
		return fmt.Errorf("assign the loadgen prober: %w", err)
	}
	fmt.Fprintf(stdout, "seeded %d services and %d instances in %s\n", services, instances, time.Since(start).Round(time.Millisecond))

	start = time.Now()
	windows := minutes * 6
	written := 0
	for w := range windows {
		end := now.Add(-time.Duration(windows-w-1) * 10 * time.Second)
		batch := make([]db.ObservedWindowsInsertParams, 0, 2*instances)
		for i, id := range ids {
			fail := int32(0)
			if i%50 == 0 {
				fail = 3 // a few unhealthy instances, so the rebuild has work to do
			}
			for class := int16(0); class < 3; class += 2 { // probe and passive
				batch = append(batch, db.ObservedWindowsInsertParams{
					InstanceID: id, Class: class, WindowStart: end.Add(-10 * time.Second), WindowEnd: end,
					Successes: 5 - fail, Failures: fail, Reporters: 1,
				})
			}
		}
		n, err := db.New(pool).ObservedWindowsInsert(ctx, batch)
		if err != nil {
			return fmt.Errorf("seed observed windows: %w", err)
		}
		written += int(n)
	}
	fmt.Fprintf(stdout, "seeded %d observed windows (%d min x %d instances x 2 classes) in %s\n",
		written, minutes, instances, time.Since(start).Round(time.Millisecond))

	start = time.Now()
	n, err := seedTransitions(ctx, pool, ids, names, now, history, quarantined)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "seeded %d transitions (%d per instance over the last 30 days, %d quarantines in force, %d ended within the hour) in %s\n",
		n, history, min(quarantined, instances), min(quarantined, max(instances-quarantined, 0)), time.Since(start).Round(time.Millisecond))
	// A region's instances table is long vacuumed and analysed; a bulk
	// load is neither until autovacuum gets to it, and the planner may
	// not yet know that most rows ended.
	if err := db.New(pool).InstancesVacuum(ctx); err != nil {
		return fmt.Errorf("vacuum the seeded instances: %w", err)
	}
	return nil
}

// seedTransitions writes a transition log for the rebuild to read
// quarantines from: history older transitions per instance spread over the
// last 30 days (every fifth starting a quarantine long over, so the
// quarantine index holds old entries to skip), then quarantined instances
// in quarantine now and as many again out of one that ended within the
// hour (which set the next quarantine's step).
func seedTransitions(ctx context.Context, pool *pgxpool.Pool, ids []uuid.UUID, services []string, now time.Time, history, quarantined int) (int64, error) {
	var written int64
	rows := make([]db.TransitionsInsertParams, 0, 100_000)
	flush := func() error {
		n, err := db.New(pool).TransitionsInsert(ctx, rows)
		written += n
		rows = rows[:0]
		if err != nil {
			return fmt.Errorf("seed transitions: %w", err)
		}
		return nil
	}
	add := func(i int, at time.Time, step int, reason string) error {
		from, to := "eligible", "ineligible"
		if step == 0 && i%2 == 1 {
			from, to = to, from
		}
		r := db.TransitionsInsertParams{InstanceID: ids[i], Service: services[i%len(services)], FromState: from, ToState: to,
			At: at, Reason: reason}
		if step > 0 {
			until := at.Add(time.Minute << min(step-1, 5))
			r.QuarantinedUntil, r.QuarantineStep = &until, int16(step)
			r.History = json.RawMessage(`[]`)
		}
		rows = append(rows, r)
		if len(rows) == cap(rows) {
			return flush()
		}
		return nil
	}
	for h := range history {
		at := now.Add(-30 * 24 * time.Hour).Add(time.Duration(h) * 72 * time.Hour)
		for i := range ids {
			step := 0
			if h%5 == 4 {
				step = 1
			}
			if err := add(i, at.Add(time.Duration(i)*time.Millisecond), step, "loadgen history"); err != nil {
				return written, err
			}
		}
	}
	for k := range min(2*quarantined, len(ids)) {
		// In force now (started up to a minute ago, steps 1 to 5), or
		// ended up to an hour ago.
		step := k%5 + 1
		at := now.Add(-time.Duration(k%60) * time.Second)
		if k >= quarantined {
			at = now.Add(-time.Duration(k%50+1)*time.Minute - time.Minute<<(step-1))
		}
		if err := add(k, at, step, "loadgen quarantine"); err != nil {
			return written, err
		}
	}
	if len(rows) > 0 {
		if err := flush(); err != nil {
			return written, err
		}
	}
	return written, nil
}

// loadgenReports drives POST /v1/reports from this process against a
// running muster, as probers at scale would, and prints the throughput and
// batch latency.
func loadgenReports(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var (
		base, dir, replicaList      string
		batch, concurrency, probers int
		duration                    time.Duration
	)
	fs := cli.NewFlags("loadgen reports", stderr)
	fs.StringVar(&base, "url", "http://127.0.0.1:8080", "muster to load")
	fs.StringVar(&replicaList, "replicas", "", "replicas of one region to spread the load over, round-robin by request (comma-separated base URLs; the first is used for setup)")
	fs.StringVar(&dir, "data", ".muster", "dev data folder, for minting tokens")
	fs.IntVar(&batch, "batch", 1000, "reports per request")
	fs.IntVar(&concurrency, "concurrency", 4, "requests in flight")
	fs.IntVar(&probers, "probers", 8, "prober identities the load is spread over (muster limits the items one identity may report, 50,000 a second by default)")
	fs.DurationVar(&duration, "duration", 20*time.Second, "how long to run")
	var route string
	fs.StringVar(&route, "route", "any", "where each batch goes: any (round-robin over the replicas; each forwards what its service's owner evaluates) or owner (each batch holds one replica's services and goes to it, as read from GET /v1/evidence/routes)")
	var warmup time.Duration
	fs.DurationVar(&warmup, "warmup", 0, "how long to send the same load first, unmeasured (verdicts settle on the load's evidence, so the run measures the steady state)")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	iss, err := devissuer.LoadOrCreate(dir)
	if err != nil {
		return err
	}
	admin, err := iss.Mint(devissuer.TokenRequest{Kind: identity.KindTool, Subject: "loadgen", Role: identity.RoleAdmin}, time.Now())
	if err != nil {
		return err
	}
	if probers < 1 {
		return fmt.Errorf("--probers %d: want at least 1", probers)
	}
	if route != "any" && route != "owner" {
		return fmt.Errorf("--route %q: want any or owner", route)
	}
	targets := []string{base}
	if replicaList != "" {
		targets = nil
		for _, u := range strings.Split(replicaList, ",") {
			if u = strings.TrimSuffix(strings.TrimSpace(u), "/"); u != "" {
				targets = append(targets, u)
			}
		}
		if len(targets) == 0 {
			return errors.New("--replicas: give at least one URL")
		}
		base = targets[0]
	}
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: concurrency}}
	services, err := loadgenInstances(ctx, client, base, admin)
	if err != nil {
		return err
	}
	// Each prober probes its own services (every probers-th), as a
	// prober fleet with bounded assignments does.
	probers = min(probers, len(services))
	pools := make([][]uuid.UUID, probers)
	names := make([][]string, probers)
	total := 0
	for i, s := range services {
		pools[i%probers] = append(pools[i%probers], s.ids...)
		names[i%probers] = append(names[i%probers], s.name)
		total += len(s.ids)
	}
	if total == 0 {
		return errors.New("no loadgen instances: run `muster loadgen seed` first, then start muster on the same data")
	}
	for _, pool := range pools {
		if len(pool) == 0 {
			return fmt.Errorf("--probers %d: some probers would have no instance to probe", probers)
		}
	}
	tokens, err := loadgenProbers(ctx, client, base, iss, admin, names, pools)
	if err != nil {
		return err
	}
	// With --route owner, each batch is one prober's instances of the
	// services one replica evaluates, sent to that replica: jobs, drawn
	// in proportion to their instances so every instance is reported as
	// often as with --route any.
	type job struct {
		prober, target int
		ids            []uuid.UUID
	}
	var (
		jobs    []job
		weights []int // cumulative instances of jobs[:i+1]
	)
	if route == "owner" {
		owners, err := evidenceOwners(ctx, client, targets, admin, services)
		if err != nil {
			return err
		}
		known := 0
		byJob := map[[2]int][]uuid.UUID{}
		for i, s := range services {
			r, ok := owners[s.name]
			if ok {
				known++
			} else {
				r = i % len(targets)
			}
			k := [2]int{i % probers, r}
			byJob[k] = append(byJob[k], s.ids...)
		}
		for p := range probers {
			for r := range targets {
				if ids := byJob[[2]int{p, r}]; len(ids) > 0 {
					jobs = append(jobs, job{prober: p, target: r, ids: ids})
					weights = append(weights, len(ids)+last(weights))
				}
			}
		}
		fmt.Fprintf(stdout, "routes: %d of %d services sent to their owner (GET /v1/evidence/routes), the rest spread\n", known, len(services))
	}
	fmt.Fprintf(stdout, "loading %s with %d instances, batches of %d, %d in flight, %d prober identities, route %s, for %s\n",
		strings.Join(targets, ","), total, batch, concurrency, probers, route, duration)
	if warmup > 0 {
		fmt.Fprintf(stdout, "warming up for %s (unmeasured)\n", warmup)
	}
	var before []replicaCounters
	measuring := func() error {
		before = make([]replicaCounters, len(targets))
		for i, u := range targets {
			c, err := readReplicaCounters(ctx, client, u, admin)
			if err != nil {
				return err
			}
			before[i] = c
		}
		return nil
	}

	var (
		sent, refused, limited atomic.Int64
		mu                     sync.Mutex
		latencies              []time.Duration
		firstErr               error
		wg                     sync.WaitGroup
		// measured: past the warm-up; from then on results count.
		measured atomic.Bool
	)
	start := time.Now()
	warmed := make(chan struct{})
	if warmup <= 0 {
		close(warmed)
		if err := measuring(); err != nil {
			return err
		}
		measured.Store(true)
	} else {
		// The workers run on; at the warm-up's end the counters are
		// read and the figures start from zero.
		go func() {
			defer close(warmed)
			t := time.NewTimer(warmup)
			defer t.Stop()
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			mu.Lock()
			err := measuring()
			if err != nil && firstErr == nil {
				firstErr = err
			}
			start = time.Now()
			latencies = latencies[:0]
			sent.Store(0)
			refused.Store(0)
			limited.Store(0)
			measured.Store(true)
			mu.Unlock()
		}()
	}
	deadline := time.Now().Add(warmup + duration)
	for w := range concurrency {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			reports := make([]evaluator.Report, batch)
			var buf bytes.Buffer
			// Worker w's j-th batch is prober (w + j*concurrency)'s: every
			// prober gets its share of the load.
			for j := 0; time.Now().Before(deadline) && ctx.Err() == nil; j++ {
				p := (w + j*concurrency) % probers
				ids, target := pools[p], targets[(w+j)%len(targets)]
				if len(jobs) > 0 {
					n := rng.IntN(weights[len(weights)-1])
					jb := jobs[sort.SearchInts(weights, n+1)]
					p, ids, target = jb.prober, jb.ids, targets[jb.target]
				}
				for i := range reports {
					outcome := "success"
					if rng.IntN(100) == 0 {
						outcome = "failure"
					}
					reports[i] = evaluator.Report{InstanceID: ids[rng.IntN(len(ids))], Class: "probe", Outcome: outcome}
				}
				buf.Reset()
				_ = json.NewEncoder(&buf).Encode(map[string]any{"reports": reports})
				t0 := time.Now()
				res, err := postReports(ctx, client, target, tokens[p], buf.Bytes())
				lat := time.Since(t0)
				if errors.Is(err, errReportsLimited) {
					limited.Add(1)
					continue
				}
				mu.Lock()
				if err != nil {
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					return
				}
				latencies = append(latencies, lat)
				mu.Unlock()
				sent.Add(int64(res.Accepted))
				refused.Add(int64(len(res.Refused)))
			}
		})
	}
	wg.Wait()
	<-warmed
	mu.Lock()
	elapsed := time.Since(start)
	mu.Unlock()
	if firstErr != nil {
		return firstErr
	}
	if !measured.Load() {
		return errors.New("the run ended before its warm-up did")
	}
	slices.Sort(latencies)
	pct := func(p float64) time.Duration {
		if len(latencies) == 0 {
			return 0
		}
		return latencies[min(len(latencies)-1, int(float64(len(latencies))*p))]
	}
	fmt.Fprintf(stdout, "reports: %d samples accepted, %d refused, in %d batches over %s: %.0f samples/s; batch latency p50 %s p99 %s max %s; %d batches rate-limited (429)\n",
		sent.Load(), refused.Load(), len(latencies), elapsed.Round(time.Millisecond), float64(sent.Load())/elapsed.Seconds(),
		pct(0.50).Round(time.Microsecond), pct(0.99).Round(time.Microsecond), pct(1).Round(time.Microsecond), limited.Load())
	// The region's cost: every replica's CPU, whether it took the
	// reports or was forwarded them, per million samples accepted.
	var (
		sum                 float64
		deltas, transitions float64
	)
	per := make([]string, len(targets))
	for i, u := range targets {
		after, err := readReplicaCounters(ctx, client, u, admin)
		if err != nil {
			return err
		}
		d := after.cpu - before[i].cpu
		sum += d
		deltas += after.deltas - before[i].deltas
		transitions += after.transitions - before[i].transitions
		per[i] = fmt.Sprintf("%s %.2f s", u, d)
	}
	perMillion := func(cpu float64) float64 {
		if sent.Load() == 0 {
			return 0
		}
		return cpu / float64(sent.Load()) * 1e6
	}
	fmt.Fprintf(stdout, "region: %d replicas, %.0f samples/s accepted; muster CPU %.2f s (%s): %.2f CPU-seconds per million samples\n",
		len(targets), float64(sent.Load())/elapsed.Seconds(), sum, strings.Join(per, ", "), perMillion(sum))
	// What the evidence changed, which the CPU above includes: every
	// transition is assembled, published and carried to every replica's
	// views, DNS and xDS, so two runs with different churn are not the
	// same load.
	fmt.Fprintf(stdout, "churn: %.0f eligibility transitions, %.0f view deltas published\n", transitions, deltas)
	return nil
}

// last is xs' last element, 0 for none (a cumulative list's total).
func last(xs []int) int {
	if len(xs) == 0 {
		return 0
	}
	return xs[len(xs)-1]
}

// evidenceOwners asks every target which replica it is and which replica
// evaluates each service (GET /v1/evidence/routes), and returns each
// service's owner as an index into targets: services whose owner is not
// among them, or has none now, are left out. Each target is asked who it
// is, so a token only ever goes to a URL it was given.
func evidenceOwners(ctx context.Context, client *http.Client, targets []string, token string, services []lgService) (map[string]int, error) {
	index := map[string]int{}
	owners := map[string]string{}
	for i, u := range targets {
		for from := 0; from < len(services); from += 200 {
			q := url.Values{}
			for _, s := range services[from:min(from+200, len(services))] {
				q.Add("service", s.name)
			}
			var ans struct {
				Self   string            `json:"self"`
				Owners map[string]string `json:"owners"`
			}
			if err := apiCall(ctx, client, http.MethodGet, u+"/v1/evidence/routes?"+q.Encode(), token, nil, &ans); err != nil {
				return nil, err
			}
			if ans.Self != "" {
				index[ans.Self] = i
			}
			if i == 0 {
				maps.Copy(owners, ans.Owners)
			}
		}
	}
	out := map[string]int{}
	for name, id := range owners {
		if i, ok := index[id]; ok && id != "" {
			out[name] = i
		}
	}
	return out, nil
}

// replicaCounters are the figures of one replica's GET /metrics that a
// run's cost is read from.
type replicaCounters struct {
	cpu, deltas, transitions float64
}

// readReplicaCounters reads process_cpu_seconds_total, and the sums of
// muster_view_deltas_total and muster_eligibility_transitions_total, from
// base's GET /metrics (as the admin tool).
func readReplicaCounters(ctx context.Context, client *http.Client, base, token string) (replicaCounters, error) {
	var c replicaCounters
	families, err := scrapeFamilies(ctx, client, base, token)
	if err != nil {
		return c, err
	}
	f, ok := families["process_cpu_seconds_total"]
	if !ok || len(f.GetMetric()) == 0 {
		return c, fmt.Errorf("GET %s/metrics has no process_cpu_seconds_total", base)
	}
	c.cpu = f.GetMetric()[0].GetCounter().GetValue()
	sum := func(name string) float64 {
		total := 0.0
		for _, m := range families[name].GetMetric() {
			total += m.GetCounter().GetValue()
		}
		return total
	}
	c.deltas = sum("muster_view_deltas_total")
	c.transitions = sum("muster_eligibility_transitions_total")
	return c, nil
}

// scrapeFamilies reads base's GET /metrics (as the admin tool).
func scrapeFamilies(ctx context.Context, client *http.Client, base, token string) (map[string]*dto.MetricFamily, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	res, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("GET %s/metrics: %w", base, err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s/metrics: %d", base, res.StatusCode)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(res.Body)
	if err != nil {
		return nil, fmt.Errorf("GET %s/metrics: %w", base, err)
	}
	return families, nil
}

// loadgenProbers mints a prober identity for each list of services: the
// seeded loadgen prober (assigned every loadgen service by seed) for the
// first, loadgen-prober-N assigned its services through the API for the
// others. It then waits until muster takes a probe report from each about
// one of its instances (the evaluator picks assignments up on its next
// registry refresh).
func loadgenProbers(ctx context.Context, client *http.Client, base string, iss *devissuer.Issuer, admin string, services [][]string, pools [][]uuid.UUID) ([]string, error) {
	tokens := make([]string, len(services))
	for i := range tokens {
		name := loadgenProber
		if i > 0 {
			name = fmt.Sprintf("%s-%d", loadgenProber, i)
			body, err := json.Marshal(registry.ProberAssignments{Services: services[i]})
			if err != nil {
				return nil, err
			}
			if err := apiCall(ctx, client, http.MethodPut, base+"/v1/probers/"+name+"/assignments", admin, body, nil); err != nil {
				return nil, fmt.Errorf("assign prober %s: %w", name, err)
			}
		}
		var err error
		if tokens[i], err = iss.Mint(devissuer.TokenRequest{Kind: identity.KindProber, Subject: name}, time.Now()); err != nil {
			return nil, err
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for i, tok := range tokens {
		one, err := json.Marshal(map[string]any{"reports": []evaluator.Report{{InstanceID: pools[i][0], Class: "probe", Outcome: "success"}}})
		if err != nil {
			return nil, err
		}
		for {
			res, err := postReports(ctx, client, base, tok, one)
			if err != nil {
				return nil, err
			}
			if res.Accepted == 1 {
				break
			}
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("prober %d's reports still refused after 30 s: %+v", i, res.Refused)
			}
			select { // polling with a deadline
			case <-time.After(200 * time.Millisecond):
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
	}
	return tokens, nil
}

// apiCall makes one request with token and decodes a 2xx answer into out
// (if not nil).
func apiCall(ctx context.Context, client *http.Client, method, url, token string, body []byte, out any) error {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := client.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	if res.StatusCode/100 != 2 {
		b, _ := io.ReadAll(io.LimitReader(res.Body, 4<<10))
		return fmt.Errorf("%s %s: %d %s", method, url, res.StatusCode, b)
	}
	if out == nil {
		return nil
	}
	return json.NewDecoder(res.Body).Decode(out)
}

// errReportsLimited is postReports' error for a 429.
var errReportsLimited = errors.New("POST /v1/reports: 429 rate-limited")

func postReports(ctx context.Context, client *http.Client, base, token string, body []byte) (evaluator.Result, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/reports", bytes.NewReader(body))
	if err != nil {
		return evaluator.Result{}, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	res, err := client.Do(req)
	if err != nil {
		return evaluator.Result{}, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		return evaluator.Result{}, err
	}
	if res.StatusCode == http.StatusTooManyRequests {
		return evaluator.Result{}, fmt.Errorf("%w: %s", errReportsLimited, b)
	}
	if res.StatusCode != http.StatusOK {
		return evaluator.Result{}, fmt.Errorf("POST /v1/reports: %d %s", res.StatusCode, b)
	}
	var out evaluator.Result
	return out, json.Unmarshal(b, &out)
}

// lgService is a loadgen service and its active instances.
type lgService struct {
	name string
	ids  []uuid.UUID
}

// loadgenInstances lists the active instances of every loadgen service
// through the API.
func loadgenInstances(ctx context.Context, client *http.Client, base, token string) ([]lgService, error) {
	get := func(path string, v any) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+path, nil)
		if err != nil {
			return err
		}
		req.Header.Set("Authorization", "Bearer "+token)
		res, err := client.Do(req)
		if err != nil {
			return err
		}
		defer res.Body.Close()
		if res.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(res.Body)
			return fmt.Errorf("GET %s: %d %s", path, res.StatusCode, b)
		}
		return json.NewDecoder(res.Body).Decode(v)
	}
	var services []string
	err := eachItem(get, "/v1/services?owner="+loadgenOwner+"&limit=1000", func(s registry.Service) {
		services = append(services, s.Name)
	})
	if err != nil {
		return nil, err
	}
	out := make([]lgService, len(services))
	for i, s := range services {
		out[i].name = s
		err := eachItem(get, "/v1/services/"+s+"/instances?limit=1000", func(in registry.Instance) {
			out[i].ids = append(out[i].ids, in.ID)
		})
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

type memStats struct{ heap uint64 }

func (m *memStats) read() {
	runtime.GC()
	var s runtime.MemStats
	runtime.ReadMemStats(&s)
	m.heap = s.HeapAlloc
}

// eachItem pages through a list endpoint (path already holding a query)
// and calls fn for every item.
func eachItem[T any](get func(path string, out any) error, path string, fn func(T)) error {
	for cursor := ""; ; {
		var p struct {
			Items      []T    `json:"items"`
			NextCursor string `json:"next_cursor"`
		}
		if err := get(path+"&cursor="+url.QueryEscape(cursor), &p); err != nil {
			return err
		}
		for _, it := range p.Items {
			fn(it)
		}
		if cursor = p.NextCursor; cursor == "" {
			return nil
		}
	}
}
