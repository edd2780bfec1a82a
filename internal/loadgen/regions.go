package loadgen

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/musterhq/muster/internal/cli"
	"github.com/musterhq/muster/internal/devissuer"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/resolver"
)

// lgRegionsService is the service loadgen regions creates in region b.
const lgRegionsService = "lg-regions"

// loadgenRegions measures cross-region propagation: a
// withdrawal in region b reaching region a's subscribers. It creates
// lg-regions in b with --instances instances, opens --subscribers resolver
// clients on a (Regions: [b]: the service exists only in b, so they hold
// it as lg-regions@b from a's aggregate), then withdraws --withdrawals of
// the instances in b one at a time (each deregisters itself) and times,
// from b's acknowledgement, each subscriber no longer holding it. It
// prints the p50/p99/max of those times with the aggregate's lag (a's
// GET /v1/regions age_seconds for b, sampled at each withdrawal, and the
// age_seconds the served views carried).
func loadgenRegions(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var (
		urlA, urlB, dirA, dirB              string
		subscribers, instances, withdrawals int
		localSubscribers                    int
		timeout                             time.Duration
	)
	fs := cli.NewFlags("loadgen regions", stderr)
	fs.StringVar(&urlA, "a", "http://127.0.0.1:8080", "region a's muster (it follows b with --peer)")
	fs.StringVar(&dirA, "a-data", ".muster-a", "region a's dev data folder, for minting its tokens")
	fs.StringVar(&urlB, "b", "http://127.0.0.1:8081", "region b's muster")
	fs.StringVar(&dirB, "b-data", ".muster-b", "region b's dev data folder, for minting its tokens")
	fs.IntVar(&subscribers, "subscribers", 100, "resolver clients on a")
	fs.IntVar(&localSubscribers, "b-subscribers", 5, "resolver clients on b itself, timing the same withdrawals without the cross-region hop")
	fs.IntVar(&instances, "instances", 20, "instances of lg-regions in b")
	fs.IntVar(&withdrawals, "withdrawals", 5, "instances withdrawn in b, one at a time (at most half of --instances: the removal budget)")
	fs.DurationVar(&timeout, "timeout", 2*time.Minute, "how long a's subscribers may take to see b's service, and each withdrawal")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	switch {
	case subscribers < 1 || instances < 2:
		return fmt.Errorf("--subscribers %d, --instances %d: want at least 1 and 2", subscribers, instances)
	case withdrawals < 1 || withdrawals > instances/2:
		return fmt.Errorf("--withdrawals %d: want 1 to %d (half of --instances)", withdrawals, instances/2)
	}
	mint := func(dir string) (string, error) {
		iss, err := devissuer.LoadOrCreate(dir)
		if err != nil {
			return "", err
		}
		return iss.Mint(devissuer.TokenRequest{Kind: identity.KindTool, Subject: "loadgen", Role: identity.RoleAdmin}, time.Now())
	}
	adminA, err := mint(dirA)
	if err != nil {
		return fmt.Errorf("region a's token: %w", err)
	}
	adminB, err := mint(dirB)
	if err != nil {
		return fmt.Errorf("region b's token: %w", err)
	}
	client := &http.Client{Timeout: 30 * time.Second}
	call := func(method, url, tok, body string, out any) error {
		var b []byte
		if body != "" {
			b = []byte(body)
		}
		return apiCall(ctx, client, method, url, tok, b, out)
	}

	// b: the service and its instances.
	if err := call("PUT", urlB+"/v1/services/"+lgRegionsService, adminB, `{"owner":"`+loadgenOwner+`","capabilities":[]}`, nil); err != nil {
		return fmt.Errorf("create %s in b: %w", lgRegionsService, err)
	}
	// The instances register themselves (a workload token vouching for
	// their addresses) and withdraw themselves with their credentials,
	// as instances leaving do: an operator's deregistration is an
	// override, rate-limited per service.
	issB, err := devissuer.LoadOrCreate(dirB)
	if err != nil {
		return err
	}
	addrs := make([]string, instances)
	for i := range addrs {
		addrs[i] = fmt.Sprintf("10.29.%d.%d", i/250, i%250+1)
	}
	self, err := issB.Mint(devissuer.TokenRequest{Kind: identity.KindWorkload, Service: lgRegionsService, Addresses: addrs}, time.Now())
	if err != nil {
		return err
	}
	type lgInstance struct{ ID, Credential string }
	var ids []lgInstance
	for i := range instances {
		var in lgInstance
		body := fmt.Sprintf(`{"address":%q,"port":8080,"zone":"az%d"}`, addrs[i], i%2+1)
		if err := call("POST", urlB+"/v1/services/"+lgRegionsService+"/instances", self, body, &in); err != nil {
			return fmt.Errorf("register in b: %w", err)
		}
		ids = append(ids, in)
	}
	leave := func(in lgInstance) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodDelete, urlB+"/v1/instances/"+in.ID, nil)
		if err != nil {
			return err
		}
		req.Header.Set("Authorization", "Bearer "+self)
		req.Header.Set("Muster-Instance-Credential", in.Credential)
		res, err := client.Do(req)
		if err != nil {
			return err
		}
		defer res.Body.Close()
		if res.StatusCode/100 != 2 {
			b, _ := io.ReadAll(io.LimitReader(res.Body, 4<<10))
			return fmt.Errorf("DELETE %s: %d %s", req.URL, res.StatusCode, b)
		}
		return nil
	}

	// a: the subscribers, holding lg-regions@b from a's aggregate.
	series := resolver.RemoteSeries(lgRegionsService, "b")
	clients := make([]*resolver.Client, 0, subscribers)
	// A few subscribers on b itself time the same withdrawals without the
	// cross-region hop, so the hop's own share shows.
	locals := make([]*resolver.Client, 0, localSubscribers)
	defer func() {
		for _, c := range slices.Concat(clients, locals) {
			_ = c.Close()
		}
	}()
	for range localSubscribers {
		c, err := resolver.New(ctx, resolver.Config{
			URLs: []string{urlB}, Services: []string{lgRegionsService},
			Token:          func(context.Context) (string, error) { return adminB, nil },
			ReportInterval: -1, MaxBackoff: time.Second,
		})
		if err != nil {
			return err
		}
		locals = append(locals, c)
	}
	var servedAges []float64
	for range subscribers {
		c, err := resolver.New(ctx, resolver.Config{
			URLs: []string{urlA}, Services: []string{lgRegionsService}, Regions: []string{"b"},
			Token:          func(context.Context) (string, error) { return adminA, nil },
			ReportInterval: -1, MaxBackoff: time.Second,
		})
		if err != nil {
			return err
		}
		clients = append(clients, c)
	}
	seriesOf := func(c *resolver.Client) string {
		if slices.Contains(locals, c) {
			return lgRegionsService
		}
		return series
	}
	holds := func(c *resolver.Client, id string) (held bool, n int) {
		r, err := c.Resolve(seriesOf(c))
		if err != nil {
			return false, 0
		}
		for _, e := range r.Snapshot.Endpoints() {
			if e.InstanceID == id {
				held = true
			}
		}
		return held, len(r.Snapshot.Endpoints())
	}
	start := time.Now()
	for _, c := range slices.Concat(clients, locals) {
		for {
			if _, n := holds(c, ""); n == instances {
				break
			}
			if time.Since(start) > timeout {
				return fmt.Errorf("a's subscribers did not hold b's %s with its %d instances within %s (does a follow b with --peer b=%s, and discover it: --peer-discover-every?)", lgRegionsService, instances, timeout, urlB)
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-c.Updated():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	fmt.Fprintf(stdout, "loadgen regions: %d subscribers on a hold %s (%d instances) after %s\n", subscribers, series, instances, time.Since(start).Round(time.Millisecond))

	ageOfB := func() (float64, error) {
		var r struct {
			Peers []struct {
				Region     string  `json:"region"`
				AgeSeconds float64 `json:"age_seconds"`
			} `json:"peers"`
		}
		if err := call("GET", urlA+"/v1/regions", adminA, "", &r); err != nil {
			return 0, err
		}
		for _, p := range r.Peers {
			if p.Region == "b" {
				return p.AgeSeconds, nil
			}
		}
		return 0, errors.New("a does not follow a region b (GET /v1/regions)")
	}
	var lags, localLags []time.Duration
	var linkAges []float64
	for w := range withdrawals {
		id := ids[w].ID
		if age, err := ageOfB(); err == nil {
			linkAges = append(linkAges, age)
		}
		if err := leave(ids[w]); err != nil {
			return fmt.Errorf("withdraw %s in b: %w", id, err)
		}
		acked := time.Now()
		var wg sync.WaitGroup
		var mu sync.Mutex
		var missed int
		for _, c := range slices.Concat(clients, locals) {
			wg.Go(func() {
				deadline := time.NewTimer(timeout)
				defer deadline.Stop()
				for {
					ch := c.Updated()
					if held, _ := holds(c, id); !held {
						took := time.Since(acked)
						mu.Lock()
						if seriesOf(c) == series {
							lags = append(lags, took)
						} else {
							localLags = append(localLags, took)
						}
						mu.Unlock()
						return
					}
					select {
					case <-ch:
					case <-deadline.C:
						mu.Lock()
						missed++
						mu.Unlock()
						return
					case <-ctx.Done():
						return
					}
				}
			})
		}
		wg.Wait()
		if missed > 0 {
			return fmt.Errorf("withdrawal %d of %d (%s): %d of %d subscribers still held it after %s", w+1, withdrawals, id, missed, subscribers+localSubscribers, timeout)
		}
		var v resolver.View
		if err := call("GET", urlA+"/v1/resolve/"+series, adminA, "", &v); err == nil {
			servedAges = append(servedAges, v.AgeSeconds)
		}
	}
	slices.Sort(lags)
	slices.Sort(localLags)
	slices.Sort(linkAges)
	slices.Sort(servedAges)
	pf := func(xs []float64, p float64) float64 {
		if len(xs) == 0 {
			return 0
		}
		return xs[min(len(xs)-1, int(float64(len(xs))*p))]
	}
	fmt.Fprintf(stdout, "loadgen regions: %d withdrawals in b x %d subscribers on a: propagation p50 %s, p99 %s, max %s; aggregate lag (a's age of b) p50 %.2f s, max %.2f s; served age_seconds p50 %.2f s, max %.2f s\n",
		withdrawals, subscribers, pctOf(lags, 0.50), pctOf(lags, 0.99), lags[len(lags)-1].Round(time.Microsecond),
		pf(linkAges, 0.5), pf(linkAges, 1), pf(servedAges, 0.5), pf(servedAges, 1))
	if len(localLags) > 0 {
		fmt.Fprintf(stdout, "loadgen regions: the same withdrawals at %d subscribers on b itself: p50 %s, p99 %s (the cross-region hop adds the difference)\n",
			localSubscribers, pctOf(localLags, 0.50), pctOf(localLags, 0.99))
	}
	return nil
}
