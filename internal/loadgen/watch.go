package loadgen

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/cli"
	"github.com/musterhq/muster/internal/devissuer"
	"github.com/musterhq/muster/internal/evaluator"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/registry"
)

// loadgenWatch holds real watch subscribers over loopback against a running
// muster, injects hard failures and new instances through the API, and
// measures how long each change takes to be applied by every subscriber:
// withdrawal lag (first failed sample -> applied), addition lag, subscribers
// held, and the server's RSS per idle subscriber. Run it against a freshly
// started server: RSS a previous run freed is not given back at once, so a
// warm server shows too little (the Go heap figure printed beside it does
// not have that problem).
func loadgenWatch(ctx context.Context, env Env, args []string, stdout, stderr io.Writer) error {
	o, err := parseLoadgenWatch(args, stderr)
	if err != nil {
		return err
	}
	o.env = env
	return o.run(ctx, stdout, stderr)
}

// parseLoadgenWatch reads loadgen watch's flags.
func parseLoadgenWatch(args []string, stderr io.Writer) (lgwOptions, error) {
	var o lgwOptions
	fs := cli.NewFlags("loadgen watch", stderr)
	fs.StringVar(&o.base, "url", "http://127.0.0.1:8080", "muster to watch")
	var replicas string
	fs.StringVar(&replicas, "replicas", "", "comma-separated base URLs of replicas of one region, instead of --url: subscribers are spread over them round-robin (a dropped stream reconnects to a random one), hard-failure reports go to each in turn, and the withdrawal lag is printed per replica; setup, additions, keep-alive reports and /metrics use the first (a URL may be given twice)")
	fs.StringVar(&o.dir, "data", ".muster", "dev data folder, for minting tokens")
	fs.IntVar(&o.clients, "clients", 1000, "watch streams to hold")
	fs.IntVar(&o.perClient, "services-per-client", 3, "services each stream watches")
	fs.IntVar(&o.failures, "failures", 200, "instances to hard-fail, spread over the run")
	fs.IntVar(&o.burst, "burst", 0, "evacuation burst: hard-fail this many instances over one minute, in batches every 100 ms, no zone of a service losing more than a third (replaces --failures; 0 = off)")
	fs.IntVar(&o.additions, "additions", 50, "new instances to register, spread over the run")
	fs.DurationVar(&o.duration, "duration", 60*time.Second, "how long to inject for, once every stream is held")
	fs.IntVar(&o.connectConcurrency, "connect-concurrency", 200, "watch requests in flight while connecting")
	fs.IntVar(&o.onlyServices, "services", 0, "watch (and fail and add to) only the first N loadgen services; --services 1 --services-per-client 1 delivers every change to every subscriber (0 = all)")
	fs.IntVar(&o.setupRate, "setup-rate", 1000, "instances made eligible per second during setup: kept under muster's change budget (2,000/s) so the setup causes no addition-shedding episode of its own")
	fs.DurationVar(&o.connectTimeout, "connect-timeout", 5*time.Minute, "give up waiting for every stream to be held after this long")
	fs.BoolVar(&o.restart, "restart", false, "instead of injecting changes: run muster dev on --data as a child process, connect the subscribers (default 10,000), restart muster, and measure readmission through the default admission settings (--url is not used)")
	fs.StringVar(&o.addr, "addr", "127.0.0.1:0", "--restart: address the child muster listens on (both processes)")
	fs.DurationVar(&o.admissionWindow, "admission-window", 10*time.Second, "--restart: muster's admission window (MUSTER_ADMISSION_WINDOW)")
	fs.IntVar(&o.admissionFloor, "admission-floor", 50, "--restart: the restarted muster's admission floor (MUSTER_ADMISSION_FLOOR)")
	fs.DurationVar(&o.readmitTimeout, "readmit-timeout", 20*time.Minute, "--restart: give up waiting for every subscriber to be readmitted after this long")
	if err := cli.Parse(fs, args); err != nil {
		return o, err
	}
	clientsSet, urlSet := false, false
	fs.Visit(func(f *flag.Flag) {
		clientsSet = clientsSet || f.Name == "clients"
		urlSet = urlSet || f.Name == "url"
	})
	if replicas != "" {
		if o.restart || urlSet {
			fmt.Fprintln(stderr, "muster loadgen watch: --replicas replaces --url and does not go with --restart")
			return o, cli.ErrUsage
		}
		for r := range strings.SplitSeq(replicas, ",") {
			r = strings.TrimRight(strings.TrimSpace(r), "/")
			if u, err := url.Parse(r); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				fmt.Fprintf(stderr, "muster loadgen watch: --replicas: %q is not an http(s) base URL\n", r)
				return o, cli.ErrUsage
			}
			o.replicas = append(o.replicas, r)
		}
		o.base = o.replicas[0]
	}
	if o.restart && !clientsSet {
		o.clients = 10000
	}
	if o.clients < 1 || o.perClient < 1 || o.perClient > 100 || o.failures < 0 || o.burst < 0 || o.additions < 0 || o.duration <= 0 || o.connectConcurrency < 1 || o.setupRate < 1 || o.onlyServices < 0 {
		fmt.Fprintln(stderr, "muster loadgen watch: --clients, --connect-concurrency, --setup-rate and --duration must be positive, --services-per-client 1 to 100, --failures, --burst and --additions not negative")
		return o, cli.ErrUsage
	}
	if o.restart && (o.admissionWindow < time.Second || o.admissionFloor < 1 || o.readmitTimeout <= 0) {
		fmt.Fprintln(stderr, "muster loadgen watch --restart: --admission-window must be at least 1s, --admission-floor and --readmit-timeout positive")
		return o, cli.ErrUsage
	}
	o.base = strings.TrimRight(o.base, "/")
	return o, nil
}

// run runs loadgen watch with these options.
func (o lgwOptions) run(ctx context.Context, stdout, stderr io.Writer) error {
	w := &lgWatch{lgwOptions: o, stdout: stdout, stderr: stderr, baseBackoff: 250 * time.Millisecond, maxBackoff: 30 * time.Second,
		reportsTo: make([]atomic.Int64, len(o.replicas)), streamsTo: make([]atomic.Int64, len(o.replicas))}
	if o.restart {
		return w.runRestart(ctx)
	}
	return w.run(ctx)
}

type lgwOptions struct {
	base, dir                string
	clients, perClient       int
	failures, additions      int
	burst                    int // hard failures in the one-minute burst; 0: paced failures instead
	duration, connectTimeout time.Duration
	connectConcurrency       int
	setupRate                int // instances made eligible per second during setup
	onlyServices             int // watch only the first N services (0: all)
	// replicas (--replicas) are the base URLs of a region's replicas:
	// subscribers and hard-failure reports are spread over them. Empty:
	// everything goes to base. Otherwise base is replicas[0].
	replicas []string

	// --restart: run muster as a child process and restart it.
	restart         bool
	addr            string
	admissionWindow time.Duration
	admissionFloor  int
	readmitTimeout  time.Duration
	// env opens the database (--restart) and holds what is added to the
	// child muster's environment.
	env Env
}

// lgwClientsPerIdentity is how many subscribers share one identity.
const lgwClientsPerIdentity = 1000

