package loadgen

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/google/uuid"
	"google.golang.org/grpc"

	"github.com/musterhq/muster/internal/cli"
	"github.com/musterhq/muster/internal/devissuer"
	"github.com/musterhq/muster/internal/evaluator"
	"github.com/musterhq/muster/internal/identity"
)

// lgXDSOptions are loadgen xds's flags.
type lgXDSOptions struct {
	base, xdsAddr, dir      string
	clients, conns, changes int
	instances               int // --withdrawals: instances the service starts with
	interval, timeout       time.Duration
	delta                   bool
	cpuProfile              string // --withdrawals: this client's CPU profile over the withdrawals
	fullDecode              bool   // --decode proto
}

// lgXDSKeepAlive is how often the withdrawal run's prober reports a
// success for every instance it has not failed: under the default probe
// interval (5 s), since a silent probe class would leave instances
// unknown and a hard failure of an unknown instance is not corroborated
// (ADR-05).
const lgXDSKeepAlive = 2 * time.Second

// loadgenXDSWithdrawals is `muster loadgen xds --withdrawals`: a service
// with o.instances routable instances (probe capability, a prober of its
// own reporting successes), o.clients ADS streams on its assignment, then
// o.changes hard failures of instances not failed before (zones in turn),
// each timed from the report's 200 until every stream's latest
// assignment lacks the instance's endpoint. It prints each withdrawal's
// time to the first and to the last stream, p50/p99 of both and of every
// delivery, and muster's CPU per withdrawal (process_cpu_seconds_total
// from /metrics, before and after; the figure includes the keep-alive
// reports and idle streams of the interval).
func loadgenXDSWithdrawals(ctx context.Context, o lgXDSOptions, stdout, stderr io.Writer) error {
	// At most a third withdrawn, a third of each zone: the min healthy
	// fraction guard (0.5 by default) would otherwise keep or put
	// withdrawn instances back, and the run would time the guard.
	if o.instances < 3 || o.changes > o.instances/3 {
		fmt.Fprintf(stderr, "muster loadgen xds --withdrawals: --changes %d must be at most a third of --instances %d (the min healthy fraction guard)\n", o.changes, o.instances)
		return cli.ErrUsage
	}
	// The client shares the cores with muster: it trades memory for
	// fewer collections of the assignments it decodes.
	defer debug.SetGCPercent(debug.SetGCPercent(400))
	n := rand.IntN(100000)
	svc, proberName := lgXDSPrefix+"w"+strconv.Itoa(n), "loadgen-xds-"+strconv.Itoa(n)
	iss, err := devissuer.LoadOrCreate(o.dir)
	if err != nil {
		return err
	}
	mint := func(r devissuer.TokenRequest) (string, error) {
		r.TTL = 2 * time.Hour
		return iss.Mint(r, time.Now())
	}
	admin, err := mint(devissuer.TokenRequest{Kind: identity.KindTool, Subject: "loadgen", Role: identity.RoleAdmin})
	if err != nil {
		return err
	}
	prober, err := mint(devissuer.TokenRequest{Kind: identity.KindProber, Subject: proberName})
	if err != nil {
		return err
	}
	workload, err := mint(devissuer.TokenRequest{Kind: identity.KindWorkload, Service: svc})
	if err != nil {
		return err
	}
	client := &http.Client{Timeout: 30 * time.Second}
	for _, c := range []struct{ method, path, body string }{
		{http.MethodPut, "/v1/services/" + svc, `{"owner":"loadgen","capabilities":["probe"]}`},
		// No slow start: weights that move for a minute would push
		// assignments of their own and blur the CPU figure.
		{http.MethodPut, "/v1/services/" + svc + "/contract", `{"min_dwell_seconds":5,"slow_start_seconds":0}`},
		{http.MethodPut, "/v1/probers/" + proberName + "/assignments", `{"services":["` + svc + `"]}`},
	} {
		// Each is idempotent: one answered 503 (a database slow to
		// answer, on a loaded machine) is asked again.
		if err := retryUnavailable(ctx, 30*time.Second, func() error {
			return apiCall(ctx, client, c.method, o.base+c.path, admin, []byte(c.body), nil)
		}); err != nil {
			return fmt.Errorf("set up %s: %w", svc, err)
		}
	}
	ids := make([]uuid.UUID, o.instances)
	eps := make([]lgEndpoint, o.instances)
	for i := range ids {
		addr := fmt.Sprintf("10.251.%d.%d", i/250, i%250+1)
		eps[i] = lgEndpoint{addr, 8080}
		var in struct {
			ID uuid.UUID `json:"id"`
		}
		body := fmt.Sprintf(`{"address":%q,"port":8080,"zone":"az%d"}`, addr, i%3+1)
		// Registering the same endpoint again replaces the first
		// registration: safe to ask again after a 503.
		if err := retryUnavailable(ctx, 30*time.Second, func() error {
			return apiCall(ctx, client, http.MethodPost, o.base+"/v1/services/"+svc+"/instances", admin, []byte(body), &in)
		}); err != nil {
			return fmt.Errorf("register instance %d: %w", i, err)
		}
		ids[i] = in.ID
	}

	// The prober: successes for every instance not failed, and the
	// instances' leases renewed.
	var failedMu sync.Mutex
	failed := map[uuid.UUID]bool{}
	successes := func(ctx context.Context) (evaluator.Result, error) {
		failedMu.Lock()
		rs := make([]evaluator.Report, 0, len(ids))
		for _, id := range ids {
			if !failed[id] {
				rs = append(rs, evaluator.Report{InstanceID: id, Class: "probe", Outcome: "success"})
			}
		}
		failedMu.Unlock()
		body, err := json.Marshal(map[string]any{"reports": rs})
		if err != nil {
			return evaluator.Result{}, err
		}
		return postReports(ctx, client, o.base, prober, body)
	}
	// The evaluator takes reports about an instance once it has picked
	// the registration up.
	for deadline := time.Now().Add(o.timeout); ; {
		res, err := successes(ctx)
		if err == nil && len(res.Refused) == 0 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("muster did not take reports about the new instances within %s: %v %+v", o.timeout, err, res.Refused)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond): // polling with a deadline
		}
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() {
		t := time.NewTicker(lgXDSKeepAlive)
		defer t.Stop()
		for n := 1; ; n++ {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if _, err := successes(ctx); err != nil && ctx.Err() == nil {
				fmt.Fprintln(stderr, "keep-alive reports:", err)
			}
			if n%5 == 0 { // every 10 s, a third of the default lease
				// One batch (POST /v1/leases/renewals, one transaction),
				// as an agent renews, rather than a request per instance
				// that would run beside the withdrawals being timed.
				items := make([]map[string]string, len(ids))
				for i, id := range ids {
					items[i] = map[string]string{"instance_id": id.String()}
				}
				body, err := json.Marshal(map[string]any{"renewals": items})
				if err == nil {
					var res struct {
						Renewed int `json:"renewed"`
					}
					err = apiCall(ctx, client, http.MethodPost, o.base+"/v1/leases/renewals", admin, body, &res)
					if err == nil && res.Renewed != len(ids) {
						err = fmt.Errorf("%d of %d leases renewed", res.Renewed, len(ids))
					}
				}
				if err != nil && ctx.Err() == nil {
					fmt.Fprintln(stderr, "lease renewal:", err)
				}
			}
		}
	})

	cc := make([]*grpc.ClientConn, o.conns)
	for i := range cc {
		if cc[i], err = grpc.NewClient(o.xdsAddr, lgXDSDialOptions(workload)...); err != nil {
			return err
		}
		defer cc[i].Close()
	}
	start := time.Now()
	watch := &lgWithdrawalWatch{}
	streams, refused, err := openXDSStreams(ctx, &wg, cc, o.clients, o.delta, svc, o.timeout, func(s *lgXDSStream) {
		s.watch, s.fullDecode = watch, o.fullDecode
	})
	if err != nil {
		return err
	}
	// Every instance eligible (HEALTHY) on every stream before the first
	// failure.
	if err := pollStreams(ctx, start.Add(o.timeout), func() (int, error) {
		missing := 0
		for _, s := range streams {
			if err := s.failed(); err != nil {
				return 0, fmt.Errorf("a stream failed: %w", err)
			}
			for _, ep := range eps {
				if !s.healthy(ep) {
					missing++
					break
				}
			}
		}
		return missing, nil
	}); err != nil {
		return fmt.Errorf("connect (every stream listing all %d instances HEALTHY): %w", o.instances, err)
	}
	fmt.Fprintf(stdout, "%d %s ADS streams over %d connections hold %s with %d routable instances (connected in %s, %d admission refusals)\n",
		o.clients, map[bool]string{false: "state-of-the-world", true: "delta"}[o.delta], o.conns, svc, o.instances,
		time.Since(start).Round(time.Millisecond), refused)

	scraper := &lgWatch{lgwOptions: lgwOptions{base: o.base}, adminToken: admin, api: client}
	before, err := scraper.scrape(ctx)
	if err != nil {
		return err
	}
	if o.cpuProfile != "" {
		f, err := os.Create(o.cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	clientBefore := clientCPU()
	began := time.Now()
	var toAll, toFirst, deliveries []time.Duration
	early := 0                              // deliveries before the report's 200 arrived
	lost := make([]time.Time, len(streams)) // when each stream lost the endpoint
	for k := range o.changes {
		// Instance k: zones in turn (instance i is in zone i%3), each
		// failed once (a hard failure takes minutes of success to undo).
		id, ep := ids[k], eps[k]
		failedMu.Lock()
		failed[id] = true
		failedMu.Unlock()
		body, err := json.Marshal(map[string]any{"reports": []evaluator.Report{{InstanceID: id, Class: "probe", Outcome: "hard_failure"}}})
		if err != nil {
			return err
		}
		// Every stream tells the watch when the endpoint leaves its
		// assignment; once none lists it, one pass checks that none has
		// it back (polling, with the deadline, from then on if one has).
		done := watch.expect(ep, len(streams))
		res, err := postReports(ctx, client, o.base, prober, body)
		if err != nil {
			return fmt.Errorf("withdrawal %d: %w", k+1, err)
		}
		acked := time.Now()
		if res.Accepted != 1 {
			return fmt.Errorf("withdrawal %d: hard failure of %s refused: %+v", k+1, id, res.Refused)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-done:
		case <-time.After(o.timeout):
		}
		// The pass that finds none missing keeps each stream's time
		// (one look-up per stream, which is this client's CPU too).
		if err := pollStreams(ctx, acked.Add(o.timeout), func() (int, error) {
			missing := 0
			for i, s := range streams {
				if lost[i] = s.withdrawn(ep); lost[i].IsZero() {
					if err := s.failed(); err != nil {
						return 0, fmt.Errorf("a stream failed: %w", err)
					}
					missing++
				}
			}
			return missing, nil
		}); err != nil {
			return fmt.Errorf("withdrawal %d (%s): %w", k+1, ep, err)
		}
		var lo, hi time.Duration
		for i := range streams {
			d := lost[i].Sub(acked)
			if d < 0 {
				early++
				d = 0
			}
			deliveries = append(deliveries, d)
			if i == 0 || d < lo {
				lo = d
			}
			hi = max(hi, d)
		}
		toFirst, toAll = append(toFirst, lo), append(toAll, hi)
		fmt.Fprintf(stdout, "withdrawal %2d: %-18s first stream %8s  all %d streams %8s\n", k+1, ep, lo.Round(100*time.Microsecond), o.clients, hi.Round(100*time.Microsecond))
		if k+1 < o.changes {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(o.interval): // pacing between withdrawals
			}
		}
	}
	elapsed := time.Since(began)
	clientUsed := clientCPU() - clientBefore
	after, err := scraper.scrape(ctx)
	if err != nil {
		return err
	}
	q := func(ds []time.Duration, f float64) time.Duration {
		s := slices.Clone(ds)
		slices.Sort(s)
		return s[min(len(s)-1, int(f*float64(len(s))))].Round(100 * time.Microsecond)
	}
	fmt.Fprintf(stdout, "withdrawal time to all %d streams, from the report's 200 (%d withdrawals): p50 %s  p99 %s  max %s\n", o.clients, o.changes, q(toAll, .5), q(toAll, .99), q(toAll, 1))
	fmt.Fprintf(stdout, "withdrawal time to the first stream: p50 %s  p99 %s\n", q(toFirst, .5), q(toFirst, .99))
	fmt.Fprintf(stdout, "every delivery (%d of %d streams x %d withdrawals): p50 %s  p99 %s  (%d before the 200, counted as 0)\n",
		len(deliveries), o.clients, o.changes, q(deliveries, .5), q(deliveries, .99), early)
	cpu := time.Duration((after.cpu - before.cpu) / float64(o.changes) * float64(time.Second))
	fmt.Fprintf(stdout, "muster CPU per withdrawal: %s (process_cpu_seconds_total +%.2f s over %s, %d withdrawals %s apart)\n",
		cpu.Round(100*time.Microsecond), after.cpu-before.cpu, elapsed.Round(time.Millisecond), o.changes, o.interval)
	fmt.Fprintf(stdout, "this client's CPU per withdrawal: %s (decoding every stream's assignment; +%.2f s)\n",
		(clientUsed / time.Duration(o.changes)).Round(100*time.Microsecond), clientUsed.Seconds())
	return nil
}

// clientCPU is the CPU time (user and system) this process has used.
func clientCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// pollStreams calls missing until it returns 0 (nil), an error, or the
// deadline passes.
func pollStreams(ctx context.Context, deadline time.Time, missing func() (int, error)) error {
	for {
		n, err := missing()
		if err != nil || n == 0 {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d streams still missing it after the timeout", n)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Millisecond): // polling with a deadline
		}
	}
}
