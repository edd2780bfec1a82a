// Package demo fills a muster dev database with a small simulated estate
// and drives it with simulated evidence, so that every page of the admin
// UI and every API has something true to show within a minute of
// starting (`muster dev --demo`).
//
// Everything goes through muster's public HTTP API with tokens minted by
// the dev issuer, exactly as real workloads, probers, callers and
// operators would: services and contracts are PUT, instances registered
// and their leases renewed by their own workload identities, probers
// assigned by an admin, and evidence POSTed to /v1/reports. Nothing is
// written to the database behind muster's back.
//
// The estate is twelve services owned by four teams, two instances of
// each in each of three zones (az1, az2, az3). Four stories play out:
//
//   - Flapping: one recommendations instance in az1 fails for a few
//     seconds, recovers, and fails again, until flap quarantine holds it
//     out (about 40 s in).
//   - A bad health-check rollout: from 20 s, every catalog instance in az2
//     fails its probe and self-report; the zone loses all its eligible
//     instances and its fraction guard trips, publishing the full zone
//     rather than draining it.
//   - A prober partition: from 30 s the az3 prober can no longer see its
//     targets and says so ("unobservable"); notifications, which only
//     probers can vouch for, turns unknown in az3 and stays in rotation.
//   - A manual failover: at 10 s operator oscar drains az3 with a manual
//     shift, then walks traffic back in steps as the dwell allows (10 s
//     under --demo); the final step waits for an operator's confirmation,
//     and after 30 s pending raises shiftback_pending.
package demo

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/musterhq/muster/internal/devissuer"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/registry"
)

// Config configures a demo run.
type Config struct {
	// URL is muster's base URL.
	URL string
	// Mint mints a token with the dev issuer.
	Mint func(devissuer.TokenRequest) (string, error)
	// Logger receives progress; nil discards.
	Logger *slog.Logger
	// Tick is the evidence period: 2 s by default (under the 5 s probe
	// interval, so nothing goes silent by accident).
	Tick time.Duration
	// HTTPClient defaults to one with a 10 s timeout.
	HTTPClient *http.Client
}

// Zones of the demo estate.
var Zones = []string{"az1", "az2", "az3"}

// service is one service of the estate.
type service struct {
	name, owner string
	caps        []string
	contract    string // JSON; empty keeps the platform defaults
}

// Estate lists the demo services.
var estate = []service{
	{name: "storefront", owner: "web", caps: []string{"probe", "self", "passive"}},
	{name: "checkout", owner: "payments", caps: []string{"probe", "self", "passive"}},
	{name: "payments", owner: "payments", caps: []string{"probe", "self", "passive"}},
	{name: "ledger", owner: "payments", caps: []string{"probe", "self"}},
	{name: "search", owner: "search", caps: []string{"probe", "self", "passive"}},
	{name: "catalog", owner: "search", caps: []string{"probe", "self", "passive"}},
	{name: "recommendations", owner: "search", caps: []string{"probe", "self", "passive"},
		contract: `{"min_dwell_seconds":5}`},
	{name: "inventory", owner: "fulfilment", caps: []string{"probe", "self", "passive"}},
	{name: "shipping", owner: "fulfilment", caps: []string{"probe", "self"}},
	{name: "notifications", owner: "platform", caps: []string{"probe"}},
	{name: "auth", owner: "platform", caps: []string{"probe", "self", "passive"}},
	{name: "profile", owner: "platform", caps: []string{"self", "passive"}},
}

// ServiceNames returns the demo's service names.
func ServiceNames() []string {
	out := make([]string, len(estate))
	for i, s := range estate {
		out[i] = s.name
	}
	return out
}

// instance is one registered instance.
type instance struct {
	id, service, zone, addr string
	ordinal                 int // 0 or 1 within its zone
	// credential is what its registration returned: the instance sends
	// it with its renewals and self-reports.
	credential string
}

// Demo is a running simulation.
type Demo struct {
	cfg   Config
	log   *slog.Logger
	start time.Time

	mu        sync.Mutex
	tokens    map[string]string // by key
	instances []instance
}