// lgWatch is one run of loadgen watch.
type lgWatch struct {
	lgwOptions
	stdout, stderr io.Writer

	adminToken, proberToken string
	// watchTokens are the subscribers' identities, one per
	// lgwClientsPerIdentity clients, since muster caps the streams one
	// identity holds open (MUSTER_WATCH_STREAMS_LIMIT, 10,000).
	watchTokens    []string
	api            *http.Client // setup, reports, registrations, metrics
	streams        *http.Client // watch streams only
	connectSem     chan struct{}
	services       []*lgwService
	others         []*lgwService // loadgen services not watched (--services): kept eligible only
	servicesByName map[string]*lgwService
	zones          []*lgwZone // failure targets; used by the failure injector only

	held, open     atomic.Int64 // streams that got their first views; streams open now
	refusals       atomic.Int64 // 503 admission answers
	reconnects     atomic.Int64 // streams that ended and were opened again
	streamErrors   atomic.Int64 // failed requests and non-200, non-503 answers
	gaps           atomic.Int64 // deltas whose from_version was not the copy's version
	parseErrors    atomic.Int64
	frameViews     atomic.Int64
	frameDeltas    atomic.Int64
	frameBeats     atomic.Int64
	firstStreamErr atomic.Pointer[error]

	// Full-jitter backoff between subscriptions: sleep = rand *
	// min(maxBackoff, baseBackoff * 2^attempt), or the server's
	// Retry-After when longer (as the resolver does).
	baseBackoff, maxBackoff time.Duration

	// --restart: gen is the muster process answering (1 before the
	// restart, 2 once the first has exited); the counts are of what
	// happened under gen 2.
	gen            atomic.Int32
	readmitted     atomic.Int64 // clients admitted at least once by gen 2
	doubleAdmits   atomic.Int64 // admissions by gen 2 beyond a client's first
	refusedGen2    atomic.Int64 // 503 answers from gen 2
	resynced       atomic.Int64 // clients that got synced from gen 2
	syncedEarly    atomic.Int64 // synced from gen 2 before a frame of every watched service on that stream
	restartClients []*lgwClient

	cache sync.Map // lgwFrameKey -> *lgwParsed: frames are the same bytes for every subscriber

	injMu      sync.Mutex
	injections []*lgwInjection
	failed     map[uuid.UUID]bool // instances hard-failed: no more successes for them
	ramped     []uuid.UUID        // instances setup has made eligible so far
	added      []uuid.UUID        // instances registered: kept alive and their leases renewed

	// --replicas: hard-failure reports go to the replicas in turn
	// (reportTurn); reportsTo and streamsTo count the reports posted to
	// and the streams admitted by each.
	reportTurn           atomic.Uint64
	successRefusedOnce   sync.Once
	reportsTo, streamsTo []atomic.Int64

	lagMu        sync.Mutex
	withdrawLags []time.Duration
	additionLags []time.Duration
	// withdrawAllLags: per withdrawal, first failed sample -> applied by
	// the last of its service's subscribers.
	withdrawAllLags []time.Duration
	// seen (--replicas only): every subscriber's first sight of a
	// withdrawal, with the replica its stream was on; the lag from the
	// report's acknowledgement is taken once the run is over, when every
	// acknowledgement time is known.
	seen []lgwSeen
}

// lgwService is one watched service: its instances interned to small local
// indexes (so a subscriber's copy is a pair of bitsets), and the changes
// injected into it.
type lgwService struct {
	name     string
	watchers int // clients whose streams include it

	mu         sync.RWMutex
	index      map[uuid.UUID]int32
	injections []*lgwInjection

	instances []registry.Instance // as listed at setup
}

func (s *lgwService) intern(id uuid.UUID) int32 {
	s.mu.RLock()
	i, ok := s.index[id]
	s.mu.RUnlock()
	if ok {
		return i
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if i, ok := s.index[id]; ok {
		return i
	}
	i = int32(len(s.index))
	s.index[id] = i
	return i
}

// lgwInjection is one injected change: a hard failure or a new instance.
type lgwInjection struct {
	n        int // its number, for the subscribers' applied-once bitsets
	id       uuid.UUID
	idx      int32
	svc      *lgwService
	zone     *lgwZone // failures only
	addition bool
	at       time.Time // just before the POST
	// acked is when the POST's answer arrived (zero if it failed), and
	// replica the --replicas replica it went to. Written by the
	// injector, read once injection is over.
	acked   time.Time
	replica int
	applied atomic.Int64
	void    atomic.Bool // the server refused it: not expected, not sampled
}

func (w *lgWatch) run(ctx context.Context) error {
	// Successes are repeated from the start of setup to the end of the
	// run: a probe class silent for its interval would leave instances
	// unknown (and, arriving back, they would be additions the run did
	// not mean to make).
	if err := w.prepare(ctx); err != nil {
		return err
	}
	// Deferred in this order so that keepAlive is stopped, then waited
	// for, on every return.
	var keep sync.WaitGroup
	defer keep.Wait()
	keepCtx, stopKeep := context.WithCancel(ctx)
	defer stopKeep()
	keep.Go(func() { w.keepAlive(keepCtx) })
	if err := w.setup(ctx); err != nil {
		return err
	}
	// One socket per stream, and up to 16 idle API connections per
	// replica besides.
	raiseNoFile(w.clients+256+16*len(w.replicas), w.stderr)

	// Subscribers.
	before, err := w.scrape(ctx)
	if err != nil {
		return err
	}
	streamCtx, stopStreams := context.WithCancel(ctx)
	defer stopStreams()
	clients := w.newClients()
	where := w.base
	if len(w.replicas) > 0 {
		where = fmt.Sprintf("%d replicas (%s)", len(w.replicas), strings.Join(w.replicas, ", "))
	}
	fmt.Fprintf(w.stdout, "holding %d watch streams of %d services each over %d services at %s (%d connecting at once)\n",
		w.clients, len(clients[0].copies), len(w.services), where, w.connectConcurrency)
	var wg sync.WaitGroup
	connectStart := time.Now()
	for _, c := range clients {
		wg.Go(func() { c.run(streamCtx) })
	}
	if err := w.waitHeld(ctx, connectStart); err != nil {
		stopStreams()
		wg.Wait()
		return err
	}
	connectTook := time.Since(connectStart)
	refusedConnecting := w.refusals.Load()
	held := w.held.Load()
	fmt.Fprintf(w.stdout, "connected %d of %d subscribers in %s (%d admission refusals, %d failed requests)\n",
		held, w.clients, connectTook.Round(time.Millisecond), refusedConnecting, w.streamErrors.Load())
	time.Sleep(2 * time.Second) // let the server settle (idle streams, buffers) before measuring it
	after, err := w.scrape(ctx)
	if err != nil {
		stopStreams()
		wg.Wait()
		return err
	}
	// The server measured is the one at --url, or the first of
	// --replicas: per subscriber is per subscriber it holds.
	server, perServer := "server", held
	if len(w.replicas) > 0 {
		server, perServer = "replica 1 ("+w.base+")", int64(after.subscribers)
	}
	rssPer := (after.rss - before.rss) / float64(max(perServer, 1))
	fmt.Fprintf(w.stdout, "%s RSS %.1f MiB -> %.1f MiB with %d streams open (server says %.0f)\n",
		server, float64(before.rss)/(1<<20), float64(after.rss)/(1<<20), w.open.Load(), after.subscribers)

	// Injection.
	frames0 := w.frames()
	cpu0 := processCPU()
	injectStart := time.Now()
	window := w.duration
	if w.burst > 0 {
		window = max(window, lgwBurstWindow)
		fmt.Fprintf(w.stdout, "injecting a burst of %d hard failures over %s (batches of up to %d every %s, at most a third of each zone) and %d additions over %s\n",
			w.burst, lgwBurstWindow, lgwBurstBatch, lgwBurstTick, w.additions, w.duration)
	} else {
		fmt.Fprintf(w.stdout, "injecting %d hard failures and %d additions over %s\n", w.failures, w.additions, w.duration)
	}
	var inj sync.WaitGroup
	var failuresSent, failuresSkipped, failuresRefused, additionsSent atomic.Int64
	var injErr error
	var injErrOnce sync.Once
	injCtx, stopInj := context.WithTimeout(ctx, window)
	defer stopInj()
	setErr := func(err error) {
		// An injection cut short by the end of the run is not a failure.
		if err != nil && ctx.Err() == nil && injCtx.Err() == nil {
			injErrOnce.Do(func() { injErr = err })
		}
	}
	var burst lgwBurstResult
	var shedSamples, shedSeen atomic.Int64
	if w.burst > 0 {
		inj.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
			burst = w.injectBurst(injCtx, rng, injectStart, setErr)
		})
		// Sample the shedding gauge through the burst: it may be back
		// to 0 by the end.
		inj.Go(func() {
			for i := 1; sleepUntil(injCtx, injectStart.Add(time.Duration(i)*time.Second)); i++ {
				if s, err := w.scrape(injCtx); err == nil {
					shedSamples.Add(1)
					if s.shedding > 0 {
						shedSeen.Add(1)
					}
				}
			}
		})
	} else if w.failures > 0 {
		inj.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
			every := w.duration / time.Duration(w.failures)
			for i := range w.failures {
				if !sleepUntil(injCtx, injectStart.Add(time.Duration(i)*every)) {
					return
				}
				ok, err := w.injectFailure(injCtx, rng)
				switch {
				case errors.Is(err, errLgwRefused):
					failuresRefused.Add(1)
					fmt.Fprintln(w.stderr, "warning:", err)
				case err != nil:
					setErr(err)
					return
				case ok:
					failuresSent.Add(1)
				default:
					failuresSkipped.Add(1)
				}
			}
		})
	}
	if w.additions > 0 {
		inj.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 2))
			every := w.duration / time.Duration(w.additions)
			base := rng.IntN(1 << 15)
			for i := range w.additions {
				if !sleepUntil(injCtx, injectStart.Add(every/2+time.Duration(i)*every)) {
					return
				}
				if err := w.injectAddition(injCtx, rng, base+i); err != nil {
					setErr(err)
					return
				}
				additionsSent.Add(1)
			}
		})
	}
	inj.Wait()
	<-injCtx.Done()
	if ctx.Err() != nil {
		stopStreams()
		wg.Wait()
		return ctx.Err()
	}
	// Grace: wait (up to 10 s) for every subscriber to apply the last changes.
	graceEnd := time.Now().Add(10 * time.Second)
	for time.Now().Before(graceEnd) && w.pending() > 0 {
		time.Sleep(100 * time.Millisecond)
	}
	elapsed := time.Since(injectStart)
	frames1 := w.frames()
	cpu1 := processCPU()
	stillOpen := w.open.Load()
	end, err := w.scrape(ctx)
	if err != nil {
		return err
	}
	stopKeep()
	keep.Wait()
	stopStreams()
	wg.Wait()

	// Report.
	w.lagMu.Lock()
	wl, al, wall := slices.Clone(w.withdrawLags), slices.Clone(w.additionLags), slices.Clone(w.withdrawAllLags)
	w.lagMu.Unlock()
	slices.Sort(wl)
	slices.Sort(al)
	slices.Sort(wall)
	var wantW, wantA int64
	w.injMu.Lock()
	for _, in := range w.injections {
		if in.void.Load() {
			continue
		}
		if in.addition {
			wantA += int64(in.svc.watchers)
		} else {
			wantW += int64(in.svc.watchers)
		}
	}
	w.injMu.Unlock()
	fmt.Fprintf(w.stdout, "subscribers: %d of %d held (%d open at the end), connected in %s, %d admission refusals (%d while connecting), %d reconnects, %d failed requests, %d delta gaps\n",
		held, w.clients, stillOpen, connectTook.Round(time.Millisecond), w.refusals.Load(), refusedConnecting,
		w.reconnects.Load(), w.streamErrors.Load(), w.gaps.Load())
	if w.burst > 0 {
		fmt.Fprintf(w.stdout, "burst: %d of %d requested hard failures injected in %s in %d POSTs (%d refused; the one-third-per-zone headroom allowed %d)\n",
			burst.sent, w.burst, burst.took.Round(time.Millisecond), burst.posts, burst.refused, burst.headroom)
		if burst.headroom < w.burst {
			fmt.Fprintf(w.stdout, "burst: only %d instances can fail without any zone of a service losing more than a third; they were injected at the requested rate (%d per minute), so the burst was shorter than a minute\n",
				burst.headroom, w.burst)
		}
		fmt.Fprintf(w.stdout, "burst withdrawal lag (first failed sample -> applied by subscriber): p50 %s p99 %s p99.9 %s max %s over %d applications of %d failures (%d expected)\n",
			pctOf(wl, 0.50), pctOf(wl, 0.99), pctOf(wl, 0.999), pctOf(wl, 1), len(wl), burst.sent, wantW)
		fmt.Fprintf(w.stdout, "burst shedding: muster_shed_episodes_total %.0f -> %.0f, muster_additions_shedding %.0f -> %.0f (1 in %d of %d one-second samples during the burst)\n",
			after.shedEpisodes, end.shedEpisodes, after.shedding, end.shedding, shedSeen.Load(), shedSamples.Load())
		var b strings.Builder
		for _, le := range []string{"0.1", "0.25", "0.5", "1", "2", "5", "+Inf"} {
			fmt.Fprintf(&b, " le=%s %.0f", le, end.lagBuckets[le])
		}
		fmt.Fprintf(w.stdout, "server muster_withdrawal_lag_seconds at the end, summed over services (cumulative):%s (%.0f observed before the burst)\n",
			b.String(), after.lagBuckets["+Inf"])
	} else {
		fmt.Fprintf(w.stdout, "withdrawal lag (first failed sample -> applied by subscriber): p50 %s p99 %s p99.9 %s max %s over %d applications of %d failures (%d expected; %d skipped for zone headroom, %d refused)\n",
			pctOf(wl, 0.50), pctOf(wl, 0.99), pctOf(wl, 0.999), pctOf(wl, 1), len(wl), failuresSent.Load(), wantW, failuresSkipped.Load(), failuresRefused.Load())
	}
	fmt.Fprintf(w.stdout, "withdrawal time to all (first failed sample -> applied by the last of the service's subscribers): p50 %s p99 %s max %s over %d withdrawals\n",
		pctOf(wall, 0.50), pctOf(wall, 0.99), pctOf(wall, 1), len(wall))
	if len(w.replicas) > 0 {
		w.reportReplicas(clients)
	}
	fmt.Fprintf(w.stdout, "addition lag (registered -> applied by subscriber): p50 %s p99 %s max %s over %d applications of %d additions (%d expected)\n",
		pctOf(al, 0.50), pctOf(al, 0.99), pctOf(al, 1), len(al), additionsSent.Load(), wantA)
	v, d, h := frames1[0]-frames0[0], frames1[1]-frames0[1], frames1[2]-frames0[2]
	fmt.Fprintf(w.stdout, "frames: %d received in %s: %.0f frames/s (%d views, %d deltas, %d heartbeats)\n",
		v+d+h, elapsed.Round(time.Millisecond), float64(v+d+h)/elapsed.Seconds(), v, d, h)
	fmt.Fprintf(w.stdout, "%s RSS per idle subscriber: %.1f KiB (RSS %+.1f MiB, Go heap in use %+.1f MiB = %.1f KiB each, for %d subscribers)\n",
		server, rssPer/1024, (after.rss-before.rss)/(1<<20), (after.heap-before.heap)/(1<<20), (after.heap-before.heap)/float64(max(perServer, 1))/1024, perServer)
	fmt.Fprintf(w.stdout, "cpu while injecting: %s %.0f%% of a core, this process %.0f%% of a core (%d cores)\n",
		server, 100*(end.cpu-after.cpu)/elapsed.Seconds(), 100*(cpu1-cpu0).Seconds()/elapsed.Seconds(), runtime.NumCPU())
	if w.parseErrors.Load() > 0 {
		fmt.Fprintf(w.stderr, "warning: %d frames could not be parsed\n", w.parseErrors.Load())
	}
	return injErr
}

