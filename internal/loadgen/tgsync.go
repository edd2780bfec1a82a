package loadgen

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/musterhq/muster/internal/cli"
	"github.com/musterhq/muster/internal/devissuer"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/tgsync"
	"github.com/musterhq/muster/internal/tgsync/elbv2standin"
	"github.com/musterhq/muster/internal/tgsync/haproxyrun"
	"github.com/musterhq/muster/resolver"
)

// loadgenTgsync prints the figures of target-group sync: how long a
// withdrawal takes to reach a real HAProxy synced by tgsync from a running
// muster (report -> HAProxy, and muster's published view -> HAProxy,
// p50/p99 over --withdrawals), and how many ELBv2 API calls tgsync makes
// per 1,000 endpoint changes (against the ELBv2 stand-in, through the real
// SDK).
func loadgenTgsync(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var (
		base, dir, haproxyBin                      string
		instances, withdrawals, endpoints, changes int
		maxDeregFraction                           float64
		elbOnly                                    bool
	)
	fs := cli.NewFlags("loadgen tgsync", stderr)
	fs.StringVar(&base, "url", "http://127.0.0.1:8080", "muster dev to withdraw instances from")
	fs.StringVar(&dir, "data", ".muster", "its data folder, for minting tokens")
	fs.StringVar(&haproxyBin, "haproxy", "", "haproxy binary (default: haproxy on PATH, or /usr/sbin/haproxy)")
	fs.IntVar(&instances, "instances", 0, "instances behind HAProxy, over two zones (default 2 x withdrawals + 20, so the guard never trips)")
	fs.IntVar(&withdrawals, "withdrawals", 100, "withdrawals to time")
	fs.Float64Var(&maxDeregFraction, "max-deregister-fraction", 1, "the binding's deregistration cap; 1 measures propagation, not the cap")
	fs.IntVar(&endpoints, "endpoints", 100, "ELBv2: endpoints in the target group")
	fs.IntVar(&changes, "changes", 1000, "ELBv2: endpoint changes")
	fs.BoolVar(&elbOnly, "elbv2-only", false, "only the ELBv2 figures (no muster, no haproxy)")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if err := tgsyncELBCalls(ctx, stdout, endpoints, changes); err != nil {
		return err
	}
	if elbOnly {
		return nil
	}
	if instances == 0 {
		instances = 2*withdrawals + 20
	}
	if instances < 2*withdrawals+2 {
		return fmt.Errorf("--instances %d: want at least 2 x withdrawals + 2, or the zone guards trip", instances)
	}
	if haproxyBin == "" {
		if p, err := exec.LookPath("haproxy"); err == nil {
			haproxyBin = p
		} else {
			haproxyBin = "/usr/sbin/haproxy"
		}
	}
	return tgsyncWithdrawals(ctx, stdout, base, dir, haproxyBin, instances, withdrawals, maxDeregFraction)
}

// tgsyncELBCalls counts ELBv2 calls per endpoint change: a group of n
// endpoints, changes one-endpoint views (a withdrawal or a re-entry,
// at most a fifth out at once), one per simulated second, each followed
// by a cycle (tgsync reconciles on every view change); then the same
// changes ten per view. Both with the group read once per interval (as
// muster tgsync binds ELBv2) and on every cycle.
func tgsyncELBCalls(ctx context.Context, stdout io.Writer, n, changes int) error {
	for _, readEvery := range []time.Duration{tgsync.DefaultInterval, 0} {
		for _, perView := range []int{1, 10} {
			calls, err := elbCalls(ctx, n, changes, perView, readEvery)
			if err != nil {
				return err
			}
			read := "the group read every interval (muster tgsync)"
			if readEvery == 0 {
				read = "the group read every cycle"
			}
			fmt.Fprintf(stdout, "ELBv2 (stand-in, real SDK), %s: %d endpoints, %d changes, %d per view: %d API calls, %.0f per 1,000 changes (%s)\n",
				read, n, changes, perView, calls.total, float64(calls.total)*1000/float64(changes), calls.by)
		}
	}
	return nil
}

type callCount struct {
	total int
	by    string
}

