package notify

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/musterhq/muster/internal/tlsreload"
	"github.com/musterhq/muster/internal/worker"
)

// Defaults of Config's tuning.
const (
	DefaultInterval    = 5 * time.Second
	DefaultResend      = time.Minute
	DefaultTimeout     = 10 * time.Second
	DefaultQueueSize   = 1024
	DefaultMaxAttempts = 10
	DefaultBackoff     = time.Second
	DefaultMaxBackoff  = 5 * time.Minute
	// maxBatch bounds the alerts of one POST.
	maxBatch = 64
)

// Alarm is one open alarm as the notifier sends it.
type Alarm struct {
	Kind    string
	Service string // empty: estate-wide, the platform's
	// Instance is the instance the alarm is about, if one (a quarantine).
	Instance string
	Zone     string
	// Since is when the condition began; with the fields above it names
	// the alarm (a quarantine that ends and starts again is a new alarm).
	Since time.Time
	// Summary is one line; Detail the full text (a quarantine's flap
	// history). Both change freely without making a new alarm.
	Summary, Detail string
	// Replica names the replica whose own condition the alarm is (its
	// database unreachable, its clock skewed, a peer it cannot follow):
	// each replica sends such an alarm itself, labelled replica, as it is
	// not a copy of another's. Empty for the region's alarms.
	Replica string
}

func (a Alarm) key() string {
	parts := []string{a.Kind, a.Service, a.Instance, a.Zone, a.Since.UTC().Format(time.RFC3339Nano)}
	if a.Replica != "" {
		parts = append(parts, a.Replica)
	}
	h := sha256.Sum256([]byte(strings.Join(parts, "\x00")))
	return hex.EncodeToString(h[:6])
}

// Config configures a Notifier.
type Config struct {
	// Targets are where alarms go; at least one.
	Targets Targets
	// Alarms returns the open alarms; called from the notifier's
	// goroutine, it must not block on the network or the database.
	Alarms func() []Alarm
	// Sends reports whether this replica is the one of the region that
	// sends a (app: the owner of a's service's shard, or of the region's
	// alarms' key; a replica's own alarms always), so each target hears
	// of an alarm once per region rather than once per replica. An alarm
	// another replica sends is forgotten here without a resolution: it is
	// not over, only not this replica's to report. Nil: every alarm (a
	// replica alone).
	Sends func(Alarm) bool
	// Owner returns a service's owning team, false when unknown (the
	// alarm then goes to the platform only, labelled team=platform).
	Owner func(service string) (string, bool)
	// Region is this muster's region, a label of every alert.
	Region string
	// GeneratorURL is the alerts' link back (muster's GET /v1/alarms,
	// say); optional.
	GeneratorURL string
	// Interval is how often the alarms are diffed and due deliveries
	// sent; Resend how often a firing alert is sent again (keep it under
	// Alertmanager's resolve_timeout). Timeout bounds one POST.
	Interval, Resend, Timeout time.Duration
	// QueueSize bounds each target's queue of deliveries.
	QueueSize int
	// MaxAttempts is how many times a delivery is tried before it is
	// dead-lettered; Backoff the wait after the first failure, doubling
	// up to MaxBackoff, each wait jittered down by up to a half.
	MaxAttempts         int
	Backoff, MaxBackoff time.Duration
	// Client posts; one with Timeout when nil.
	Client *http.Client
	// Now is the clock of the alerts' startsAt/endsAt and of retries;
	// time.Now when nil. Jitter returns a number in [0, 1); rand's when
	// nil.
	Now    func() time.Time
	Jitter func() float64
	Logger *slog.Logger
	// Registerer, if set, registers the notifier's metrics.
	Registerer prometheus.Registerer
}

