package resolver

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Outcome reporting defaults.
const (
	DefaultReportInterval = 10 * time.Second
	DefaultReportTimeout  = 5 * time.Second
	// DefaultMaxReportItems bounds the endpoints reported per interval
	// (four of muster's 5,000-item batches).
	DefaultMaxReportItems = 20_000
	reportBatch           = 5000
)

// passiveReport is one item of POST /v1/reports: an aggregate of the
// caller's outcomes against one instance.
type passiveReport struct {
	InstanceID string `json:"instance_id"`
	Class      string `json:"class"`
	Successes  uint32 `json:"successes,omitempty"`
	Failures   uint32 `json:"failures,omitempty"`
}

type reportResult struct {
	Accepted int               `json:"accepted"`
	Refused  []json.RawMessage `json:"refused"`
}

// FlushReports sends the outcomes recorded since the last flush to muster
// as passive evidence, in batches, and returns the first error. Outcomes
// that cannot be sent (muster away, refused, over MaxReportItems) are
// dropped and counted, never kept for later: the next interval's counts
// are fresher evidence, and a caller must never block or grow memory
// because muster is down. The background loop calls it every
// ReportInterval; call it yourself before exiting if the last counts
// matter. With several URLs, each service's outcomes go to the replica
// that evaluates them (GET /v1/evidence/routes, learned every 30 s or as
// the servers advise), which spares the region a forwarding hop; the
// outcomes of a service whose owner is not among the URLs go to the URLs
// in turn, and the replica that takes them forwards them.
func (c *Client) FlushReports(ctx context.Context) error {
	var items []passiveReport
	var services []string
	var dropped uint64
	c.cache.drainOutcomes(func(service, id string, s, f uint64) {
		if len(items) >= c.cfg.MaxReportItems {
			dropped += s + f
			return
		}
		items = append(items, passiveReport{InstanceID: id, Class: "passive", Successes: clamp32(s), Failures: clamp32(f)})
		services = append(services, service)
	})
	if dropped > 0 {
		c.rep.outcomesDropped.Add(dropped)
	}
	if len(items) == 0 {
		return nil
	}
	// Each service's outcomes go to the replica that evaluates them when
	// the client knows it (one of its URLs); the rest to the URLs in
	// turn, and the replica that takes them forwards them there.
	owners := c.evidenceOwners(ctx)
	groups := map[int][]passiveReport{}
	var order []int
	for i := range items {
		to, ok := owners[services[i]]
		if !ok {
			to = -1
		}
		if _, seen := groups[to]; !seen {
			order = append(order, to)
		}
		groups[to] = append(groups[to], items[i])
	}
	var first error
	for _, to := range order {
		group := groups[to]
		for len(group) > 0 {
			n := min(len(group), reportBatch)
			batch := group[:n]
			group = group[n:]
			base := ""
			if to >= 0 {
				base = c.cfg.URLs[to]
			}
			if err := c.postReports(ctx, base, batch); err != nil {
				c.rep.batchesFailed.Add(1)
				c.rep.outcomesDropped.Add(outcomesIn(batch))
				if to >= 0 {
					// The owner may have gone: learn the routes afresh
					// on the next flush.
					c.routes.Store(nil)
				}
				if first == nil {
					first = err
				}
				continue
			}
			c.rep.batchesSent.Add(1)
			c.rep.outcomesSent.Add(outcomesIn(batch))
			if to >= 0 {
				c.rep.batchesToOwner.Add(1)
			}
		}
	}
	return first
}

// evidenceRoutes is what the client last learned of where each service's
// outcomes are evaluated.
type evidenceRoutes struct {
	at      time.Time
	refresh time.Duration
	owner   map[string]int // service -> index into Config.URLs
}

// maxRouteServices is the most services one GET /v1/evidence/routes names.
const maxRouteServices = 200

