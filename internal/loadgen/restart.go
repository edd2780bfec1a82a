package loadgen

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/ownership"
	"github.com/musterhq/muster/internal/stream"
)

// lgwReplica names the child muster in the stream census, in both of its
// processes, as a restarted replica keeps its name.
const lgwReplica = "loadgen-restart"

// runRestart is `muster loadgen watch --restart` (ADR-13): it
// runs `muster dev` on --data as a child process, connects the
// subscribers, waits for the census to have persisted their number,
// restarts muster (SIGTERM, then a new process with no memory of them and
// the default admission settings), and measures readmission: every client
// resubscribes with full-jitter backoff honouring Retry-After. It prints
// the time until all are back, what each admission window let in, the
// refusals, and assert-style lines: each client admitted exactly once by
// the new process, never more than 5% of the population within one
// window, and synced never before a view. It fails if an assertion does.
//
// The database (the cluster in --data, or DATABASE_URL) stays up across
// the restart: this process starts or adopts it and both children adopt
// it, so the figure is muster's, not PostgreSQL's start-up.
func (w *lgWatch) runRestart(ctx context.Context) (err error) {
	win := w.admissionWindow
	w.baseBackoff, w.maxBackoff = win/40, 3*win
	pool, _, closeDB, err := w.env.OpenDB(ctx, w.dir, w.stderr)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, closeDB()) }()
	if err := db.Migrate(pool.Config().ConnString()); err != nil {
		return err
	}
	// A previous run's peak would size this one's admission.
	if err := stream.ForgetReplica(ctx, pool, lgwReplica); err != nil {
		return err
	}
	if p, err := stream.ReadPopulation(ctx, pool, stream.PopulationQuery{
		Self: lgwReplica, At: time.Now(), Horizon: 15 * time.Minute, Live: 3 * win, ReplicaTTL: ownership.DefaultTTL,
	}); err != nil {
		return err
	} else if p.Expected > 0 {
		fmt.Fprintf(w.stderr, "warning: %d subscribers of %d other replicas were reported within 15 min on this database; they count towards the population the restarted muster admits by\n",
			p.Expected, p.Replicas)
	}
	addr, err := lgwListenAddr(w.addr)
	if err != nil {
		return err
	}
	w.base = "http://" + addr
	raiseNoFile(w.clients+256, w.stderr)

	// Process 1: a cold region has no population to admit 5% of, so it
	// admits everyone at once; the restart is what is measured.
	gen1, err := w.startMuster(ctx, 1, addr, "MUSTER_ADMISSION_FLOOR="+strconv.Itoa(w.clients))
	if err != nil {
		return err
	}
	defer gen1.stop()
	fmt.Fprintf(w.stdout, "muster process 1 serving on %s (admission floor %d for the cold start; log %s)\n", w.base, w.clients, gen1.logPath)
	if err := w.prepare(ctx); err != nil {
		return err
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	streamCtx, stopStreams := context.WithCancel(ctx)
	defer stopStreams()
	clients := w.newClients()
	w.restartClients = clients
	w.gen.Store(1)
	connectStart := time.Now()
	for _, c := range clients {
		wg.Go(func() { c.run(streamCtx) })
	}
	if err := w.waitHeld(ctx, connectStart); err != nil {
		return err
	}
	if held := w.held.Load(); held < int64(w.clients) {
		return fmt.Errorf("only %d of %d subscribers got their views from muster process 1; nothing to restart", held, w.clients)
	}
	fmt.Fprintf(w.stdout, "connected %d subscribers of %d services each (%d services) in %s\n",
		w.clients, len(clients[0].copies), len(w.services), time.Since(connectStart).Round(time.Millisecond))
	s1, err := w.waitPersisted(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(w.stdout, "process 1's census persisted the population: muster_watch_expected_population %.0f\n", s1.expected)

	// The restart.
	sigAt := time.Now()
	gen1.stop()
	w.gen.Store(2)
	downAt := time.Now()
	gen2, err := w.startMuster(ctx, 2, addr, "MUSTER_ADMISSION_FLOOR="+strconv.Itoa(w.admissionFloor))
	if err != nil {
		return err
	}
	defer gen2.stop()
	upAt := time.Now()
	s2, err := w.scrape(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(w.stdout, "restart: process 1 stopped (SIGTERM, streams drained) in %s; process 2 serving %s later (log %s)\n",
		downAt.Sub(sigAt).Round(time.Millisecond), upAt.Sub(downAt).Round(time.Millisecond), gen2.logPath)
	known := "read from PostgreSQL"
	if s2.populationKnown != 1 {
		known = "NOT known: sized by its own peak"
	}
	fmt.Fprintf(w.stdout, "process 2 admission: expected population %.0f (%s), budget %.0f per %s = %.1f%% of %d subscribers (floor %d)\n",
		s2.expected, known, s2.budget, win, 100*s2.budget/float64(w.clients), w.clients, w.admissionFloor)

	// Readmission.
	deadline := upAt.Add(w.readmitTimeout)
	tick := time.NewTicker(min(win, 10*time.Second))
	for w.readmitted.Load() < int64(w.clients) && time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			tick.Stop()
			return ctx.Err()
		case <-tick.C:
		}
		fmt.Fprintf(w.stderr, "  %d of %d readmitted after %s (%d refusals)\n",
			w.readmitted.Load(), w.clients, time.Since(upAt).Round(time.Second), w.refusedGen2.Load())
	}
	tick.Stop()
	// Then every readmitted client gets its views and synced (the
	// evaluator may still be rebuilding).
	for grace := time.Now().Add(30*time.Second + 3*win); w.resynced.Load() < w.readmitted.Load() && time.Now().Before(grace); {
		if !sleepUntil(ctx, time.Now().Add(50*time.Millisecond)) {
			return ctx.Err()
		}
	}
	end, err := w.scrape(ctx)
	if err != nil {
		return err
	}
	stopStreams()
	wg.Wait()
	gen2.stop()
	return w.reportRestart(sigAt, upAt, end)
}

