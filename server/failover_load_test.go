package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/db/dbtest"
	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/devissuer"
	"github.com/musterhq/muster/internal/evaluator"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/policy"
	"github.com/musterhq/muster/internal/registry"
	"github.com/musterhq/muster/internal/wait"
	"github.com/musterhq/muster/server"
)

// The kinds of request the failover load sends.
const (
	loadRegister = "registrations"
	loadRenew    = "renewals"
	loadReport   = "reports"
)

// ackedInstance is a registration answered 201.
type ackedInstance struct {
	id, credential string
	at             time.Time
}

// failoverLoad drives muster's HTTP API from a few goroutines until
// stopped: registrations of new instances of web (each on a port of its
// own, from 127.0.0.1, which proves the address), batch renewals of the
// leases it was given, and self-reports about web's seeded instance. Every
// answer must be a success or a 503 problem with Retry-After; anything
// else (a 500, a 429, a transport error, a lease not renewed, a report not
// accepted) is kept in odd and fails the test.
type failoverLoad struct {
	s      *stack
	client *http.Client
	web    string // web's workload token, for registrations and renewals
	self   string // web's workload token vouching for 10.0.0.1, for reports
	target string // the instance the reports are about
	port   atomic.Int64

	mu          sync.Mutex
	acked       []ackedInstance
	ok          map[string]int
	unavailable map[string]map[string]int // kind -> problem type -> 503s
	// unanswered are the ports of registrations answered 503: each may
	// have committed all the same (its commit's answer lost with its
	// session), and is the only kind of registration that may be in the
	// database unacknowledged.
	unanswered map[int]bool
	slowest    map[string]time.Duration // kind -> the longest a request waited for its answer
	odd        []string

	stop func()
	done sync.WaitGroup
}

func startFailoverLoad(t *testing.T, s *stack, target string) *failoverLoad {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	l := &failoverLoad{
		s:      s,
		client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 8}, Timeout: 15 * time.Second},
		web:    s.Token(t, webReq),
		self:   s.Token(t, devissuer.TokenRequest{Kind: identity.KindWorkload, Service: "web", Addresses: []string{"10.0.0.1"}}),
		target: target,
		ok:     map[string]int{}, unavailable: map[string]map[string]int{}, unanswered: map[int]bool{}, slowest: map[string]time.Duration{},
		stop: cancel,
	}
	l.port.Store(20000)
	// Paced by tickers: enough load to keep every path busy through each
	// failover, little enough for two shared cores under -race.
	for range 4 {
		l.loop(ctx, 10*time.Millisecond, l.register)
	}
	for range 2 {
		l.loop(ctx, 20*time.Millisecond, l.renew)
	}
	l.loop(ctx, 40*time.Millisecond, l.report)
	t.Cleanup(func() { l.Stop(); l.client.CloseIdleConnections() })
	return l
}

func (l *failoverLoad) loop(ctx context.Context, every time.Duration, send func(context.Context)) {
	l.done.Go(func() {
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				// A request sent is answered, even as the load stops:
				// one the test cut could have committed unanswered.
				send(context.WithoutCancel(ctx))
			}
		}
	})
}

// Stop ends the load and waits for the answers to the requests it sent.
// Safe to call twice.
func (l *failoverLoad) Stop() { l.stop(); l.done.Wait() }