func elbCalls(ctx context.Context, n, changes, perView int, readEvery time.Duration) (callCount, error) {
	const arn = "arn:aws:elasticloadbalancing:us-east-1:123456789012:targetgroup/loadgen/0123456789abcdef"
	st := elbv2standin.New("AKIDLOADGEN")
	st.AddGroup(arn, "ip", 80, 60) // slow start set: the ALB ramps additions
	srv := httptest.NewServer(st)
	defer srv.Close()
	api := tgsync.NewELBv2Client(aws.Config{Region: "us-east-1", Credentials: credentials.NewStaticCredentialsProvider("AKIDLOADGEN", "s", "")},
		tgsync.AWSConfig{EndpointURL: srv.URL})
	be, err := tgsync.NewELBv2(ctx, api, tgsync.ELBv2Target{TargetGroupARN: arn})
	if err != nil {
		return callCount{}, err
	}
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	cache, err := resolver.NewCache([]string{"lg"}, resolver.WithClock(clock))
	if err != nil {
		return callCount{}, err
	}
	src := &cacheSource{Cache: cache, ch: make(chan struct{})}
	s, err := tgsync.NewSyncer(tgsync.SyncerConfig{Source: src, Clock: clock, Registerer: prometheus.NewRegistry(),
		Bindings: []tgsync.Bound{{Binding: tgsync.Binding{Name: "lg", Service: "lg", ELBv2: &tgsync.ELBv2Target{TargetGroupARN: arn},
			Policy: tgsync.Policy{MaxDeregisterFraction: tgsync.DefaultMaxDeregisterFraction, AddStepFraction: tgsync.DefaultAddStepFraction}}, Backend: be, ReadEvery: readEvery}}})
	if err != nil {
		return callCount{}, err
	}
	eps := make([]resolver.Endpoint, n)
	for i := range eps {
		eps[i] = resolver.Endpoint{InstanceID: fmt.Sprintf("00000000-0000-0000-0000-%012d", i), Address: fmt.Sprintf("10.%d.%d.%d", i%2, i/250, i%250+1),
			Port: 8080, Zone: fmt.Sprintf("az%d", i%2+1), State: "eligible", Weight: 1, Health: resolver.HealthKnown, Capabilities: []string{}}
	}
	version := uint64(0)
	publish := func() error {
		version++
		zones := map[string]resolver.Zone{}
		for _, e := range eps {
			z := zones[e.Zone]
			z.Guard, z.MinHealthyFraction = resolver.GuardOK, 0.5
			z.Total++
			if e.State == "eligible" {
				z.Eligible++
			}
			zones[e.Zone] = z
		}
		for name, z := range zones {
			reg := z.Total
			z.Registered = &reg
			zones[name] = z
		}
		v := resolver.View{Service: "lg", Version: version, Endpoints: slices.Clone(eps), Zones: zones, GeneratedAt: now, Checksum: resolver.Checksum(eps)}
		return cache.ApplyView(v)
	}
	cycle := func() error {
		for _, r := range s.RunOnce(ctx) {
			if r.Err != nil {
				return r.Err
			}
		}
		return nil
	}
	if err := publish(); err != nil {
		return callCount{}, err
	}
	if err := cycle(); err != nil {
		return callCount{}, err
	}
	_, setup := st.Calls()
	rng := rand.New(rand.NewPCG(1, 2))
	out := 0
	for c := 1; c <= changes; c++ {
		i := rng.IntN(n)
		switch {
		case eps[i].State == "eligible" && out < n/5:
			eps[i].State, eps[i].Weight = "ineligible", 0
			out++
		case eps[i].State == "ineligible":
			eps[i].State, eps[i].Weight = "eligible", 1
			out--
		default:
			c-- // the fifth is out: pick again
			continue
		}
		now = now.Add(time.Second)
		if c%perView != 0 {
			continue
		}
		if err := publish(); err != nil {
			return callCount{}, fmt.Errorf("view %d: %w", version, err)
		}
		if err := cycle(); err != nil {
			return callCount{}, err
		}
	}
	// Let capped deregistrations finish: cycles every interval.
	for range 10 {
		now = now.Add(tgsync.DefaultInterval)
		if err := cycle(); err != nil {
			return callCount{}, err
		}
	}
	by, total := st.Calls()
	var parts []string
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range by {
			if !yield(k) {
				return
			}
		}
	}) {
		parts = append(parts, fmt.Sprintf("%s %d", k, by[k]))
	}
	want := 0
	for _, e := range eps {
		if e.State == "eligible" {
			want++
		}
	}
	if got := len(st.Registered(arn)); got != want {
		return callCount{}, fmt.Errorf("the group ended with %d targets, the view routes to %d", got, want)
	}
	return callCount{total: total - setup, by: strings.Join(parts, ", ") + " over the run, the one-off setup calls included"}, nil
}

// cacheSource is a tgsync.Source over a resolver.Cache fed by loadgen.
type cacheSource struct {
	*resolver.Cache
	ch chan struct{}
}

func (s *cacheSource) Updated() <-chan struct{} { return s.ch }