// waitPersisted waits until process 1's census has written the subscribers
// and read them back (muster_watch_expected_population), so the restart
// is measured against a population PostgreSQL holds.
func (w *lgWatch) waitPersisted(ctx context.Context) (lgwScrape, error) {
	deadline := time.Now().Add(5*w.admissionWindow + 10*time.Second)
	for {
		s, err := w.scrape(ctx)
		if err != nil {
			return s, err
		}
		if s.expected >= float64(w.clients) {
			return s, nil
		}
		if time.Now().After(deadline) {
			return s, fmt.Errorf("muster process 1 reports an expected population of %.0f, not the %d subscribers it holds, after %s",
				s.expected, w.clients, 5*w.admissionWindow+10*time.Second)
		}
		if !sleepUntil(ctx, time.Now().Add(100*time.Millisecond)) {
			return s, ctx.Err()
		}
	}
}

// lgwRestartFigures is what the subscribers saw of the restarted muster.
type lgwRestartFigures struct {
	readmitted, twice, never int
	last                     time.Duration // last first-admission, from process 2 serving
	perWindow                []int         // first admissions per window from process 2 serving, by arrival
	// waits are, per client, from its admission to its synced: the wait
	// for the views of clients admitted while process 2 was rebuilding.
	waits []time.Duration
	// provable is the most first admissions whose whole round trip (sent
	// to answered) fell inside one window: muster decided each of them
	// within that window, whatever the latency. A figure above the
	// budget would prove a window admitted too many; counting by arrival
	// time alone cannot, as answers arrive late by different amounts.
	provable int
}