// Validate checks the configuration and fills in the defaults.
func (c *Config) Validate() error {
	if c.Targets.Empty() {
		return errors.New("notify: no target")
	}
	if err := c.Targets.Validate(); err != nil {
		return fmt.Errorf("notify: %w", err)
	}
	if c.Alarms == nil {
		return errors.New("notify: no alarm source")
	}
	if c.Owner == nil {
		c.Owner = func(string) (string, bool) { return "", false }
	}
	c.Interval = cmp.Or(c.Interval, DefaultInterval)
	c.Resend = cmp.Or(c.Resend, DefaultResend)
	c.Timeout = cmp.Or(c.Timeout, DefaultTimeout)
	c.QueueSize = cmp.Or(c.QueueSize, DefaultQueueSize)
	c.MaxAttempts = cmp.Or(c.MaxAttempts, DefaultMaxAttempts)
	c.Backoff = cmp.Or(c.Backoff, DefaultBackoff)
	c.MaxBackoff = max(cmp.Or(c.MaxBackoff, DefaultMaxBackoff), c.Backoff)
	if c.Interval < 0 || c.Resend < 0 || c.Timeout < 0 || c.QueueSize < 0 || c.MaxAttempts < 0 || c.Backoff < 0 {
		return errors.New("notify: negative tuning")
	}
	if c.Client == nil {
		c.Client = &http.Client{Timeout: c.Timeout}
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Jitter == nil {
		c.Jitter = rand.Float64
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Notifier sends the alarms. Build it with New.
type Notifier struct {
	cfg     Config
	log     *slog.Logger
	runner  worker.Runner
	metrics metrics
	kick    chan struct{}

	mu sync.Mutex // guards what follows; held by RunOnce, which the loop calls alone
	// sent are the alarms sent as firing and not yet resolved, by key.
	sent map[string]*firing
	// queues are the deliveries waiting, by sink.
	queues map[string]*queue
	// clients are the targets' with a CA of their own, by target name;
	// the others post with cfg.Client.
	clients map[string]*http.Client
	// sinks are where deliveries go, by name: a target with one URL is
	// one sink named as the target (a team, or PlatformTeam); each member
	// of an Alertmanager set is a sink of its own, TEAM@HOST.
	sinks map[string]*sink
}

// sink is one URL of a target, with the client that reaches it.
type sink struct {
	target Target
	url    string
	client *http.Client
}

func (s *sink) host() string { return hostOf(s.url) }

// sinkNames are the sinks of target name, built on first use.
func (n *Notifier) sinkNames(name string) []string {
	t := n.target(name)
	members := t.members()
	out := make([]string, 0, len(members))
	for _, raw := range members {
		key := name
		if len(t.URLs) > 0 {
			key = name + "@" + hostOf(raw)
		}
		if n.sinks[key] == nil {
			client := n.cfg.Client
			if c, ok := n.clients[name]; ok {
				client = c
			}
			n.sinks[key] = &sink{target: t, url: raw, client: client}
		}
		out = append(out, key)
	}
	return out
}

type firing struct {
	alarm    Alarm
	team     string
	startsAt time.Time
	lastSent time.Time // when last queued
}

// New builds a notifier; cfg is validated.
func New(cfg Config) (*Notifier, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	n := &Notifier{cfg: cfg, log: cfg.Logger.With("worker", "notify"), kick: make(chan struct{}, 1),
		sent: map[string]*firing{}, queues: map[string]*queue{}, sinks: map[string]*sink{}}
	var err error
	if n.metrics, err = newMetrics(cfg.Registerer); err != nil {
		return nil, err
	}
	n.clients = map[string]*http.Client{}
	named := map[string]Target{}
	if cfg.Targets.Platform != nil {
		named[PlatformTeam] = *cfg.Targets.Platform
	}
	maps.Copy(named, cfg.Targets.Teams)
	for name, t := range named {
		if t.CA == "" {
			continue
		}
		// A bundle that does not load at start stops the start: alerts
		// to this target could never be delivered.
		cas, err := tlsreload.NewClientCAs(tlsreload.ClientCAConfig{File: t.CA, Logger: cfg.Logger, Now: cfg.Now})
		if err != nil {
			return nil, fmt.Errorf("notify: target %s: ca: %w", name, err)
		}
		n.clients[name] = &http.Client{Timeout: cfg.Timeout, Transport: caTransport(cas.Pool)}
	}
	return n, nil
}

// caTransport verifies a target's https certificate against the bundle
// pool returns at each handshake (the chain, and the host name or IP
// address dialled), so a CA rotated on disk is trusted from the next
// connection on.
func caTransport(pool func() *x509.CertPool) *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.DialTLSContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		cfg := &tls.Config{
			MinVersion: tls.VersionTLS12,
			ServerName: host,
			// Verified in VerifyConnection against the bundle as it is
			// now: a fixed RootCAs would keep the bundle of the start.
			InsecureSkipVerify: true,
			VerifyConnection: func(cs tls.ConnectionState) error {
				if len(cs.PeerCertificates) == 0 {
					return errors.New("the target sent no certificate")
				}
				opts := x509.VerifyOptions{Roots: pool(), DNSName: host, Intermediates: x509.NewCertPool()}
				for _, c := range cs.PeerCertificates[1:] {
					opts.Intermediates.AddCert(c)
				}
				_, err := cs.PeerCertificates[0].Verify(opts)
				return err
			},
		}
		return (&tls.Dialer{Config: cfg}).DialContext(ctx, network, addr)
	}
	return t
}

// Start diffs and sends at once, then every Interval or when poked,
// until ctx ends or Stop is called.
func (n *Notifier) Start(ctx context.Context) error { return n.runner.Start(ctx, n.run) }

// Stop stops the notifier. Safe to call twice or before Start. What is
// queued is not sent: Alertmanager resolves a firing alert it stops
// hearing about once its endsAt passes.
func (n *Notifier) Stop() { n.runner.Stop() }

// Poke asks for a RunOnce soon (an alarm changed); it never blocks.
func (n *Notifier) Poke() {
	select {
	case n.kick <- struct{}{}:
	default:
	}
}

func (n *Notifier) run(ctx context.Context) {
	t := time.NewTicker(n.cfg.Interval)
	defer t.Stop()
	for {
		n.RunOnce(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-n.kick:
		}
	}
}

// RunOnce diffs the open alarms against what was sent, queues firing
// alerts and resolutions, and sends what is due.
func (n *Notifier) RunOnce(ctx context.Context) {
	n.mu.Lock()
	defer n.mu.Unlock()
	now := n.cfg.Now()
	open := map[string]bool{}
	handed := map[string]bool{}
	for _, a := range n.cfg.Alarms() {
		k := a.key()
		if open[k] {
			continue
		}
		if n.cfg.Sends != nil && !n.cfg.Sends(a) {
			handed[k] = true
			continue
		}
		open[k] = true
		team := PlatformTeam
		if a.Service != "" {
			if owner, ok := n.cfg.Owner(a.Service); ok && owner != "" {
				team = owner
			}
		}
		f := n.sent[k]
		if f != nil && f.team != team {
			// A new owner (or one learnt late): the alert under the old
			// team label is resolved, one under the new one fires.
			n.enqueue(now, k, f, now)
			f = nil
		}
		resend := false
		switch {
		case f == nil:
			f = &firing{alarm: a, team: team, startsAt: now}
			n.sent[k] = f
		case f.alarm.Detail != a.Detail || f.alarm.Summary != a.Summary:
			f.alarm = a
		case now.Sub(f.lastSent) >= n.cfg.Resend:
			resend = true
		default:
			continue
		}
		f.lastSent = now
		n.enqueueFiring(now, k, f, resend)
	}
	for _, k := range slices.Sorted(maps.Keys(n.sent)) {
		switch {
		case open[k]:
		case handed[k]:
			// Still open, now another replica's to send (the shard
			// moved): no resolution, or the target would hear it end.
			delete(n.sent, k)
			n.forget(k)
		default:
			n.enqueue(now, k, n.sent[k], now)
			delete(n.sent, k)
		}
	}
	n.metrics.firing.Set(float64(len(n.sent)))
	n.deliver(ctx, now)
}

// targets are the names of the targets f goes to: its team's, if it has
// one, and the platform's.
func (n *Notifier) targets(f *firing) []string {
	var out []string
	if _, ok := n.cfg.Targets.Teams[f.team]; ok && f.team != PlatformTeam {
		out = append(out, f.team)
	}
	if n.cfg.Targets.Platform != nil {
		out = append(out, PlatformTeam)
	}
	return out
}

func (n *Notifier) target(name string) Target {
	if name == PlatformTeam {
		return *n.cfg.Targets.Platform
	}
	return n.cfg.Targets.Teams[name]
}

// enqueue queues f to each of its targets, resolved at endsAt unless that
// is zero.
func (n *Notifier) enqueue(now time.Time, key string, f *firing, endsAt time.Time) {
	n.enqueueTo(now, key, f, endsAt, false)
}

// enqueueFiring queues f as firing. A resend (nothing changed but time)
// goes to Alertmanager targets only: Alertmanager resolves an alert it
// stops hearing about once its endsAt passes, so it must hear it again,
// while a webhook would only page its receiver again for the same alarm.
func (n *Notifier) enqueueFiring(now time.Time, key string, f *firing, resend bool) {
	n.enqueueTo(now, key, f, time.Time{}, resend)
}

func (n *Notifier) enqueueTo(now time.Time, key string, f *firing, endsAt time.Time, resend bool) {
	var names []string
	for _, target := range n.targets(f) {
		if resend && n.target(target).Kind == KindWebhook {
			continue
		}
		names = append(names, n.sinkNames(target)...)
	}
	for _, name := range names {
		q := n.queues[name]
		if q == nil {
			q = &queue{}
			n.queues[name] = q
		}
		d := &delivery{id: key + "/" + f.team, key: key, alarm: f.alarm, team: f.team, startsAt: f.startsAt, endsAt: endsAt, next: now}
		if dropped := q.put(d, n.cfg.QueueSize); dropped != nil {
			n.metrics.deadLetter.WithLabelValues(name, "queue_full").Inc()
			n.log.Warn("alert dropped: the target's queue is full", "target", name, "host", n.sinks[name].host(), "alertname", dropped.alarm.Kind, "service", dropped.alarm.Service)
		}
		n.metrics.queued.WithLabelValues(name).Set(float64(len(q.items)))
	}
}

// deliver sends each target's due deliveries, one POST per target per
// round (at most maxBatch alerts).
func (n *Notifier) deliver(ctx context.Context, now time.Time) {
	for _, name := range slices.Sorted(maps.Keys(n.queues)) {
		q := n.queues[name]
		due := q.due(now, maxBatch)
		if len(due) == 0 {
			continue
		}
		t := n.sinks[name]
		err := n.post(ctx, t, due, now)
		if err != nil {
			n.metrics.failures.WithLabelValues(name).Inc()
		}
		for _, d := range due {
			status := "firing"
			if !d.endsAt.IsZero() {
				status = "resolved"
			}
			if err == nil {
				q.remove(d)
				n.metrics.sent.WithLabelValues(name, status).Inc()
				continue
			}
			d.attempts++
			if d.attempts >= n.cfg.MaxAttempts {
				q.remove(d)
				n.metrics.deadLetter.WithLabelValues(name, "attempts").Inc()
				n.log.Error("alert dead-lettered after its last attempt", "target", name, "host", t.host(), "attempts", d.attempts,
					"alertname", d.alarm.Kind, "service", d.alarm.Service, "status", status, "err", err)
				continue
			}
			d.next = now.Add(n.backoff(d.attempts))
		}
		if err != nil {
			n.log.Warn("alert delivery failed; retrying", "target", name, "host", t.host(), "alerts", len(due), "err", err)
		}
		n.metrics.queued.WithLabelValues(name).Set(float64(len(q.items)))
	}
}

// backoff is the wait after the attempts-th failure: Backoff doubling to
// MaxBackoff, less up to half of it at random, so many notifiers retrying
// one Alertmanager spread out.
func (n *Notifier) backoff(attempts int) time.Duration {
	d := n.cfg.Backoff
	for i := 1; i < attempts && d < n.cfg.MaxBackoff; i++ {
		d *= 2
	}
	d = min(d, n.cfg.MaxBackoff)
	return d - time.Duration(n.cfg.Jitter()*float64(d)/2)
}

// Alert is one alert as Alertmanager's v2 API takes it (and as the
// webhook's body lists it, with Status).
type Alert struct {
	Labels       map[string]string `json:"labels"`
	Annotations  map[string]string `json:"annotations"`
	StartsAt     time.Time         `json:"startsAt"`
	EndsAt       time.Time         `json:"endsAt"`
	GeneratorURL string            `json:"generatorURL,omitempty"`
	// Status is firing or resolved; webhook only.
	Status string `json:"status,omitempty"`
}

// Webhook is the body posted to a KindWebhook target.
type Webhook struct {
	// Status is resolved when every alert in it is, firing otherwise.
	Status string  `json:"status"`
	Alerts []Alert `json:"alerts"`
}

func (n *Notifier) alert(d *delivery, now time.Time, webhook bool) Alert {
	a := d.alarm
	labels := map[string]string{"alertname": a.Kind, "team": d.team, "alarm": d.key, "source": "muster"}
	for k, v := range map[string]string{"service": a.Service, "instance": a.Instance, "zone": a.Zone, "region": n.cfg.Region, "replica": a.Replica} {
		if v != "" {
			labels[k] = v
		}
	}
	summary := cmp.Or(a.Summary, a.Kind+" "+a.Service)
	out := Alert{Labels: labels, Annotations: map[string]string{"summary": summary, "description": a.Detail, "since": a.Since.UTC().Format(time.RFC3339)},
		StartsAt: d.startsAt, EndsAt: d.endsAt, GeneratorURL: n.cfg.GeneratorURL}
	if d.endsAt.IsZero() {
		// Firing: Alertmanager resolves it itself if muster stops saying
		// so for four resends (it went away, or the region is cut off).
		out.EndsAt = now.Add(4 * n.cfg.Resend)
	}
	if webhook {
		out.Status = "firing"
		if !d.endsAt.IsZero() {
			out.Status = "resolved"
		}
	}
	return out
}

// post sends ds to t; an error never carries the URL (it may carry a
// token).
func (n *Notifier) post(ctx context.Context, t *sink, ds []*delivery, now time.Time) error {
	webhook := t.target.Kind == KindWebhook
	alerts := make([]Alert, 0, len(ds))
	for _, d := range ds {
		alerts = append(alerts, n.alert(d, now, webhook))
	}
	var body any = alerts
	if webhook {
		w := Webhook{Status: "resolved", Alerts: alerts}
		for _, a := range alerts {
			if a.Status == "firing" {
				w.Status = "firing"
			}
		}
		body = w
	}
	b, err := json.Marshal(body)
	if err != nil {
		return fmt.Errorf("encode alerts: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, n.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, t.target.endpoint(t.url), bytes.NewReader(b))
	if err != nil {
		return errors.New("build request: malformed target URL")
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "muster-notify")
	resp, err := t.client.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return fmt.Errorf("post alerts to %s: %w", t.host(), err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("post alerts to %s: status %d: %s", t.host(), resp.StatusCode, strings.TrimSpace(string(msg)))
	}
	return nil
}