// newClients builds the subscribers, each watching --services-per-client
// services in turn.
func (w *lgWatch) newClients() []*lgwClient {
	clients := make([]*lgwClient, w.clients)
	for i := range clients {
		c := &lgwClient{w: w, n: i}
		if len(w.replicas) > 0 {
			c.replica = i % len(w.replicas)
		}
		for j := range w.perClient {
			svc := w.services[(i*w.perClient+j)%len(w.services)]
			if !slices.ContainsFunc(c.copies, func(cp *lgwCopy) bool { return cp.svc == svc }) {
				c.copies = append(c.copies, &lgwCopy{svc: svc})
				svc.watchers++
			}
		}
		clients[i] = c
	}
	return clients
}

// setup makes every instance eligible (ramped, see rampSuccesses) and
// snapshots the views to choose failures from. It runs after prepare
// (which mints tokens and lists the loadgen services and instances) and
// with keepAlive repeating the successes.
func (w *lgWatch) setup(ctx context.Context) error {
	total := 0
	for _, s := range w.services {
		total += len(s.instances)
	}
	fmt.Fprintf(w.stdout, "found %d loadgen services with %d instances at %s\n", len(w.services), total, w.base)

	// Make every instance eligible: one probe success each, then wait for
	// the views to say so. keepAlive repeats this during the run, since a
	// silent probe class would leave instances unknown, and a hard failure
	// of an unknown instance is not corroborated (ADR-05).
	began := time.Now()
	if err := w.rampSuccesses(ctx, w.liveInstances()); err != nil {
		return err
	}
	// Every service, not a sample: 'unknown -> eligible' travels on the
	// addition queue, which sheds (grows its window) when thousands of
	// instances change at once, so services come round at different times.
	deadline := time.Now().Add(60 * time.Second)
	waiting := slices.Clone(w.services)
	for {
		var still []*lgwService
		for _, s := range waiting {
			v, status, err := w.resolve(ctx, s.name)
			if err != nil {
				return err
			}
			if status != http.StatusOK || len(v.Endpoints) == 0 || eligibleFraction(v) < 0.9 {
				still = append(still, s)
			}
		}
		if waiting = still; len(waiting) == 0 {
			break
		}
		if time.Now().After(deadline) {
			fmt.Fprintf(w.stderr, "warning: %d services still show under 90%% of endpoints eligible after 60 s; going on\n", len(waiting))
			break
		}
		// keepAlive repeats the successes meanwhile.
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
	fmt.Fprintf(w.stdout, "instances made eligible in %s (at most %d a second)\n", time.Since(began).Round(time.Millisecond), w.setupRate)
	if err := w.waitUnshed(ctx); err != nil {
		return err
	}

	// Snapshot every view for the failure targets and zone headroom.
	w.zones = nil
	candidates := 0
	for _, s := range w.services {
		v, status, err := w.resolve(ctx, s.name)
		if err != nil {
			return err
		}
		if status != http.StatusOK {
			continue
		}
		// Only instances that stay for the run: a registered instance
		// whose lease runs out would leave the view on its own.
		stays := map[uuid.UUID]bool{}
		for _, in := range s.instances {
			if in.LeaseExpiresAt == nil || in.LeaseExpiresAt.After(time.Now().Add(time.Hour+w.duration)) {
				stays[in.ID] = true
			}
		}
		byZone := map[string][]uuid.UUID{}
		for _, e := range v.Endpoints {
			if e.State == "eligible" && stays[e.InstanceID] {
				byZone[e.Zone] = append(byZone[e.Zone], e.InstanceID)
			}
		}
		for _, name := range slices.Sorted(maps.Keys(v.Zones)) {
			zs := v.Zones[name]
			if zs.Guard != assembler.GuardOK || len(byZone[name]) == 0 {
				continue
			}
			z := &lgwZone{svc: s, name: name, total: zs.Total, eligible: zs.Eligible, minFraction: zs.MinHealthyFraction, targets: byZone[name]}
			rand.Shuffle(len(z.targets), func(i, j int) { z.targets[i], z.targets[j] = z.targets[j], z.targets[i] })
			candidates += len(z.targets)
			w.zones = append(w.zones, z)
		}
	}
	fmt.Fprintf(w.stdout, "%d zones with %d eligible instances to fail\n", len(w.zones), candidates)
	return nil
}

// prepare mints tokens, builds the HTTP clients and lists the loadgen
// services and their instances.
func (w *lgWatch) prepare(ctx context.Context) error {
	iss, err := devissuer.LoadOrCreate(w.dir)
	if err != nil {
		return err
	}
	if w.adminToken, err = iss.Mint(devissuer.TokenRequest{Kind: identity.KindTool, Subject: "loadgen", Role: identity.RoleAdmin, TTL: 2 * time.Hour}, time.Now()); err != nil {
		return err
	}
	if w.proberToken, err = iss.Mint(devissuer.TokenRequest{Kind: identity.KindProber, Subject: loadgenProber, TTL: 2 * time.Hour}, time.Now()); err != nil {
		return err
	}
	w.watchTokens = make([]string, (w.clients+lgwClientsPerIdentity-1)/lgwClientsPerIdentity)
	for i := range w.watchTokens {
		req := devissuer.TokenRequest{Kind: identity.KindTool, Subject: fmt.Sprintf("loadgen-watch-%d", i), TTL: 2 * time.Hour}
		if w.watchTokens[i], err = iss.Mint(req, time.Now()); err != nil {
			return err
		}
	}
	w.api = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	dialer := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	w.streams = &http.Client{Transport: &http.Transport{
		DialContext: dialer.DialContext, MaxConnsPerHost: 0, MaxIdleConns: w.clients, MaxIdleConnsPerHost: w.clients,
		DisableCompression: true, ResponseHeaderTimeout: 30 * time.Second, IdleConnTimeout: time.Minute,
	}}
	w.connectSem = make(chan struct{}, w.connectConcurrency)
	w.failed = map[uuid.UUID]bool{}

	if err := w.listServices(ctx); err != nil {
		return err
	}
	if len(w.services) == 0 {
		return errors.New("no loadgen services: run `muster loadgen seed` first, then start muster on the same data")
	}
	if w.onlyServices > 0 && w.onlyServices < len(w.services) {
		// The rest are not watched, failed or added to; every instance
		// is still kept eligible (liveInstances lists them all).
		w.others = w.services[w.onlyServices:]
		w.services = w.services[:w.onlyServices]
	}
	return nil
}

// lgwZone is one zone of one service, as the setup snapshot saw it.
type lgwZone struct {
	svc             *lgwService
	name            string
	total, eligible int
	minFraction     float64
	targets         []uuid.UUID // eligible at setup, shuffled
	failed          int
	last            *lgwInjection
	lastAt          time.Time
}

// usable: the zone has a target left, no failure of its own still being
// applied, and stays a whole instance above its guard's minimum after one
// more failure, so the guard does not trip and the failure is a real
// withdrawal.
//
// Only watched services are failed: a withdrawal nobody subscribes to
// measures nothing (with --clients 1, only 3 of 450 services are).
func (z *lgwZone) usable(now time.Time) bool {
	if len(z.targets) == 0 || z.svc.watchers == 0 {
		return false
	}
	if z.last != nil && z.last.applied.Load() < int64(z.svc.watchers) && now.Sub(z.lastAt) < 10*time.Second {
		return false
	}
	return float64(z.eligible-z.failed-1) >= z.minFraction*float64(z.total)+1
}

func (w *lgWatch) injectFailure(ctx context.Context, rng *rand.Rand) (bool, error) {
	now := time.Now()
	var usable []*lgwZone
	for _, z := range w.zones {
		if z.usable(now) {
			usable = append(usable, z)
		}
	}
	if len(usable) == 0 {
		return false, nil
	}
	z := usable[rng.IntN(len(usable))]
	id := z.targets[len(z.targets)-1]
	z.targets = z.targets[:len(z.targets)-1]
	z.failed++
	in := &lgwInjection{id: id, idx: z.svc.intern(id), svc: z.svc, zone: z}
	w.injMu.Lock()
	w.failed[id] = true
	w.injMu.Unlock()
	body, _ := json.Marshal(map[string]any{"reports": []evaluator.Report{{InstanceID: id, Class: "probe", Outcome: "hard_failure"}}})
	in.at = time.Now()
	w.addInjection(in)
	z.last, z.lastAt = in, in.at
	var base string
	in.replica, base = w.reportTarget()
	res, err := postReports(ctx, w.api, base, w.proberToken, body)
	if err != nil {
		return false, err
	}
	in.acked = time.Now()
	if res.Accepted != 1 {
		in.void.Store(true)
		z.last = nil
		return false, fmt.Errorf("%w: hard failure of %s: %+v", errLgwRefused, id, res.Refused)
	}
	return true, nil
}

var errLgwRefused = errors.New("report refused")

// reportTarget is the replica the next hard-failure report goes to (in
// turn, with --replicas) and its base URL.
func (w *lgWatch) reportTarget() (int, string) {
	if len(w.replicas) == 0 {
		return 0, w.base
	}
	i := int((w.reportTurn.Add(1) - 1) % uint64(len(w.replicas)))
	w.reportsTo[i].Add(1)
	return i, w.replicas[i]
}

const (
	lgwBurstWindow = time.Minute
	lgwBurstTick   = 100 * time.Millisecond
	lgwBurstBatch  = 500
)

type lgwBurstResult struct {
	headroom, sent, refused, posts int
	took                           time.Duration
}

// burstTargets picks up to n instances to fail in the burst, so that no
// zone of any service loses more than a third of its instances: two
// thirds stay routable, above the guard's minimum, and every failure is
// a real withdrawal. It returns them shuffled across zones, and the
// headroom (how many could be picked at most).
func (w *lgWatch) burstTargets(rng *rand.Rand, n int) (targets []lgwBurstTarget, headroom int) {
	for _, z := range w.zones {
		k := min(z.total/3, len(z.targets))
		for k > 0 && float64(z.eligible-z.failed-k) <= z.minFraction*float64(z.total) {
			k--
		}
		for _, id := range z.targets[len(z.targets)-k:] {
			targets = append(targets, lgwBurstTarget{z: z, id: id})
		}
	}
	rng.Shuffle(len(targets), func(i, j int) { targets[i], targets[j] = targets[j], targets[i] })
	return targets[:min(n, len(targets))], len(targets)
}

type lgwBurstTarget struct {
	z  *lgwZone
	id uuid.UUID
}

// injectBurst hard-fails --burst instances at an even rate over one
// minute, posting every 100 ms the failures due by then, in batches of up
// to 500. It does not wait for a zone's previous failure to be applied.
func (w *lgWatch) injectBurst(ctx context.Context, rng *rand.Rand, start time.Time, setErr func(error)) (r lgwBurstResult) {
	targets, headroom := w.burstTargets(rng, w.burst)
	r.headroom = headroom
	defer func() { r.took = time.Since(start) }()
	for tick := 0; r.sent+r.refused < len(targets); tick++ {
		if !sleepUntil(ctx, start.Add(time.Duration(tick)*lgwBurstTick)) {
			return r
		}
		// Failure i is due at i/burst of the window.
		due := min(len(targets), int(float64(time.Since(start))/float64(lgwBurstWindow)*float64(w.burst))+1)
		for done := r.sent + r.refused; done < due; done = r.sent + r.refused {
			batch := targets[done:min(due, done+lgwBurstBatch)]
			ins := make([]*lgwInjection, len(batch))
			reports := make([]evaluator.Report, len(batch))
			w.injMu.Lock()
			for i, t := range batch {
				w.failed[t.id] = true
				reports[i] = evaluator.Report{InstanceID: t.id, Class: "probe", Outcome: "hard_failure"}
			}
			w.injMu.Unlock()
			body, _ := json.Marshal(map[string]any{"reports": reports})
			at := time.Now()
			for i, t := range batch {
				t.z.failed++
				ins[i] = &lgwInjection{id: t.id, idx: t.z.svc.intern(t.id), svc: t.z.svc, zone: t.z, at: at}
				w.addInjection(ins[i])
			}
			r.posts++
			replica, base := w.reportTarget()
			res, err := postReports(ctx, w.api, base, w.proberToken, body)
			if err != nil {
				for _, in := range ins {
					in.void.Store(true)
				}
				setErr(err)
				return r
			}
			acked := time.Now()
			for _, in := range ins {
				in.acked, in.replica = acked, replica
			}
			refusedBefore := r.refused
			for _, ref := range res.Refused {
				if ref.Index >= 0 && ref.Index < len(ins) && !ins[ref.Index].void.Swap(true) {
					r.refused++
				}
			}
			r.sent += len(batch) - (r.refused - refusedBefore)
			if len(res.Refused) > 0 {
				fmt.Fprintf(w.stderr, "warning: %d of %d burst hard failures refused, first: %+v\n", len(res.Refused), len(batch), res.Refused[0])
			}
		}
	}
	return r
}

func (w *lgWatch) injectAddition(ctx context.Context, rng *rand.Rand, n int) error {
	svc := w.services[rng.IntN(len(w.services))]
	reg := registry.Registration{Address: fmt.Sprintf("10.200.%d.%d", n>>8&255, n&255), Port: 8080, Zone: "az1"}
	body, _ := json.Marshal(reg)
	at := time.Now()
	inst, err := w.register(ctx, svc.name, reg, body)
	if err != nil {
		return err
	}
	in := &lgwInjection{id: inst.ID, idx: svc.intern(inst.ID), svc: svc, addition: true, at: at}
	w.addInjection(in)
	w.injMu.Lock()
	w.added = append(w.added, inst.ID)
	w.injMu.Unlock()
	// The loadgen prober is assigned by service, so it covers the new
	// instance as soon as the evaluator has it: at once, since the
	// registration hands it over and a replica that has not seen it
	// looks it up. Only a replica that could not look it up just now
	// (unverified_instance) is asked again.
	reports, _ := json.Marshal(map[string]any{"reports": []evaluator.Report{{InstanceID: inst.ID, Class: "probe", Outcome: "success"}}})
	for deadline := time.Now().Add(30 * time.Second); ; {
		res, err := postReports(ctx, w.api, w.base, w.proberToken, reports)
		if err != nil {
			return err
		}
		if res.Accepted == 1 {
			return nil
		}
		if len(res.Refused) == 0 || res.Refused[0].Code != "unverified_instance" || time.Now().After(deadline) {
			return fmt.Errorf("success report for new instance %s refused: %+v", inst.ID, res.Refused)
		}
		if !sleepUntil(ctx, time.Now().Add(50*time.Millisecond)) {
			return ctx.Err()
		}
	}
}

func (w *lgWatch) addInjection(in *lgwInjection) {
	w.injMu.Lock()
	in.n = len(w.injections)
	w.injections = append(w.injections, in)
	w.injMu.Unlock()
	in.svc.mu.Lock()
	in.svc.injections = append(in.svc.injections, in)
	in.svc.mu.Unlock()
}

// pending counts applications still missing.
func (w *lgWatch) pending() int64 {
	w.injMu.Lock()
	defer w.injMu.Unlock()
	var n int64
	for _, in := range w.injections {
		if !in.void.Load() {
			n += max(0, int64(in.svc.watchers)-in.applied.Load())
		}
	}
	return n
}

// keepAlive is the loadgen prober: a success for every instance not
// failed on purpose every 5 s (the default probe interval), and a lease
// renewal for every registered instance every 10 s.
func (w *lgWatch) keepAlive(ctx context.Context) {
	t := time.NewTicker(5 * time.Second)
	defer t.Stop()
	for n := 0; ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := w.sendSuccesses(ctx, w.rampedInstances()); err != nil && ctx.Err() == nil {
			fmt.Fprintln(w.stderr, "keep-alive reports:", err)
		}
		if n%2 == 1 {
			w.injMu.Lock()
			added := slices.Clone(w.added)
			w.injMu.Unlock()
			for _, id := range added {
				if err := w.call(ctx, http.MethodPut, "/v1/instances/"+id.String()+"/lease", nil, http.StatusOK, nil); err != nil && ctx.Err() == nil {
					fmt.Fprintln(w.stderr, "lease renewal:", err)
				}
			}
		}
	}
}