// tgsyncWithdrawals times withdrawals from a running muster to a real
// HAProxy synced by tgsync.
func tgsyncWithdrawals(ctx context.Context, stdout io.Writer, base, dir, haproxyBin string, n, withdrawals int, maxDereg float64) error {
	iss, err := devissuer.LoadOrCreate(dir)
	if err != nil {
		return err
	}
	mint := func(r devissuer.TokenRequest) string {
		r.TTL = 2 * time.Hour
		tok, _ := iss.Mint(r, time.Now())
		return tok
	}
	admin := mint(devissuer.TokenRequest{Kind: identity.KindTool, Subject: "loadgen", Role: identity.RoleAdmin})
	suffix := strconv.Itoa(rand.IntN(1_000_000))
	svc, proberName := "tgsync-lg-"+suffix, "loadgen-tgsync-"+suffix
	prober := mint(devissuer.TokenRequest{Kind: identity.KindProber, Subject: proberName})
	viewer := mint(devissuer.TokenRequest{Kind: identity.KindTool, Subject: "loadgen-tgsync"})
	hc := &http.Client{Timeout: 30 * time.Second}
	do := func(method, path, tok, body string, want int) ([]byte, error) {
		req, err := http.NewRequestWithContext(ctx, method, base+path, strings.NewReader(body))
		if err != nil {
			return nil, err
		}
		req.Header.Set("Authorization", "Bearer "+tok)
		req.Header.Set("Content-Type", "application/json")
		res, err := hc.Do(req)
		if err != nil {
			return nil, err
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		if res.StatusCode != want {
			return b, fmt.Errorf("%s %s: %d %s", method, path, res.StatusCode, b)
		}
		return b, nil
	}
	for _, c := range []struct{ method, path, body string }{
		{"PUT", "/v1/services/" + svc, `{"owner":"loadgen","capabilities":["probe"]}`},
		{"PUT", "/v1/services/" + svc + "/contract", `{"min_dwell_seconds":5,"slow_start_seconds":0}`},
		{"PUT", "/v1/probers/" + proberName + "/assignments", `{"services":["` + svc + `"]}`},
	} {
		want := 200
		if strings.HasPrefix(c.path, "/v1/services/") && !strings.HasSuffix(c.path, "/contract") {
			want = 201
		}
		if _, err := do(c.method, c.path, admin, c.body, want); err != nil {
			return err
		}
	}
	// n real backends on loopback, each answering its index.
	ids := make([]string, n)
	keys := make([]tgsync.Key, n)
	for i := range n {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, strconv.Itoa(i)) }))
		defer srv.Close()
		host, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
		p, _ := strconv.Atoi(port)
		keys[i] = tgsync.Key{Addr: host, Port: p}
		b, err := do("POST", "/v1/services/"+svc+"/instances", admin, fmt.Sprintf(`{"address":%q,"port":%d,"zone":"az%d"}`, host, p, i%2+1), 201)
		if err != nil {
			return err
		}
		var in struct{ ID string }
		_ = json.Unmarshal(b, &in)
		ids[i] = in.ID
	}
	var upMu sync.Mutex
	up := make([]bool, n)
	for i := range up {
		up[i] = true
	}
	report := func(outcome string, which []int) error {
		items := make([]string, 0, len(which))
		for _, i := range which {
			items = append(items, fmt.Sprintf(`{"instance_id":%q,"class":"probe","outcome":%q}`, ids[i], outcome))
		}
		b, err := do("POST", "/v1/reports", prober, `{"reports":[`+strings.Join(items, ",")+`]}`, 200)
		if err == nil && !bytes.Contains(b, []byte(`"refused":[]`)) {
			err = fmt.Errorf("reports refused: %s", b)
		}
		return err
	}
	all := make([]int, n)
	for i := range all {
		all[i] = i
	}
	for deadline := time.Now().Add(60 * time.Second); report("success", all) != nil; {
		if time.Now().After(deadline) {
			return fmt.Errorf("muster did not take reports about the new instances within 60 s: %w", report("success", all))
		}
		time.Sleep(100 * time.Millisecond) // the evaluator picks registrations up
	}
	// The prober: success for every instance up, every 500 ms.
	pctx, stopProber := context.WithCancel(ctx)
	var proberDone sync.WaitGroup
	proberDone.Add(1)
	go func() {
		defer proberDone.Done()
		t := time.NewTicker(500 * time.Millisecond)
		defer t.Stop()
		for {
			upMu.Lock()
			var ok []int
			for i, u := range up {
				if u {
					ok = append(ok, i)
				}
			}
			upMu.Unlock()
			_ = report("success", ok)
			select {
			case <-pctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	defer func() { stopProber(); proberDone.Wait() }()

	hp, err := haproxyrun.Start(haproxyrun.Options{Binary: haproxyBin, Backend: "web", Slots: n + 4})
	if err != nil {
		return err
	}
	defer hp.Stop()
	client, err := resolver.New(ctx, resolver.Config{URLs: []string{base}, Services: []string{svc}, ReportInterval: -1,
		Token: func(context.Context) (string, error) { return viewer, nil }})
	if err != nil {
		return err
	}
	defer client.Close()
	hb := tgsync.NewHAProxy(tgsync.HAProxyTarget{Socket: hp.Socket, Backend: "web"})
	s, err := tgsync.NewSyncer(tgsync.SyncerConfig{Source: client, Logger: slog.New(slog.DiscardHandler),
		Bindings: []tgsync.Bound{{Binding: tgsync.Binding{Name: "lg", Service: svc, HAProxy: &tgsync.HAProxyTarget{Socket: hp.Socket, Backend: "web"},
			Policy: tgsync.Policy{MaxDeregisterFraction: maxDereg, AddStepFraction: 1}}, Backend: hb}}})
	if err != nil {
		return err
	}
	if err := s.Start(ctx); err != nil {
		return err
	}
	defer s.Stop()
	inPool := func() (map[tgsync.Key]bool, error) {
		servers, err := hb.Servers(ctx)
		if err != nil {
			return nil, err
		}
		m := map[tgsync.Key]bool{}
		for _, sv := range servers {
			if !sv.Maint() {
				m[tgsync.Key{Addr: sv.Addr, Port: sv.Port}] = true
			}
		}
		return m, nil
	}
	for deadline := time.Now().Add(60 * time.Second); ; {
		m, err := inPool()
		if err != nil {
			return err
		}
		if len(m) == n {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("HAProxy holds %d of %d instances after 60 s", len(m), n)
		}
		time.Sleep(50 * time.Millisecond) // polling with a deadline
	}
	fmt.Fprintf(stdout, "HAProxy (%s) synced by tgsync from muster at %s: %d instances of %s in rotation\n", haproxyBin, base, n, svc)

	var fromReport, fromView, toResolver []time.Duration
	for k := 0; k < withdrawals; k++ {
		// Instance k (zones alternate), never withdrawn before: a hard
		// failure takes minutes of success to undo, so every withdrawal
		// is of a fresh instance, and at most withdrawals/2 of each zone's
		// n/2 (a minority: the guard stays ok) are out at the end.
		pick := k
		m, err := inPool()
		if err != nil {
			return err
		}
		if !m[keys[pick]] {
			return fmt.Errorf("withdrawal %d: instance %d is not in HAProxy's rotation", k, pick)
		}
		upMu.Lock()
		up[pick] = false
		upMu.Unlock()
		start := time.Now()
		if err := report("hard_failure", []int{pick}); err != nil {
			return err
		}
		var seenAt time.Time
		var generated time.Time
		for deadline := start.Add(30 * time.Second); ; {
			if seenAt.IsZero() {
				if r, err := client.Resolve(svc); err == nil && !hasTarget(r.Targets(), keys[pick]) {
					seenAt, generated = time.Now(), r.GeneratedAt()
				}
			}
			m, err := inPool()
			if err != nil {
				return err
			}
			if !m[keys[pick]] {
				at := time.Now()
				if seenAt.IsZero() {
					seenAt = at
					if r, err := client.Resolve(svc); err == nil {
						generated = r.GeneratedAt()
					}
				}
				fromReport = append(fromReport, at.Sub(start))
				fromView = append(fromView, at.Sub(generated))
				toResolver = append(toResolver, seenAt.Sub(start))
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("withdrawal %d: HAProxy still routes to instance %d after 30 s", k, pick)
			}
			time.Sleep(time.Millisecond) // polling with a deadline, 1 ms resolution
		}
	}
	p := func(d []time.Duration, q float64) time.Duration {
		s := slices.Clone(d)
		slices.Sort(s)
		return s[min(len(s)-1, int(q*float64(len(s))))].Round(100 * time.Microsecond)
	}
	fmt.Fprintf(stdout, "withdrawals: %d (max_deregister_fraction %g)\n", len(fromReport), maxDereg)
	fmt.Fprintf(stdout, "  report -> tgsync's resolver drops it:           p50 %s  p99 %s  max %s\n", p(toResolver, .5), p(toResolver, .99), p(toResolver, 1))
	fmt.Fprintf(stdout, "  muster's withdrawal view -> HAProxy stops it:  p50 %s  p99 %s  max %s\n", p(fromView, .5), p(fromView, .99), p(fromView, 1))
	fmt.Fprintf(stdout, "  report -> HAProxy stops it:                    p50 %s  p99 %s  max %s\n", p(fromReport, .5), p(fromReport, .99), p(fromReport, 1))
	if bad := slices.IndexFunc(fromView, func(d time.Duration) bool { return d < 0 }); bad >= 0 {
		return errors.New("a view generated after HAProxy changed: clocks disagree")
	}
	return nil
}

func hasTarget(ts []resolver.Target, k tgsync.Key) bool {
	for _, t := range ts {
		if t.Address == k.Addr && t.Port == k.Port {
			return true
		}
	}
	return false
}