// Run sets the estate up and drives it until ctx ends. Setup errors are
// returned; errors while driving are logged and retried on the next tick.
func Run(ctx context.Context, cfg Config) error {
	if cfg.URL == "" || cfg.Mint == nil {
		return errors.New("demo: URL and Mint are required")
	}
	if cfg.Tick <= 0 {
		cfg.Tick = 2 * time.Second
	}
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = &http.Client{Timeout: 10 * time.Second}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	d := &Demo{cfg: cfg, log: cfg.Logger.With("component", "demo"), tokens: map[string]string{}}
	// Leases are renewed from the first registration on, on a loop of
	// their own: setting the estate up takes minutes on a loaded machine,
	// longer than a lease, and a slow tick of reports must not starve the
	// renewals either.
	renewals, stopRenewals := context.WithCancel(ctx)
	renewing := make(chan struct{})
	go func() {
		defer close(renewing)
		t := time.NewTicker(10 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-renewals.Done():
				return
			case <-t.C:
				d.renew(renewals)
			}
		}
	}()
	defer func() { stopRenewals(); <-renewing }()
	if err := d.setup(ctx); err != nil {
		return fmt.Errorf("demo: set up the estate: %w", err)
	}
	d.start = time.Now()
	d.log.Info("demo estate ready", "services", len(estate), "instances", len(d.all()))
	tick := time.NewTicker(cfg.Tick)
	defer tick.Stop()
	var failover failover
	for {
		d.report(ctx, time.Since(d.start))
		failover.advance(ctx, d, time.Since(d.start))
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// token returns a cached token for req (minted for 12 h).
func (d *Demo) token(req devissuer.TokenRequest) (string, error) {
	key := fmt.Sprintf("%s/%s/%s/%s/%s/%s", req.Kind, req.Subject, req.Service, req.Team, req.Role, strings.Join(req.Addresses, ","))
	d.mu.Lock()
	defer d.mu.Unlock()
	if t, ok := d.tokens[key]; ok {
		return t, nil
	}
	req.TTL = 12 * time.Hour
	t, err := d.cfg.Mint(req)
	if err != nil {
		return "", err
	}
	d.tokens[key] = t
	return t, nil
}

func (d *Demo) admin() (string, error) {
	return d.token(devissuer.TokenRequest{Kind: identity.KindOperator, Subject: "demo-admin", Role: identity.RoleAdmin})
}

func workload(service string) devissuer.TokenRequest {
	return devissuer.TokenRequest{Kind: identity.KindWorkload, Service: service}
}

func proberOf(zone string) devissuer.TokenRequest {
	return devissuer.TokenRequest{Kind: identity.KindProber, Subject: "prober-" + zone}
}

// apiError is a non-2xx answer.
type apiError struct {
	Status int
	Body   string
	Header http.Header
}

func (e *apiError) Error() string { return fmt.Sprintf("HTTP %d: %s", e.Status, e.Body) }

// call sends a JSON request and decodes a JSON answer into out (if not nil).
func (d *Demo) call(ctx context.Context, method, path, token string, body, out any) error {
	return d.callAs(ctx, method, path, token, "", body, out)
}

// callAs is call by an instance presenting its credential ("" for none).
func (d *Demo) callAs(ctx context.Context, method, path, token, credential string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(d.cfg.URL, "/")+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	if credential != "" {
		req.Header.Set(registry.CredentialHeader, credential)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := d.cfg.HTTPClient.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(io.LimitReader(res.Body, 4<<20))
	if err != nil {
		return err
	}
	if res.StatusCode/100 != 2 {
		return &apiError{Status: res.StatusCode, Body: strings.TrimSpace(string(b)), Header: res.Header}
	}
	if out != nil && len(b) > 0 {
		return json.Unmarshal(b, out)
	}
	return nil
}

// transient says whether err is worth retrying: the request never got an
// answer, or the answer was one a busy or recovering server gives (429,
// 502, 503, 504). It also returns the wait the server asked for, if any.
func transient(err error) (bool, time.Duration) {
	var ae *apiError
	if !errors.As(err, &ae) {
		return true, 0 // transport error: no answer at all
	}
	switch ae.Status {
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		secs, _ := strconv.Atoi(ae.Header.Get("Retry-After"))
		return true, time.Duration(secs) * time.Second
	}
	return false, 0
}

// setupCall is call for the estate's setup, which a busy or recovering
// server must not end: a transient refusal (see transient) is retried
// with capped exponential backoff, or after the Retry-After asked for,
// until ctx ends. Every setup write is idempotent (PUTs, and a
// registration of the same address replaces the earlier one).
func (d *Demo) setupCall(ctx context.Context, method, path, token string, body, out any) error {
	backoff := 250 * time.Millisecond
	for {
		err := d.call(ctx, method, path, token, body, out)
		retry, after := transient(err)
		if err == nil || !retry || ctx.Err() != nil {
			return err
		}
		wait := max(after, backoff)
		d.log.Warn("demo: setup call failed; retrying", "method", method, "path", path, "in", wait, "err", err)
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// setup creates (or adopts) the services, contracts, instances and
// prober assignments.
func (d *Demo) setup(ctx context.Context) error {
	admin, err := d.admin()
	if err != nil {
		return err
	}
	for si, s := range estate {
		err := d.setupCall(ctx, http.MethodPut, "/v1/services/"+s.name, admin, map[string]any{"owner": s.owner, "capabilities": s.caps}, nil)
		if err != nil {
			return fmt.Errorf("service %s: %w", s.name, err)
		}
		if s.contract != "" {
			if err := d.putContract(ctx, s.name, admin, s.contract); err != nil {
				return err
			}
		}
		for zi, z := range Zones {
			for k := range 2 {
				addr := fmt.Sprintf("10.%d.%d.%d", zi+1, si+1, k+10)
				tok, err := d.token(devissuer.TokenRequest{Kind: identity.KindWorkload, Service: s.name, Addresses: []string{addr}})
				if err != nil {
					return err
				}
				var inst struct {
					ID         string `json:"id"`
					Credential string `json:"credential"`
				}
				err = d.setupCall(ctx, http.MethodPost, "/v1/services/"+s.name+"/instances", tok,
					map[string]any{"address": addr, "port": 8080, "zone": z}, &inst)
				if err != nil {
					return fmt.Errorf("register %s in %s: %w", s.name, z, err)
				}
				d.mu.Lock()
				d.instances = append(d.instances, instance{id: inst.ID, service: s.name, zone: z, addr: addr, ordinal: k, credential: inst.Credential})
				d.mu.Unlock()
			}
		}
	}
	for _, z := range Zones {
		var ids []string
		for _, in := range d.all() {
			if in.zone == z && has(in.service, "probe") {
				ids = append(ids, in.id)
			}
		}
		if err := d.setupCall(ctx, http.MethodPut, "/v1/probers/prober-"+z+"/assignments", admin, map[string]any{"services": []string{}, "instances": ids}, nil); err != nil {
			return fmt.Errorf("assign prober-%s: %w", z, err)
		}
	}
	// storefront calls the others; grant it resolution.
	for _, s := range estate {
		if s.name == "storefront" {
			continue
		}
		if err := d.setupCall(ctx, http.MethodPut, "/v1/services/"+s.name+"/grants", admin, map[string]any{"callers": []string{"storefront"}}, nil); err != nil {
			return fmt.Errorf("grant %s: %w", s.name, err)
		}
	}
	return nil
}

// putContract merges patch into the service's current contract.
func (d *Demo) putContract(ctx context.Context, name, admin, patch string) error {
	var cur struct {
		Version  int64          `json:"version"`
		Contract map[string]any `json:"contract"`
	}
	if err := d.setupCall(ctx, http.MethodGet, "/v1/services/"+name+"/contract", admin, nil, &cur); err != nil {
		return fmt.Errorf("contract of %s: %w", name, err)
	}
	if err := json.Unmarshal([]byte(patch), &cur.Contract); err != nil {
		return err
	}
	if err := d.setupCall(ctx, http.MethodPut, "/v1/services/"+name+"/contract", admin, cur.Contract, nil); err != nil {
		return fmt.Errorf("contract of %s: %w", name, err)
	}
	return nil
}

func has(service, capability string) bool {
	for _, s := range estate {
		if s.name == service {
			for _, c := range s.caps {
				if c == capability {
					return true
				}
			}
		}
	}
	return false
}

// health is what the simulation says about one instance at time t since
// the start: whether it works, and whether probers can see it.
func health(in instance, t time.Duration) (ok, observable bool) {
	ok, observable = true, true
	switch {
	case in.service == "recommendations" && in.zone == "az1" && in.ordinal == 0:
		// Fails for 5 s of every 17 s.
		ok = t%(17*time.Second) >= 5*time.Second
	case in.service == "catalog" && in.zone == "az2" && t >= 20*time.Second:
		ok = false
	}
	if in.zone == "az3" && t >= 30*time.Second {
		observable = false
	}
	return ok, observable
}

type report struct {
	InstanceID string  `json:"instance_id"`
	Class      string  `json:"class"`
	Outcome    string  `json:"outcome,omitempty"`
	Successes  *uint32 `json:"successes,omitempty"`
	Failures   *uint32 `json:"failures,omitempty"`
}

func outcome(ok bool) string {
	if ok {
		return "success"
	}
	return "failure"
}

// report sends one tick of evidence: probes per zone prober, self-reports
// per service, passive aggregates from storefront.
func (d *Demo) report(ctx context.Context, t time.Duration) {
	probes := map[string][]report{}
	type selfReport struct {
		in  instance
		rep report
	}
	var selfs []selfReport // a self-report speaks only for the instance that sends it
	var passive []report
	for _, in := range d.all() {
		ok, observable := health(in, t)
		if has(in.service, "probe") {
			o := outcome(ok)
			if !observable {
				o = "unobservable"
			}
			probes[in.zone] = append(probes[in.zone], report{InstanceID: in.id, Class: "probe", Outcome: o})
		}
		if has(in.service, "self") {
			selfs = append(selfs, selfReport{in, report{InstanceID: in.id, Class: "self", Outcome: outcome(ok)}})
		}
		if has(in.service, "passive") && in.service != "storefront" {
			s, f := uint32(20), uint32(0)
			if !ok {
				s, f = 2, 18
			}
			passive = append(passive, report{InstanceID: in.id, Class: "passive", Successes: &s, Failures: &f})
		}
	}
	send := func(who devissuer.TokenRequest, credential string, items []report) {
		if len(items) == 0 {
			return
		}
		tok, err := d.token(who)
		var res struct {
			Refused []struct{ Code, Reason string }
		}
		if err == nil {
			err = d.callAs(ctx, http.MethodPost, "/v1/reports", tok, credential, map[string]any{"reports": items}, &res)
		}
		if err != nil && ctx.Err() == nil {
			d.log.Warn("demo: report refused", "reporter", who.Subject+who.Service, "err", err)
		}
		if len(res.Refused) > 0 {
			d.log.Warn("demo: report items refused", "reporter", who.Subject+who.Service, "refused", len(res.Refused),
				"code", res.Refused[0].Code, "reason", res.Refused[0].Reason)
		}
	}
	for _, z := range Zones {
		send(proberOf(z), "", probes[z])
	}
	// Each instance reports itself, with its own credential (the address
	// alone proves a host, not an instance).
	for _, sr := range selfs {
		send(devissuer.TokenRequest{Kind: identity.KindWorkload, Service: sr.in.service, Addresses: []string{sr.in.addr}}, sr.in.credential,
			[]report{sr.rep})
	}
	send(workload("storefront"), "", passive)
}

// all returns the instances registered so far.
func (d *Demo) all() []instance {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.instances)
}

// renew renews every instance's lease with its own workload identity,
// eight at a time: one slow call must not push the others past their
// lease.
func (d *Demo) renew(ctx context.Context) {
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for _, in := range d.all() {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			tok, err := d.token(devissuer.TokenRequest{Kind: identity.KindWorkload, Service: in.service, Addresses: []string{in.addr}})
			if err == nil {
				err = d.renewOne(ctx, in, tok)
			}
			if ended(err) && ctx.Err() == nil {
				// The lease ran out (renewals lost to a machine too busy
				// to answer in time): register the instance again, as
				// its workload would, or its story stops for good.
				d.log.Warn("demo: an instance's lease ended; registering it again", "instance", in.id, "err", err)
				err = d.reregister(ctx, in, tok)
			}
			if err != nil && ctx.Err() == nil {
				d.log.Warn("demo: lease renewal failed", "instance", in.id, "err", err)
			}
		}()
	}
	wg.Wait()
}

// ended reports whether err says the instance is no longer active (its
// lease expired, or it was ended): 404 or 410.
func ended(err error) bool {
	var ae *apiError
	return errors.As(err, &ae) && (ae.Status == http.StatusNotFound || ae.Status == http.StatusGone)
}

// reregister registers in again (the same address, so the same place in
// the estate), puts the new id and credential in its place, and assigns
// the new id to its zone's prober when its service is probed.
func (d *Demo) reregister(ctx context.Context, in instance, tok string) error {
	var inst struct {
		ID         string `json:"id"`
		Credential string `json:"credential"`
	}
	if err := d.setupCall(ctx, http.MethodPost, "/v1/services/"+in.service+"/instances", tok,
		map[string]any{"address": in.addr, "port": 8080, "zone": in.zone}, &inst); err != nil {
		return fmt.Errorf("register %s in %s again: %w", in.service, in.zone, err)
	}
	d.mu.Lock()
	for i := range d.instances {
		if d.instances[i].id == in.id {
			d.instances[i].id, d.instances[i].credential = inst.ID, inst.Credential
		}
	}
	d.mu.Unlock()
	if !has(in.service, "probe") {
		return nil
	}
	var ids []string
	for _, o := range d.all() {
		if o.zone == in.zone && has(o.service, "probe") {
			ids = append(ids, o.id)
		}
	}
	admin, err := d.admin()
	if err != nil {
		return err
	}
	return d.setupCall(ctx, http.MethodPut, "/v1/probers/prober-"+in.zone+"/assignments", admin,
		map[string]any{"services": []string{}, "instances": ids}, nil)
}

// renewOne renews one lease, trying a renewal a busy server refused
// again at once, twice: the next pass is 10 s or more away and a lease
// lasts 30 s, so two lost passes would end it.
func (d *Demo) renewOne(ctx context.Context, in instance, tok string) error {
	var err error
	for attempt := range 3 {
		if attempt > 0 {
			_, after := transient(err)
			select {
			case <-ctx.Done():
				return err
			case <-time.After(max(after, 250*time.Millisecond)):
			}
		}
		err = d.callAs(ctx, http.MethodPut, "/v1/instances/"+in.id+"/lease", tok, in.credential, nil, nil)
		if retry, _ := transient(err); err == nil || !retry {
			return err
		}
	}
	return err
}

// failover is the manual failover story: drain az3 at 10 s, then step
// traffic back whenever the API allows, up to the confirmation it
// waits for.
type failover struct {
	id        string
	done      bool
	nextStep  time.Time
	attempted bool
}

func (f *failover) advance(ctx context.Context, d *Demo, t time.Duration) {
	if f.done || t < 10*time.Second || time.Now().Before(f.nextStep) {
		return
	}
	tok, err := d.token(devissuer.TokenRequest{Kind: identity.KindOperator, Subject: "oscar", Team: "payments", Role: identity.RoleOperator})
	if err != nil {
		return
	}
	if f.id == "" {
		if f.attempted {
			// An earlier drain got no clear answer: it may have been
			// made. Read back before draining again (the API's advice
			// for a write that is not idempotent).
			id, err := f.readBack(ctx, d, tok)
			if err != nil {
				f.retryLater(d, err)
				return
			}
			if id != "" {
				f.id, f.nextStep = id, time.Now()
				return
			}
		}
		f.attempted = true
		var shift struct {
			ID string `json:"id"`
		}
		err := d.call(ctx, http.MethodPost, "/v1/shifts", tok, map[string]any{
			"scope": "zone", "target": "az3", "reason": "demo: failover drill while az3's prober is partitioned", "manual": true,
		}, &shift)
		var ae *apiError
		switch {
		case errors.As(err, &ae) && ae.Status == http.StatusNotFound:
			d.log.Info("demo: this server has no shift-backs; skipping the failover story")
			f.done = true
			return
		case err != nil:
			if retry, _ := transient(err); retry {
				f.retryLater(d, err)
				return
			}
			d.log.Warn("demo: failover refused", "err", err)
			f.done = true
			return
		}
		f.id = shift.ID
		f.nextStep = time.Now()
		return
	}
	err = d.call(ctx, http.MethodPost, "/v1/shifts/"+f.id+"/step", tok, nil, nil)
	var ae *apiError
	switch {
	case err == nil:
		f.nextStep = time.Now()
	case errors.As(err, &ae) && ae.Header.Get("Retry-After") != "":
		secs, _ := strconv.Atoi(ae.Header.Get("Retry-After"))
		f.nextStep = time.Now().Add(time.Duration(max(secs, 1)) * time.Second)
	case errors.As(err, &ae) && ae.Status == http.StatusConflict:
		// The final step waits for an operator's confirmation: leave it
		// pending, which is the point of the story.
		d.log.Info("demo: shift-back of az3 awaits confirmation", "shift", f.id)
		f.done = true
	default:
		d.log.Warn("demo: shift step failed", "err", err)
		f.nextStep = time.Now().Add(10 * time.Second)
	}
}

// retryLater schedules the next attempt after a transient failure (a busy
// or recovering server must not end the story): after the Retry-After
// asked for, or 2 s.
func (f *failover) retryLater(d *Demo, err error) {
	_, after := transient(err)
	wait := max(after, 2*time.Second)
	d.log.Warn("demo: failover drain got no answer; trying again", "in", wait, "err", err)
	f.nextStep = time.Now().Add(wait)
}

// readBack finds the drill's shift of az3 if an earlier drain made it: the
// id of one not completed or cancelled, or "" when there is none.
func (f *failover) readBack(ctx context.Context, d *Demo, tok string) (string, error) {
	var page struct {
		Items []struct{ ID, Target, State string } `json:"items"`
	}
	if err := d.call(ctx, http.MethodGet, "/v1/shifts?limit=100", tok, nil, &page); err != nil {
		return "", err
	}
	for _, s := range page.Items {
		if s.Target == "az3" && s.State != "completed" && s.State != "cancelled" {
			return s.ID, nil
		}
	}
	return "", nil
}