func (w *lgWatch) liveInstances() []uuid.UUID {
	w.injMu.Lock()
	defer w.injMu.Unlock()
	var ids []uuid.UUID
	for _, s := range slices.Concat(w.services, w.others) {
		for _, in := range s.instances {
			if !w.failed[in.ID] {
				ids = append(ids, in.ID)
			}
		}
	}
	return append(ids, w.added...)
}

// rampSuccesses sends one probe success for each of ids at no more than
// --setup-rate a second, so that making a seeded estate eligible stays
// under muster's change budget and the run does not measure a shed
// episode it caused itself.
//
// keepAlive repeats the successes of those ramped so far (ramped).
func (w *lgWatch) rampSuccesses(ctx context.Context, ids []uuid.UUID) error {
	const batch = 250
	every := time.Duration(float64(time.Second) * batch / float64(w.setupRate))
	t := time.NewTicker(every)
	defer t.Stop()
	for len(ids) > 0 {
		n := min(len(ids), batch)
		if err := w.sendSuccesses(ctx, ids[:n]); err != nil {
			return err
		}
		w.injMu.Lock()
		w.ramped = append(w.ramped, ids[:n]...)
		w.injMu.Unlock()
		ids = ids[n:]
		if len(ids) == 0 {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}

// waitUnshed waits (up to 2 minutes) until muster's addition window is
// back at its base, so that what the run measures starts outside any
// shed episode, and says how many episodes the setup saw.
func (w *lgWatch) waitUnshed(ctx context.Context) error {
	began := time.Now()
	for {
		s, err := w.scrape(ctx)
		if err != nil {
			return err
		}
		if s.shedding == 0 {
			fmt.Fprintf(w.stdout, "muster is not shedding additions (muster_shed_episodes_total %.0f before measuring; waited %s)\n",
				s.shedEpisodes, time.Since(began).Round(time.Millisecond))
			return nil
		}
		if time.Since(began) > 2*time.Minute {
			fmt.Fprintf(w.stderr, "warning: muster still sheds additions 2 min after setup; going on\n")
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// rampedInstances are the live instances made eligible so far: every
// one once setup's ramp is done.
func (w *lgWatch) rampedInstances() []uuid.UUID {
	w.injMu.Lock()
	n := len(w.ramped)
	w.injMu.Unlock()
	live := w.liveInstances()
	if n >= len(live) {
		return live
	}
	w.injMu.Lock()
	defer w.injMu.Unlock()
	out := make([]uuid.UUID, 0, n)
	for _, id := range w.ramped {
		if !w.failed[id] {
			out = append(out, id)
		}
	}
	return out
}

func (w *lgWatch) sendSuccesses(ctx context.Context, ids []uuid.UUID) error {
	reports := make([]evaluator.Report, 0, 1000)
	for len(ids) > 0 {
		n := min(len(ids), 1000)
		reports = reports[:0]
		for _, id := range ids[:n] {
			reports = append(reports, evaluator.Report{InstanceID: id, Class: "probe", Outcome: "success"})
		}
		ids = ids[n:]
		body, _ := json.Marshal(map[string]any{"reports": reports})
		res, err := postReports(ctx, w.api, w.base, w.proberToken, body)
		if err != nil {
			return err
		}
		if len(res.Refused) > 0 {
			// Instances whose successes are refused never become
			// eligible, and no failure can be injected into them.
			w.successRefusedOnce.Do(func() {
				fmt.Fprintf(w.stderr, "warning: %d of %d success reports refused, first: %+v\n", len(res.Refused), n, res.Refused[0])
			})
		}
	}
	return nil
}

// listServices lists the loadgen services and their active instances.
func (w *lgWatch) listServices(ctx context.Context) error {
	get := func(path string, out any) error { return w.call(ctx, http.MethodGet, path, nil, http.StatusOK, out) }
	w.servicesByName = map[string]*lgwService{}
	err := eachItem(get, "/v1/services?owner="+loadgenOwner+"&limit=1000", func(s registry.Service) {
		svc := &lgwService{name: s.Name, index: map[uuid.UUID]int32{}}
		w.services = append(w.services, svc)
		w.servicesByName[s.Name] = svc
	})
	if err != nil {
		return err
	}
	for _, s := range w.services {
		err := eachItem(get, "/v1/services/"+s.name+"/instances?limit=1000", func(in registry.Instance) {
			s.instances = append(s.instances, in)
			s.intern(in.ID)
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// register registers reg (marshalled as body) in service. A 503 (muster's
// database did not answer within the request's budget, as happens on a
// loaded machine) most likely registered nothing, but it may have: so
// before asking again, after the answer's Retry-After, it reads the
// service's instances back and takes the one at reg's address if the
// earlier request did register it, as a workload that must not register
// twice would. It gives up after registerPatience.
func (w *lgWatch) register(ctx context.Context, service string, reg registry.Registration, body []byte) (registry.Instance, error) {
	path := "/v1/services/" + service + "/instances"
	deadline := time.Now().Add(registerPatience)
	for {
		var inst registry.Instance
		err := w.call(ctx, http.MethodPost, path, body, http.StatusCreated, &inst)
		var st *statusError
		if err == nil || !errors.As(err, &st) || st.code != http.StatusServiceUnavailable || time.Now().After(deadline) {
			return inst, err
		}
		fmt.Fprintf(w.stderr, "warning: registering an addition in %s: %v; reading back, then retrying\n", service, err)
		if !sleepUntil(ctx, time.Now().Add(min(max(st.retryAfter, 100*time.Millisecond), 5*time.Second))) {
			return inst, ctx.Err()
		}
		// A read-back that fails too is retried, not answered with a
		// second registration: only a read that finds nothing at the
		// address lets the registration be sent again.
		found, err := w.findInstance(ctx, path, reg)
		for err != nil {
			if time.Now().After(deadline) {
				return inst, err
			}
			if !sleepUntil(ctx, time.Now().Add(time.Second)) {
				return inst, ctx.Err()
			}
			found, err = w.findInstance(ctx, path, reg)
		}
		if found != nil {
			return *found, nil
		}
	}
}

// registerPatience bounds how long register retries a registration
// muster answered with 503.
const registerPatience = 30 * time.Second

// findInstance pages through the active instances at path for one at
// reg's address and port; nil if there is none.
func (w *lgWatch) findInstance(ctx context.Context, path string, reg registry.Registration) (*registry.Instance, error) {
	cursor := ""
	for {
		var page struct {
			Items      []registry.Instance `json:"items"`
			NextCursor string              `json:"next_cursor"`
		}
		q := path + "?limit=500"
		if cursor != "" {
			q += "&cursor=" + url.QueryEscape(cursor)
		}
		if err := w.call(ctx, http.MethodGet, q, nil, http.StatusOK, &page); err != nil {
			return nil, err
		}
		for i := range page.Items {
			if in := &page.Items[i]; in.Address == reg.Address && in.Port == reg.Port {
				return in, nil
			}
		}
		if page.NextCursor == "" {
			return nil, nil
		}
		cursor = page.NextCursor
	}
}

// statusError is an answer with a status other than the one expected.
type statusError struct {
	method, path string
	code         int
	retryAfter   time.Duration
	body         []byte
}

func (e *statusError) Error() string {
	return fmt.Sprintf("%s %s: %d %s", e.method, e.path, e.code, e.body)
}

// call makes one API request with the admin token and decodes the answer
// into out (if not nil), expecting status want; another status is a
// *statusError.
func (w *lgWatch) call(ctx context.Context, method, path string, body []byte, want int, out any) error {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, w.base+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+w.adminToken)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := w.api.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	if res.StatusCode != want {
		b, _ := io.ReadAll(res.Body)
		retry, _ := strconv.Atoi(res.Header.Get("Retry-After"))
		return &statusError{method: method, path: path, code: res.StatusCode, retryAfter: time.Duration(retry) * time.Second, body: bytes.TrimSpace(b)}
	}
	if out == nil {
		_, err := io.Copy(io.Discard, res.Body)
		return err
	}
	return json.NewDecoder(res.Body).Decode(out)
}

// resolve fetches a service's current view; a 503 (no view yet) is
// returned as its status, not an error.
func (w *lgWatch) resolve(ctx context.Context, name string) (assembler.View, int, error) {
	var v assembler.View
	err := w.call(ctx, http.MethodGet, "/v1/resolve/"+name, nil, http.StatusOK, &v)
	if st := (*statusError)(nil); errors.As(err, &st) && st.code == http.StatusServiceUnavailable {
		return v, http.StatusServiceUnavailable, nil
	}
	if err != nil {
		return v, 0, err
	}
	return v, http.StatusOK, nil
}

func eligibleFraction(v assembler.View) float64 {
	n := 0
	for _, e := range v.Endpoints {
		if e.State == "eligible" {
			n++
		}
	}
	return float64(n) / float64(max(len(v.Endpoints), 1))
}

type lgwScrape struct {
	rss         float64
	heap        float64 // Go heap in use: unlike RSS, not inflated by memory a previous run freed
	cpu         float64 // seconds
	subscribers float64

	shedEpisodes, shedding float64            // muster_shed_episodes_total, muster_additions_shedding
	lagBuckets             map[string]float64 // muster_withdrawal_lag_seconds buckets by le, summed over services

	// Admission: muster_watch_expected_population, _population_known,
	// _admission_budget, _admitted_total, _admitted_window_max,
	// _admission_refused_total.
	expected, populationKnown, budget, admitted, admittedWindowMax, refused float64
}

// scrape reads the server's resident memory and open watch streams from
// GET /metrics, as the admin tool.
func (w *lgWatch) scrape(ctx context.Context) (lgwScrape, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, w.base+"/metrics", nil)
	if err != nil {
		return lgwScrape{}, err
	}
	// /metrics is for operator and tool identities; the admin is a tool.
	req.Header.Set("Authorization", "Bearer "+w.adminToken)
	res, err := w.api.Do(req)
	if err != nil {
		return lgwScrape{}, err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return lgwScrape{}, fmt.Errorf("GET /metrics: %d", res.StatusCode)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(res.Body)
	if err != nil {
		return lgwScrape{}, fmt.Errorf("GET /metrics: %w", err)
	}
	// value is a family's one sample (a gauge, counter or untyped), and
	// false when the family is absent.
	value := func(name string) (float64, bool) {
		f, ok := families[name]
		if !ok || len(f.GetMetric()) == 0 {
			return 0, false
		}
		m := f.GetMetric()[0]
		switch {
		case m.GetGauge() != nil:
			return m.GetGauge().GetValue(), true
		case m.GetCounter() != nil:
			return m.GetCounter().GetValue(), true
		case m.GetUntyped() != nil:
			return m.GetUntyped().GetValue(), true
		}
		return 0, false
	}
	s := lgwScrape{lagBuckets: map[string]float64{}}
	rss, found := value("process_resident_memory_bytes")
	if !found {
		return s, errors.New("GET /metrics has no process_resident_memory_bytes")
	}
	s.rss = rss
	for name, dst := range map[string]*float64{
		"go_memstats_heap_inuse_bytes":         &s.heap,
		"process_cpu_seconds_total":            &s.cpu,
		"muster_watch_subscribers":             &s.subscribers,
		"muster_shed_episodes_total":           &s.shedEpisodes,
		"muster_additions_shedding":            &s.shedding,
		"muster_watch_expected_population":     &s.expected,
		"muster_watch_population_known":        &s.populationKnown,
		"muster_watch_admission_budget":        &s.budget,
		"muster_watch_admitted_total":          &s.admitted,
		"muster_watch_admitted_window_max":     &s.admittedWindowMax,
		"muster_watch_admission_refused_total": &s.refused,
	} {
		*dst, _ = value(name)
	}
	// The withdrawal lag's buckets, summed over services, by their bound
	// as the text exposition writes it (le="0.5").
	if f, ok := families["muster_withdrawal_lag_seconds"]; ok {
		for _, m := range f.GetMetric() {
			inf := false
			for _, b := range m.GetHistogram().GetBucket() {
				le := strconv.FormatFloat(b.GetUpperBound(), 'g', -1, 64) // +Inf for the last
				inf = inf || le == "+Inf"
				s.lagBuckets[le] += float64(b.GetCumulativeCount())
			}
			if !inf {
				s.lagBuckets["+Inf"] += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return s, nil
}

// waitHeld waits until every client holds its stream, printing progress.
func (w *lgWatch) waitHeld(ctx context.Context, start time.Time) error {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	lastProgress := start
	for w.held.Load() < int64(w.clients) {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		if time.Since(start) > w.connectTimeout {
			fmt.Fprintf(w.stderr, "warning: only %d of %d streams held after %s; going on\n", w.held.Load(), w.clients, w.connectTimeout)
			return nil
		}
		if time.Since(lastProgress) >= 5*time.Second {
			lastProgress = time.Now()
			fmt.Fprintf(w.stderr, "  %d of %d held after %s (%d admission refusals)\n",
				w.held.Load(), w.clients, time.Since(start).Round(time.Second), w.refusals.Load())
		}
		if w.held.Load() == 0 && w.streamErrors.Load() >= int64(w.clients) {
			return fmt.Errorf("no stream could be opened: %w", *w.firstStreamErr.Load())
		}
	}
	return nil
}

func (w *lgWatch) frames() [3]int64 {
	return [3]int64{w.frameViews.Load(), w.frameDeltas.Load(), w.frameBeats.Load()}
}

func (w *lgWatch) streamFailed(err error) {
	w.streamErrors.Add(1)
	w.firstStreamErr.CompareAndSwap(nil, &err)
}

func (w *lgWatch) record(in *lgwInjection, lag time.Duration) {
	all := in.applied.Add(1) == int64(in.svc.watchers)
	w.lagMu.Lock()
	if in.addition {
		w.additionLags = append(w.additionLags, lag)
	} else {
		w.withdrawLags = append(w.withdrawLags, lag)
		if all {
			// The last of the service's subscribers has it: the
			// withdrawal's time to all.
			w.withdrawAllLags = append(w.withdrawAllLags, lag)
		}
	}
	w.lagMu.Unlock()
}

// lgwClient is one subscriber: one watch stream and its copy of each
// watched service's view.
type lgwClient struct {
	w       *lgWatch
	n       int
	copies  []*lgwCopy
	since   uint64   // highest version applied, for resuming
	applied []uint64 // bitset of injection numbers already recorded
	held    bool
	replica int // --replicas: the replica of its current (or next) stream

	attempt     int       // subscriptions since the last admitted one, for backoff
	streamGot   []bool    // copies that got a view or delta on the current stream
	readmits    int       // --restart: admissions by the restarted muster
	readmitSent time.Time // --restart: when the first of them was requested
	readmitAt   time.Time // --restart: and when its answer arrived
	resynced    bool      // --restart: got synced from the restarted muster
	resyncAt    time.Time // --restart: when
}

// lgwCopy is a subscriber's copy of one service's view: which endpoints
// it holds and which of them say "ineligible".
type lgwCopy struct {
	svc           *lgwService
	version       uint64
	present, inel []uint64
}

func bit(set []uint64, i int32) bool {
	return int(i>>6) < len(set) && set[i>>6]&(1<<(i&63)) != 0
}

func setBit(set *[]uint64, i int32, on bool) {
	for int(i>>6) >= len(*set) {
		if !on {
			return
		}
		*set = append(*set, 0)
	}
	if on {
		(*set)[i>>6] |= 1 << (i & 63)
	} else {
		(*set)[i>>6] &^= 1 << (i & 63)
	}
}

func (c *lgwClient) run(ctx context.Context) {
	w := c.w
	rng := rand.New(rand.NewPCG(uint64(c.n), 3))
	q := url.Values{}
	for _, cp := range c.copies {
		q.Add("service", cp.svc.name)
	}
	for first := true; ctx.Err() == nil; first = false {
		base := w.base
		if len(w.replicas) > 0 {
			// The first stream goes where newClients placed it (round
			// robin), every later one to a random replica, as a client
			// behind a load balancer would be sent.
			if !first {
				c.replica = rng.IntN(len(w.replicas))
			}
			base = w.replicas[c.replica]
		}
		if c.since != 0 {
			q.Set("since", strconv.FormatUint(c.since, 10))
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/watch?"+q.Encode(), nil)
		if err != nil {
			w.streamFailed(err)
			return
		}
		req.Header.Set("Authorization", "Bearer "+w.watchTokens[c.n/lgwClientsPerIdentity])
		req.Header.Set("Accept", "text/event-stream")
		select {
		case w.connectSem <- struct{}{}:
		case <-ctx.Done():
			return
		}
		gen := w.gen.Load()
		sent := time.Now()
		res, err := w.streams.Do(req)
		<-w.connectSem
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			w.streamFailed(err)
			c.backoff(ctx, rng, 0)
			continue
		}
		switch res.StatusCode {
		case http.StatusOK:
		case http.StatusServiceUnavailable:
			w.refusals.Add(1)
			if gen == 2 {
				w.refusedGen2.Add(1)
			}
			retry, _ := strconv.Atoi(res.Header.Get("Retry-After"))
			_, _ = io.Copy(io.Discard, res.Body)
			res.Body.Close()
			c.backoff(ctx, rng, time.Duration(max(retry, 1))*time.Second)
			continue
		default:
			b, _ := io.ReadAll(res.Body)
			res.Body.Close()
			w.streamFailed(fmt.Errorf("GET /v1/watch: %d %s", res.StatusCode, bytes.TrimSpace(b)))
			c.backoff(ctx, rng, 0)
			continue
		}
		c.attempt = 0
		if len(w.replicas) > 0 {
			w.streamsTo[c.replica].Add(1)
		}
		if gen == 2 {
			// Only the restarted muster answers once gen is 2: the first
			// had exited before it was set.
			if c.readmits++; c.readmits == 1 {
				c.readmitSent, c.readmitAt = sent, time.Now()
				w.readmitted.Add(1)
			} else {
				w.doubleAdmits.Add(1)
			}
		}
		w.open.Add(1)
		c.read(res.Body)
		res.Body.Close()
		w.open.Add(-1)
		if ctx.Err() != nil {
			return
		}
		w.reconnects.Add(1)
		// A drained (or lost) stream resubscribes after a short jitter;
		// the attempt count was reset by the admission.
		c.backoff(ctx, rng, 0)
	}
}

// backoff sleeps the full-jitter backoff of the client's next attempt, or
// retryAfter when that is longer.
func (c *lgwClient) backoff(ctx context.Context, rng *rand.Rand, retryAfter time.Duration) {
	w := c.w
	ceil := w.maxBackoff
	if d := w.baseBackoff << min(c.attempt, 30); d > 0 && d < ceil {
		ceil = d
	}
	c.attempt++
	sleepUntil(ctx, time.Now().Add(max(retryAfter, time.Duration(rng.Float64()*float64(ceil)))))
}

// read parses one SSE stream until it ends; it reports whether the server
// asked the client to drain.
func (c *lgwClient) read(body io.Reader) (drained bool) {
	w := c.w
	br := bufio.NewReaderSize(body, 4096)
	var (
		event      string
		version    uint64
		data       []byte
		entry      *lgwParsed
		cont       bool // the next read continues a line longer than the buffer
		collecting bool // keeping this frame's data: nobody has decoded it yet
	)
	c.streamGot = make([]bool, len(c.copies))
	for {
		line, err := br.ReadSlice('\n')
		full := errors.Is(err, bufio.ErrBufferFull)
		if err != nil && !full {
			return false
		}
		if cont {
			// Only data lines are that long.
			if collecting {
				data = append(data, line...)
				if !full {
					data = bytes.TrimRight(data, "\r\n")
				}
			}
			cont = full
			continue
		}
		cont = full
		if !full {
			line = bytes.TrimRight(line, "\r\n")
		}
		switch {
		case len(line) == 0:
			switch event {
			case "heartbeat":
				w.frameBeats.Add(1)
			case "synced":
				c.synced()
			case "drain":
				return true
			case "view", "delta":
				if event == "view" {
					w.frameViews.Add(1)
				} else {
					w.frameDeltas.Add(1)
				}
				if entry != nil {
					if p := entry.parse(w, event == "view", data); p != nil {
						c.apply(p, time.Now())
					}
				}
			}
			event, version, data, entry, collecting = "", 0, data[:0], nil, false
		case bytes.HasPrefix(line, []byte("event: ")):
			event = string(line[len("event: "):])
		case bytes.HasPrefix(line, []byte("id: ")):
			version, _ = strconv.ParseUint(string(line[len("id: "):]), 10, 64)
		case bytes.HasPrefix(line, []byte("data: ")) && (event == "view" || event == "delta"):
			// The first subscriber to see a version keeps its bytes to
			// decode them; the rest skip them.
			entry = w.parsed(event, version, c.replica)
			collecting = !entry.done.Load()
			if collecting {
				data = append(data[:0], line[len("data: "):]...)
			}
		}
	}
}

// synced notes a synced event. From the restarted muster (whose versions
// are all above the first one's, so no client is current by its since),
// it must follow a view of every watched service on the same stream.
func (c *lgwClient) synced() {
	if c.w.gen.Load() != 2 {
		return
	}
	if slices.Contains(c.streamGot, false) {
		c.w.syncedEarly.Add(1)
	}
	if !c.resynced {
		c.resynced, c.resyncAt = true, time.Now()
		c.w.resynced.Add(1)
	}
}

// lgwParsed is a frame decoded once and shared by every subscriber that
// receives it: versions are region-wide, so (kind, version) names one
// frame, and the server sends every subscriber the same bytes. Another
// replica may send another delta to the same version (from another
// base), so with --replicas the replica is part of the key. Decoding
// once keeps this process's CPU, which shares the machine with the server,
// out of the figures.
type lgwParsed struct {
	once     sync.Once
	done     atomic.Bool
	ok       bool
	view     bool
	svc      *lgwService
	from     uint64
	version  uint64
	eps      []lgwEndpoint
	removals []int32
}

type lgwEndpoint struct {
	idx  int32
	inel bool
}

type lgwFrameKey struct {
	view    bool
	version uint64
	replica int
}

func (w *lgWatch) parsed(event string, version uint64, replica int) *lgwParsed {
	key := lgwFrameKey{view: event == "view", version: version, replica: replica}
	if v, ok := w.cache.Load(key); ok {
		return v.(*lgwParsed)
	}
	v, _ := w.cache.LoadOrStore(key, &lgwParsed{})
	return v.(*lgwParsed)
}

func (p *lgwParsed) parse(w *lgWatch, view bool, data []byte) *lgwParsed {
	p.once.Do(func() {
		defer p.done.Store(true)
		p.view = view
		var (
			name     string
			eps      []assembler.Endpoint
			removals []uuid.UUID
		)
		if view {
			var v assembler.View
			if err := json.Unmarshal(data, &v); err != nil {
				w.parseErrors.Add(1)
				return
			}
			name, p.version, eps = v.Service, v.Version, v.Endpoints
		} else {
			var d assembler.Delta
			if err := json.Unmarshal(data, &d); err != nil {
				w.parseErrors.Add(1)
				return
			}
			name, p.from, p.version, eps, removals = d.Service, d.FromVersion, d.Version, d.Upserts, d.Removals
		}
		p.svc = w.servicesByName[name]
		if p.svc == nil {
			w.parseErrors.Add(1)
			return
		}
		p.eps = make([]lgwEndpoint, len(eps))
		for i, e := range eps {
			p.eps[i] = lgwEndpoint{idx: p.svc.intern(e.InstanceID), inel: e.State == "ineligible"}
		}
		p.removals = make([]int32, len(removals))
		for i, id := range removals {
			p.removals[i] = p.svc.intern(id)
		}
		p.ok = true
	})
	if !p.ok {
		return nil
	}
	return p
}

// apply applies a view or delta to the client's copy and records the lag
// of every injected change the copy now shows for the first time.
func (c *lgwClient) apply(p *lgwParsed, now time.Time) {
	var cp *lgwCopy
	for i, x := range c.copies {
		if x.svc == p.svc {
			cp = x
			if i < len(c.streamGot) {
				c.streamGot[i] = true
			}
			break
		}
	}
	if cp == nil {
		c.w.parseErrors.Add(1)
		return
	}
	if p.view { // replace the copy
		clear(cp.present)
		clear(cp.inel)
	} else {
		if cp.version != p.from {
			c.w.gaps.Add(1)
		}
		for _, i := range p.removals {
			setBit(&cp.present, i, false)
			setBit(&cp.inel, i, false)
		}
	}
	for _, e := range p.eps {
		setBit(&cp.present, e.idx, true)
		setBit(&cp.inel, e.idx, e.inel)
	}
	cp.version = p.version
	c.since = max(c.since, p.version)
	if !c.held && !slices.ContainsFunc(c.copies, func(x *lgwCopy) bool { return x.version == 0 }) {
		c.held = true
		c.w.held.Add(1)
	}

	p.svc.mu.RLock()
	injections := p.svc.injections
	p.svc.mu.RUnlock()
	for _, in := range injections {
		if bit(c.applied, int32(in.n)) || in.void.Load() {
			continue
		}
		var shows bool
		if in.addition {
			shows = bit(cp.present, in.idx)
		} else {
			// Withdrawn: gone from the copy, or (in a zone whose guard
			// tripped and keeps it published) showing "ineligible".
			shows = !bit(cp.present, in.idx) || bit(cp.inel, in.idx)
		}
		if shows {
			setBit(&c.applied, int32(in.n), true)
			c.w.record(in, now.Sub(in.at))
			if len(c.w.replicas) > 0 && !in.addition {
				c.w.lagMu.Lock()
				c.w.seen = append(c.w.seen, lgwSeen{in: in, replica: c.replica, at: now})
				c.w.lagMu.Unlock()
			}
		}
	}
}

// raiseNoFile raises the soft limit on open files to at least need (up to
// the hard limit): every stream is a socket.
func raiseNoFile(need int, stderr io.Writer) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return
	}
	if lim.Cur >= uint64(need) {
		return
	}
	lim.Cur = min(max(uint64(need), lim.Cur), lim.Max)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		fmt.Fprintln(stderr, "warning: cannot raise the open-files limit:", err)
	}
	if lim.Cur < uint64(need) {
		fmt.Fprintf(stderr, "warning: open files are limited to %d (hard limit) but %d streams need about %d\n", lim.Max, need-256, need)
	}
}

// processCPU is the user and system CPU time this process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func sleepUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-timer.C:
		return true
	}
}

func pctOf(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(float64(len(sorted))*p))].Round(time.Microsecond)
}

// lgwSeen is a subscriber's first sight of a withdrawal (--replicas).
type lgwSeen struct {
	in      *lgwInjection
	replica int // of the subscriber's stream
	at      time.Time
}

// reportReplicas prints, with --replicas, the withdrawal lag from each
// hard-failure report's acknowledgement to each subscriber seeing the
// withdrawal, overall and by the replica the subscriber's stream was on,
// and how subscribers, streams and reports were spread. Call it once
// the subscribers and injectors have stopped.
//
// A subscriber may see a withdrawal before the report's answer reaches
// this process (the views are published before the POST returns); that
// lag counts as 0, and how often it happened is printed.
func (w *lgWatch) reportReplicas(clients []*lgwClient) {
	w.lagMu.Lock()
	seen := slices.Clone(w.seen)
	w.lagMu.Unlock()
	var all []time.Duration
	per := make([][]time.Duration, len(w.replicas))
	early := 0
	for _, s := range seen {
		if s.in.void.Load() || s.in.acked.IsZero() {
			continue // refused, or its answer never came
		}
		lag := s.at.Sub(s.in.acked)
		if lag < 0 {
			early++
			lag = 0
		}
		all = append(all, lag)
		per[s.replica] = append(per[s.replica], lag)
	}
	subscribers := make([]int, len(w.replicas))
	for _, c := range clients {
		subscribers[c.replica]++
	}
	slices.Sort(all)
	fmt.Fprintf(w.stdout, "replicas: withdrawal lag (report acknowledged -> seen by subscriber): p50 %s p99 %s p99.9 %s max %s over %d applications (%d seen before the acknowledgement, counted as 0); %d subscribers over %d replicas\n",
		pctOf(all, 0.50), pctOf(all, 0.99), pctOf(all, 0.999), pctOf(all, 1), len(all), early, len(clients), len(w.replicas))
	for i, r := range w.replicas {
		lags := per[i]
		slices.Sort(lags)
		fmt.Fprintf(w.stdout, "replica %d %s: %d subscribers at the end, %d streams admitted, %d hard-failure reports sent; withdrawal lag (report acknowledged -> seen by a subscriber on it): p50 %s p99 %s p99.9 %s max %s over %d applications\n",
			i+1, r, subscribers[i], w.streamsTo[i].Load(), w.reportsTo[i].Load(),
			pctOf(lags, 0.50), pctOf(lags, 0.99), pctOf(lags, 0.999), pctOf(lags, 1), len(lags))
	}
}