// post sends a JSON body as token and reads the answer: its status and
// body when it is want or 503 (counted by problem type), 0 otherwise
// (noted as odd).
func (l *failoverLoad) post(ctx context.Context, kind, path, token, body string, want int) (b []byte, status int) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, l.s.URL+path, strings.NewReader(body))
	if err != nil {
		panic(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	res, err := l.client.Do(req)
	if err == nil {
		b, err = io.ReadAll(res.Body)
		res.Body.Close()
	}
	took := time.Since(start)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.slowest[kind] = max(l.slowest[kind], took)
	switch {
	case err != nil:
		l.odd = append(l.odd, fmt.Sprintf("%s: %v", kind, err))
		return nil, 0
	case res.StatusCode == want:
		l.ok[kind]++
		return b, want
	case res.StatusCode == http.StatusServiceUnavailable:
		var p server.Problem
		ct, ra := res.Header.Get("Content-Type"), res.Header.Get("Retry-After")
		if ct != "application/problem+json" || ra == "" || json.Unmarshal(b, &p) != nil || p.Status != http.StatusServiceUnavailable {
			l.odd = append(l.odd, fmt.Sprintf("%s: 503 with Content-Type %q, Retry-After %q: %s", kind, ct, ra, b))
			return nil, 0
		}
		if l.unavailable[kind] == nil {
			l.unavailable[kind] = map[string]int{}
		}
		typ := strings.TrimPrefix(p.Type, server.ProblemBase)
		if strings.Contains(p.Detail, "nothing was attempted") {
			typ += " (not attempted: the monitor had it down)"
		}
		l.unavailable[kind][typ]++
		return b, http.StatusServiceUnavailable
	default:
		l.odd = append(l.odd, fmt.Sprintf("%s: %d %s", kind, res.StatusCode, b))
		return nil, 0
	}
}

func (l *failoverLoad) register(ctx context.Context) {
	port := int(l.port.Add(1))
	b, status := l.post(ctx, loadRegister, "/v1/services/web/instances", l.web,
		fmt.Sprintf(`{"address":"127.0.0.1","port":%d,"zone":"az1"}`, port), http.StatusCreated)
	l.mu.Lock()
	defer l.mu.Unlock()
	if status == http.StatusServiceUnavailable {
		l.unanswered[port] = true
	}
	if status != http.StatusCreated {
		return
	}
	var reg registry.Registered
	if err := json.Unmarshal(b, &reg); err != nil || reg.Credential == "" || reg.Port != int(port) {
		l.odd = append(l.odd, fmt.Sprintf("registration of port %d: 201 %s (%v)", port, b, err))
		return
	}
	l.acked = append(l.acked, ackedInstance{id: reg.ID.String(), credential: reg.Credential, at: time.Now()})
}

// renew renews the leases of the 20 newest acknowledged registrations:
// each was committed, so each must be renewed when the batch is.
func (l *failoverLoad) renew(ctx context.Context) {
	l.mu.Lock()
	batch := slices.Clone(l.acked[max(0, len(l.acked)-20):])
	l.mu.Unlock()
	if len(batch) == 0 {
		return
	}
	items := make([]string, len(batch))
	for i, a := range batch {
		items[i] = fmt.Sprintf(`{"instance_id":%q,"credential":%q}`, a.id, a.credential)
	}
	b, status := l.post(ctx, loadRenew, "/v1/leases/renewals", l.web, `{"renewals":[`+strings.Join(items, ",")+`]}`, http.StatusOK)
	if status != http.StatusOK {
		return
	}
	var res struct {
		Results []registry.RenewalResult `json:"results"`
	}
	err := json.Unmarshal(b, &res)
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil || len(res.Results) != len(batch) {
		l.odd = append(l.odd, fmt.Sprintf("renewals of %d leases: 200 %s (%v)", len(batch), b, err))
		return
	}
	for _, r := range res.Results {
		if r.Outcome != registry.RenewalRenewed {
			l.odd = append(l.odd, fmt.Sprintf("the lease of acknowledged instance %s: %s (%s)", r.InstanceID, r.Outcome, r.Detail))
		}
	}
}

func (l *failoverLoad) report(ctx context.Context) {
	b, status := l.post(ctx, loadReport, "/v1/reports", l.self,
		`{"reports":[{"instance_id":"`+l.target+`","class":"self","outcome":"success"}]}`, http.StatusOK)
	if status != http.StatusOK {
		return
	}
	var res evaluator.Result
	if err := json.Unmarshal(b, &res); err != nil || res.Accepted != 1 {
		l.mu.Lock()
		l.odd = append(l.odd, fmt.Sprintf("report: 200 %s (%v)", b, err))
		l.mu.Unlock()
	}
}

// acks is how many registrations were acknowledged, and when the first
// one acknowledged at or after since was.
func (l *failoverLoad) acks(since time.Time) (n int, first time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, a := range l.acked {
		if !a.at.Before(since) && (first.IsZero() || a.at.Before(first)) {
			first = a.at
		}
	}
	return len(l.acked), first
}

// unavailableCount is the 503s answered to kind so far.
func (l *failoverLoad) unavailableCount(kind string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, c := range l.unavailable[kind] {
		n += c
	}
	return n
}

func (l *failoverLoad) okCount(kind string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ok[kind]
}

// TestWriterFailoverUnderLoad (issue 28): PostgreSQL goes through two
// writer failovers (demoted to read-only with every session cut, held,
// promoted back) and one plain restart while muster takes registrations,
// lease renewals and reports. Every request is answered a success or a
// 503 problem with Retry-After, never a 500; resolve is served from
// memory throughout; after each, writes resume within seconds; and in
// the end every acknowledged registration is in the database, no
// registration is there by half (an instance without its audit entry,
// or an entry without its instance), the audit chain verifies, every
// pooled connection is read-write and none is left held.
func TestWriterFailoverUnderLoad(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pc := dbtest.NewCluster(t)
	rw, err := db.WithReadWrite(pc.URL())
	if err != nil {
		t.Fatal(err)
	}
	// The registrations' limit would refuse the load (1,200 a minute per
	// identity): this test is about the database, not the limits.
	s, instance := outageStackWith(t, apptest.Options{DatabaseURL: rw,
		Limits: server.Limits{Registrations: policy.Limit{Max: 1_000_000, Window: time.Minute}}})
	u, err := url.Parse(pc.URL())
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/postgres" // the test's own statements, outside the terminated database
	admin, err := db.OpenPool(ctx, db.PoolConfig{URL: u.String(), MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	exec := func(sql string) {
		t.Helper()
		if _, err := admin.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	api := s.Token(t, apiReq)
	// hold keeps PostgreSQL away for a few seconds under the load,
	// checking every 250 ms that muster stays ready and serves resolve
	// from memory (fail-static).
	hold := func(what string) {
		t.Helper()
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for end := time.Now().Add(3 * time.Second); time.Now().Before(end); <-tick.C {
			if r := s.Do(t, "GET", "/v1/resolve/web", api, "", ""); r.Status != http.StatusOK || !strings.Contains(string(r.Body), `"10.0.0.1"`) {
				t.Errorf("resolve %s: %d %s", what, r.Status, r.Body)
			}
			if r := s.Do(t, "GET", "/readyz", "", "", ""); r.Status != http.StatusOK {
				t.Errorf("/readyz %s: %d %s", what, r.Status, r.Body)
			}
		}
	}
	l := startFailoverLoad(t, s, instance)
	// underLoad waits until every kind of request has gone through
	// again a few times: muster is back under its load.
	underLoad := func(what string) {
		t.Helper()
		regs, _ := l.acks(time.Time{})
		renewals, reports := l.okCount(loadRenew), l.okCount(loadReport)
		wait.For(t, 20*time.Second, "the load going through "+what, func() bool {
			n, _ := l.acks(time.Time{})
			return n >= regs+20 && l.okCount(loadRenew) >= renewals+5 && l.okCount(loadReport) >= reports+5
		})
	}
	underLoad("before the failovers")
	// resumed waits for a registration acknowledged after back and says
	// how long after back it came.
	resumed := func(what string, back time.Time) time.Duration {
		t.Helper()
		var first time.Time
		wait.For(t, 30*time.Second, "a registration acknowledged after "+what, func() bool {
			_, first = l.acks(back)
			return !first.IsZero()
		})
		return first.Sub(back)
	}

	var took []string
	for i := range 2 {
		what := fmt.Sprintf("failover %d", i+1)
		// The writer is demoted: it turns read-only (sessions take the
		// reload in their own time, so wait for a write refused), then
		// every session of muster's database is cut.
		before := l.unavailableCount(loadRegister)
		exec("ALTER SYSTEM SET default_transaction_read_only = on")
		exec("SELECT pg_reload_conf()")
		wait.For(t, 10*time.Second, "a registration refused by the demoted writer ("+what+")", func() bool {
			return l.unavailableCount(loadRegister) > before
		})
		exec("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = 'muster'")
		hold("while demoted (" + what + ")")
		// The new writer is up.
		exec("ALTER SYSTEM RESET default_transaction_read_only")
		exec("SELECT pg_reload_conf()")
		d := resumed(what, time.Now())
		took = append(took, fmt.Sprintf("%s %s", what, d.Round(time.Millisecond)))
		underLoad("after " + what)
	}
	pc.Stop(t)
	hold("while PostgreSQL is stopped")
	pc.Start(t)
	d := resumed("the restart", time.Now())
	took = append(took, fmt.Sprintf("restart %s", d.Round(time.Millisecond)))
	underLoad("after the restart")
	l.Stop()

	l.mu.Lock()
	defer l.mu.Unlock()
	for _, o := range l.odd {
		t.Errorf("answered neither a success nor a 503 with Retry-After: %s", o)
	}
	for _, kind := range []string{loadRegister, loadRenew, loadReport} {
		t.Logf("%s: %d succeeded, 503 (all with Retry-After) %v, slowest answer %s", kind, l.ok[kind], l.unavailable[kind], l.slowest[kind].Round(time.Millisecond))
		// The request's database budget is 2 s; no request hangs on a
		// session that went away (5 s leaves room for -race on a busy
		// machine).
		if l.slowest[kind] > 5*time.Second {
			t.Errorf("%s: a request waited %s for its answer", kind, l.slowest[kind])
		}
	}
	t.Logf("first registration acknowledged after PostgreSQL became writable again: %s", strings.Join(took, ", "))

	// Nothing lost, nothing by half.
	check := checkPoolOn(t, pc)
	found := registeredInstances(t, check)
	lost := 0
	for _, a := range l.acked {
		if _, ok := found[a.id]; !ok {
			lost++
		}
		delete(found, a.id)
	}
	if lost > 0 {
		t.Errorf("%d of %d acknowledged registrations are not in the database", lost, len(l.acked))
	}
	// What is left was not acknowledged: only a registration answered 503
	// may have committed all the same.
	for id, port := range found {
		if !l.unanswered[port] {
			t.Errorf("instance %s (port %d) is in the database, and its registration was not answered", id, port)
		}
	}
	t.Logf("%d registrations acknowledged, all in the database; %d more committed though answered 503 (their commit's answer lost with the session)", len(l.acked), len(found))
	halfRegistered(t, check)
	if rep, err := audit.Verify(ctx, db.New(check)); err != nil {
		t.Errorf("the audit chain after the failovers: %v", err)
	} else {
		t.Logf("audit chain verified: %d rows", rep.Rows)
	}

	// No pool stuck: none held, every connection read-write, writes at once.
	wait.For(t, 10*time.Second, "every connection of muster's pool released", func() bool { return s.Pool.Stat().AcquiredConns() == 0 })
	for _, c := range s.Pool.AcquireAllIdle(ctx) {
		var ro string
		if err := c.QueryRow(ctx, "SHOW transaction_read_only").Scan(&ro); err != nil || ro != "off" {
			t.Errorf("a pooled connection after the failovers: transaction_read_only %q, %v", ro, err)
		}
		c.Release()
	}
	if up := databaseUp(t, s); up != "1" {
		t.Errorf("muster_database_up %s after the recovery", up)
	}
	if r := s.Do(t, "GET", "/readyz", "", "", ""); r.Status != http.StatusOK {
		t.Errorf("/readyz after the recovery: %d %s", r.Status, r.Body)
	}
	web := s.Token(t, webReq)
	for i := range 10 {
		start := time.Now()
		r := s.JSON(t, "POST", "/v1/services/web/instances", web, fmt.Sprintf(`{"address":"127.0.0.1","port":%d,"zone":"az1"}`, 10000+i))
		if r.Status != http.StatusCreated || time.Since(start) > 2*time.Second {
			t.Errorf("registration %d after the recovery: %d after %s %s", i, r.Status, time.Since(start), r.Body)
		}
	}
}

// checkPoolOn opens a pool on pc's database "muster" to read what the
// load left.
func checkPoolOn(t *testing.T, pc *dbtest.Cluster) *pgxpool.Pool {
	t.Helper()
	p, err := db.OpenPool(context.Background(), db.PoolConfig{URL: pc.URL(), MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// registeredInstances is the ports of web's instances its workload
// registered, by id.
func registeredInstances(t *testing.T, p *pgxpool.Pool) map[string]int {
	t.Helper()
	rows, err := p.Query(context.Background(), "SELECT id::text, port FROM instances WHERE service = 'web' AND registered_by = $1", webWorkload.String())
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]int{}
	for rows.Next() {
		var (
			id   string
			port int
		)
		if err := rows.Scan(&id, &port); err != nil {
			t.Fatal(err)
		}
		found[id] = port
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return found
}

// halfRegistered fails t for a registration committed by half: a
// registration inserts its instance and appends its instance.register
// audit entry in one transaction, so each instance has exactly one entry
// and each entry its instance.
func halfRegistered(t *testing.T, p *pgxpool.Pool) {
	t.Helper()
	for _, q := range []struct{ what, sql string }{
		{"instances without exactly one instance.register audit entry", `
			SELECT i.id::text FROM instances i
			WHERE (SELECT count(*) FROM audit_events a
			       WHERE a.action = 'instance.register' AND a.outcome = 'accepted'
			         AND a.target_kind = 'instance' AND a.target = i.id::text) <> 1`},
		{"instance.register audit entries without their instance", `
			SELECT a.target FROM audit_events a
			WHERE a.action = 'instance.register' AND a.outcome = 'accepted' AND a.target_kind = 'instance'
			  AND NOT EXISTS (SELECT 1 FROM instances i WHERE i.id::text = a.target)`},
	} {
		rows, err := p.Query(context.Background(), q.sql)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				t.Fatal(err)
			}
			ids = append(ids, id)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		if len(ids) > 0 {
			t.Errorf("%s: %v", q.what, ids)
		}
	}
}