func (w *lgWatch) restartFigures(upAt time.Time) lgwRestartFigures {
	var f lgwRestartFigures
	type trip struct{ sent, at time.Time }
	var trips []trip
	for _, c := range w.restartClients {
		switch {
		case c.readmits == 0:
			f.never++
			continue
		case c.readmits > 1:
			f.twice++
		}
		f.readmitted++
		trips = append(trips, trip{c.readmitSent, c.readmitAt})
		if c.resynced {
			f.waits = append(f.waits, c.resyncAt.Sub(c.readmitAt))
		}
	}
	slices.Sort(f.waits)
	win := w.admissionWindow
	for _, tr := range trips {
		d := tr.at.Sub(upAt)
		k := max(0, int(d/win))
		for len(f.perWindow) <= k {
			f.perWindow = append(f.perWindow, 0)
		}
		f.perWindow[k]++
		f.last = max(f.last, d)
	}
	slices.SortFunc(trips, func(a, b trip) int { return a.sent.Compare(b.sent) })
	for i, a := range trips {
		end, n := a.sent.Add(win), 0
		for _, b := range trips[i:] {
			if !b.sent.Before(end) {
				break
			}
			if b.at.Before(end) {
				n++
			}
		}
		f.provable = max(f.provable, n)
	}
	return f
}

// reportRestart prints the figures and the assertions, and fails when an
// assertion does.
func (w *lgWatch) reportRestart(sigAt, upAt time.Time, end lgwScrape) error {
	f := w.restartFigures(upAt)
	win, n := w.admissionWindow, w.clients
	allowed := int(math.Floor(0.05*float64(n) + 1e-9))
	if f.never == 0 {
		fmt.Fprintf(w.stdout, "readmission: all %d readmitted %s after process 2 started serving (%s after the SIGTERM)\n",
			n, f.last.Round(time.Millisecond), (f.last + upAt.Sub(sigAt)).Round(time.Millisecond))
	} else {
		fmt.Fprintf(w.stdout, "readmission: %d of %d readmitted within %s; %d never\n", f.readmitted, n, w.readmitTimeout, f.never)
	}
	fmt.Fprintf(w.stdout, "re-synced (views of every watched service, then synced): %d of %d; admission to synced p50 %s p99 %s max %s (clients admitted while process 2 rebuilt waited for its first views)\n",
		w.resynced.Load(), n, pctOf(f.waits, 0.5), pctOf(f.waits, 0.99), pctOf(f.waits, 1))
	var b strings.Builder
	for _, k := range f.perWindow {
		fmt.Fprintf(&b, " %d", k)
	}
	maxWin := 0
	if len(f.perWindow) > 0 {
		maxWin = slices.Max(f.perWindow)
	}
	fmt.Fprintf(w.stdout, "admitted per %s window from process 2's start, as the clients saw them:%s\n", win, b.String())
	fmt.Fprintf(w.stdout, "admitted per %s window: max %d = %.1f%% of %d by those windows (arrival times); muster's own count within any %s: %.0f = %.1f%%; provably within one %s (whole round trip inside it): %d = %.1f%%\n",
		win, maxWin, pctOfN(maxWin, n), n, win, end.admittedWindowMax, 100*end.admittedWindowMax/float64(n), win, f.provable, pctOfN(f.provable, n))
	fmt.Fprintf(w.stdout, "refusals: %d by process 2 as the clients counted them (%.2f per client; muster counted %.0f); %d failed requests while muster was down\n",
		w.refusedGen2.Load(), float64(w.refusedGen2.Load())/float64(n), end.refused, w.streamErrors.Load())

	var failed []string
	check := func(name string, ok bool, detail string) {
		verdict := "ok"
		if !ok {
			verdict = "FAILED"
			failed = append(failed, name)
		}
		fmt.Fprintf(w.stdout, "assert %s: %s: %s\n", name, verdict, detail)
	}
	check("exactly-once", f.never == 0 && f.twice == 0 && w.doubleAdmits.Load() == 0 && int(end.admitted) == n,
		fmt.Sprintf("each of the %d clients admitted exactly once after the restart (%d once, %d more than once, %d never; muster admitted %.0f subscriptions)",
			n, f.readmitted-f.twice, f.twice, f.never, end.admitted))
	check("5%-per-window", end.admittedWindowMax <= float64(allowed) && f.provable <= allowed,
		fmt.Sprintf("at most %.0f admitted within any %s by muster's count, and no window the clients can prove held more (%d), never above 5%% of the population (%d of %d)",
			end.admittedWindowMax, win, f.provable, allowed, n))
	check("synced-after-view", w.syncedEarly.Load() == 0 && w.resynced.Load() == int64(f.readmitted),
		fmt.Sprintf("%d readmitted clients got synced only after a view of every watched service (%d synced early, %d never synced)",
			w.resynced.Load(), w.syncedEarly.Load(), int64(f.readmitted)-w.resynced.Load()))
	if len(failed) > 0 {
		return fmt.Errorf("loadgen watch --restart: %s failed", strings.Join(failed, ", "))
	}
	return nil
}

