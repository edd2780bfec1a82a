package resolver

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
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
// matter.
func (c *Client) FlushReports(ctx context.Context) error {
	var items []passiveReport
	var dropped uint64
	c.cache.drainOutcomes(func(_, id string, s, f uint64) {
		if len(items) >= c.cfg.MaxReportItems {
			dropped += s + f
			return
		}
		items = append(items, passiveReport{InstanceID: id, Class: "passive", Successes: clamp32(s), Failures: clamp32(f)})
	})
	if dropped > 0 {
		c.rep.outcomesDropped.Add(dropped)
	}
	var first error
	for len(items) > 0 {
		n := min(len(items), reportBatch)
		batch := items[:n]
		items = items[n:]
		if err := c.postReports(ctx, batch); err != nil {
			c.rep.batchesFailed.Add(1)
			c.rep.outcomesDropped.Add(outcomesIn(batch))
			if first == nil {
				first = err
			}
			continue
		}
		c.rep.batchesSent.Add(1)
		c.rep.outcomesSent.Add(outcomesIn(batch))
	}
	return first
}

func (c *Client) postReports(ctx context.Context, batch []passiveReport) error {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.ReportTimeout)
	defer cancel()
	body, err := json.Marshal(struct {
		Reports []passiveReport `json:"reports"`
	}{batch})
	if err != nil {
		return err
	}
	base := c.cfg.URLs[int(c.rep.next.Add(1)-1)%len(c.cfg.URLs)]
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