// evidenceOwners returns, for the configured services whose evaluating
// replica is one of Config.URLs, that URL's index: asked of every URL
// (GET /v1/evidence/routes), each saying which replica it is, so outcomes
// only ever go to a URL the client was given. It is learned again after
// the interval the servers advise; with one URL, or when no server can
// say (one of an older release, or none reachable), it is empty and the
// outcomes go to the URLs in turn, as before.
func (c *Client) evidenceOwners(ctx context.Context) map[string]int {
	if len(c.cfg.URLs) < 2 {
		return nil
	}
	now := c.cfg.Clock()
	if rt := c.routes.Load(); rt != nil && now.Sub(rt.at) < rt.refresh {
		return rt.owner
	}
	c.routesMu.Lock()
	defer c.routesMu.Unlock()
	if rt := c.routes.Load(); rt != nil && now.Sub(rt.at) < rt.refresh {
		return rt.owner
	}
	rt := &evidenceRoutes{at: now, refresh: max(c.cfg.ReportInterval, 30*time.Second), owner: map[string]int{}}
	index := map[string]int{}
	owners := map[string]string{}
	for i, base := range c.cfg.URLs {
		for from := 0; from < len(c.cfg.Services); from += maxRouteServices {
			ans, err := c.getRoutes(ctx, base, c.cfg.Services[from:min(from+maxRouteServices, len(c.cfg.Services))])
			if err != nil {
				break // that URL cannot say; the others may
			}
			if ans.Self != "" {
				index[ans.Self] = i
			}
			for name, id := range ans.Owners {
				if id != "" {
					owners[name] = id
				}
			}
			if ans.RefreshSeconds > 0 {
				rt.refresh = max(rt.refresh, time.Duration(ans.RefreshSeconds)*time.Second)
			}
		}
	}
	for name, id := range owners {
		if i, ok := index[id]; ok {
			rt.owner[name] = i
		}
	}
	c.routes.Store(rt)
	return rt.owner
}

type routesAnswer struct {
	Self           string            `json:"self"`
	Owners         map[string]string `json:"owners"`
	RefreshSeconds int               `json:"refresh_seconds"`
}

func (c *Client) getRoutes(ctx context.Context, base string, services []string) (routesAnswer, error) {
	var ans routesAnswer
	ctx, cancel := context.WithTimeout(ctx, c.cfg.ReportTimeout)
	defer cancel()
	q := url.Values{"service": services}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(base, "/")+"/v1/evidence/routes?"+q.Encode(), nil)
	if err != nil {
		return ans, err
	}
	if c.cfg.Token != nil {
		tok, err := c.cfg.Token(ctx)
		if err != nil {
			return ans, fmt.Errorf("resolver: token: %w", err)
		}
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	res, err := c.cfg.HTTPClient.Do(req)
	if err != nil {
		return ans, err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return ans, fmt.Errorf("resolver: evidence routes from %s: %s", base, res.Status)
	}
	err = json.NewDecoder(io.LimitReader(res.Body, 1<<20)).Decode(&ans)
	return ans, err
}

// postReports sends batch to base, or to the next URL in turn when base
// is "".
func (c *Client) postReports(ctx context.Context, base string, batch []passiveReport) error {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.ReportTimeout)
	defer cancel()
	body, err := json.Marshal(struct {
		Reports []passiveReport `json:"reports"`
	}{batch})
	if err != nil {
		return err
	}
	if base == "" {
		base = c.cfg.URLs[int(c.rep.next.Add(1)-1)%len(c.cfg.URLs)]
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(base, "/")+"/v1/reports", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if c.cfg.Token != nil {
		tok, err := c.cfg.Token(ctx)
		if err != nil {
			return fmt.Errorf("resolver: token: %w", err)
		}
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	res, err := c.cfg.HTTPClient.Do(req)
	if err != nil {
		return fmt.Errorf("resolver: report outcomes: %w", err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(res.Body, 4<<10))
		return fmt.Errorf("resolver: report outcomes to %s: %s: %s", base, res.Status, strings.TrimSpace(string(msg)))
	}
	var out reportResult
	if err := json.NewDecoder(io.LimitReader(res.Body, 1<<20)).Decode(&out); err == nil {
		c.rep.itemsRefused.Add(uint64(len(out.Refused)))
	}
	return nil
}

// background sweeps ejections and holds every second and flushes outcome
// reports every ReportInterval.
func (c *Client) background(ctx context.Context) {
	sweep := time.NewTicker(time.Second)
	defer sweep.Stop()
	var flush <-chan time.Time
	if c.cfg.ReportInterval > 0 {
		t := time.NewTicker(c.cfg.ReportInterval)
		defer t.Stop()
		flush = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-sweep.C:
			if c.cache.sweep() {
				c.notify() // routing followed a held update
			}
		case <-flush:
			if err := c.FlushReports(ctx); err != nil && ctx.Err() == nil {
				c.cfg.Logger.Debug("resolver: outcome report dropped", "err", err)
			}
		}
	}
}

func outcomesIn(batch []passiveReport) uint64 {
	var n uint64
	for _, r := range batch {
		n += uint64(r.Successes) + uint64(r.Failures)
	}
	return n
}

func clamp32(n uint64) uint32 {
	if n > math.MaxUint32 {
		return math.MaxUint32
	}
	return uint32(n)
}