func pctOfN(k, n int) float64 { return 100 * float64(k) / float64(max(n, 1)) }

// lgwListenAddr resolves a free port for addr's port 0: both processes
// must listen on the same address.
func lgwListenAddr(addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("--addr %q: %w", addr, err)
	}
	if port != "0" {
		return addr, nil
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return "", fmt.Errorf("find a free port on %s: %w", host, err)
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// lgwMuster is a child `muster dev` process.
type lgwMuster struct {
	cmd     *exec.Cmd
	logPath string
	done    chan struct{} // closed when the process has exited
	once    sync.Once
}

// startMuster runs `muster dev` on w.dir and addr with env added to the
// environment, and waits until it serves.
func (w *lgWatch) startMuster(ctx context.Context, n int, addr string, env ...string) (*lgwMuster, error) {
	exe := w.env.Exe
	if exe == "" {
		var err error
		if exe, err = os.Executable(); err != nil {
			return nil, fmt.Errorf("find the muster binary: %w", err)
		}
	}
	logPath := filepath.Join(w.dir, fmt.Sprintf("loadgen-restart-muster%d.log", n))
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("muster process %d log: %w", n, err)
	}
	cmd := exec.Command(exe, "dev", "--addr", addr, "--data", w.dir)
	cmd.Env = append(os.Environ(), "MUSTER_REPLICA="+lgwReplica, "MUSTER_ADMISSION_WINDOW="+w.admissionWindow.String())
	cmd.Env = append(append(cmd.Env, w.env.ChildEnv...), env...)
	served := &servedWriter{ch: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = served, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start muster process %d: %w", n, err)
	}
	m := &lgwMuster{cmd: cmd, logPath: logPath, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(m.done)
	}()
	select {
	case <-served.ch:
		return m, nil
	case <-m.done:
		return nil, fmt.Errorf("muster process %d exited before serving: see %s", n, logPath)
	case <-time.After(2 * time.Minute):
		m.stop()
		return nil, fmt.Errorf("muster process %d did not serve within 2 min: see %s", n, logPath)
	case <-ctx.Done():
		m.stop()
		return nil, ctx.Err()
	}
}

// stop asks the process to shut down (SIGTERM: it drains its streams) and
// waits for it, killing it after a minute. Safe to call twice.
func (m *lgwMuster) stop() {
	m.once.Do(func() {
		_ = m.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-m.done:
		case <-time.After(time.Minute):
			_ = m.cmd.Process.Kill()
			<-m.done
		}
	})
}

// servedWriter takes a child muster's stdout and closes ch once it says it
// is serving. exec writes to it from one goroutine.
type servedWriter struct {
	ch   chan struct{}
	tail []byte
	seen bool
}

func (s *servedWriter) Write(p []byte) (int, error) {
	if !s.seen {
		s.tail = append(s.tail, p...)
		if bytes.Contains(s.tail, []byte("serving on")) {
			s.seen = true
			close(s.ch)
		} else if len(s.tail) > 64 {
			s.tail = s.tail[len(s.tail)-64:]
		}
	}
	return len(p), nil
}
