package server_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/policy"
	"github.com/musterhq/muster/internal/registry"
	"github.com/musterhq/muster/server"
)

// Renewals are never lost to a limit (issue 26).

// webWorkload is the principal of webReq's tokens, as the registry records
// who registered an instance.
var webWorkload = identity.Principal{Kind: identity.KindWorkload, Service: "web", Subject: "web"}

// leaveGrace sweeps the reaper once, then moves the clock past a lease
// TTL and sweeps again: the reaper's grace after a start is over, and
// from then on a lapsed lease may be expired.
func leaveGrace(t *testing.T, s *stack) {
	t.Helper()
	if _, err := s.Reaper.RunOnce(t.Context()); err != nil {
		t.Fatal(err)
	}
	s.Clock.Advance(registry.DefaultLeaseTTL + time.Second)
	if _, err := s.Reaper.RunOnce(t.Context()); err != nil || s.Reaper.InGrace() {
		t.Fatalf("the reaper after a TTL: in grace %v, %v", s.Reaper.InGrace(), err)
	}
}

// instanceState reads an instance back as an admin.
func instanceState(t *testing.T, s *stack, id uuid.UUID) registry.Instance {
	t.Helper()
	r := s.Do(t, "GET", "/v1/instances/"+id.String(), s.Token(t, adminReq), "", "")
	if r.Status != http.StatusOK {
		t.Fatalf("GET instance %s: %d %s", id, r.Status, r.Body)
	}
	return apptest.Decode[registry.Instance](t, r)
}

// TestTenThousandLeasesRenewedUnderOneIdentity: one workload identity
// registers 10,000 instances, and each renews its lease over HTTP every
// 10 s (a third of the 30 s TTL, the client's cadence), 1,000 a second,
// with the default limits (6000/10s per identity, which refused 400 of
// them a second once the first burst was spent while the limit did not
// grow with the identity's leases). None is refused, none lapses, the
// reaper (past its grace, stepped every second) expires none; and it is
// live: an instance of the same identity that stops renewing is expired
// meanwhile.
//
// Under the race detector, where 41,000 requests cost two minutes of
// CPU, the fleet is 2,000 and the base limit a fifth of the default
// (1200/10s): the same fleet-to-limit ratio, so a limit that did not grow
// with the leases would refuse the same share.
func TestTenThousandLeasesRenewedUnderOneIdentity(t *testing.T) {
	if testing.Short() {
		t.Skip("registers and renews 10,000 instances")
	}
	t.Parallel()
	const (
		workers = 8
		cadence = 10 // seconds between two renewals of a lease
	)
	fleet, limits := 10_000, server.Limits{}
	if raceDetector {
		fleet = 2_000
		def := server.DefaultLimits().LeaseRenewals
		limits.LeaseRenewals = policy.Limit{Max: def.Max * fleet / 10_000, Window: def.Window}
	}
	ctx := context.Background()
	s := apptest.New(t, apptest.Options{Limits: limits})
	s.Seed(t)
	leaveGrace(t, s)
	if got := webWorkload.String(); got != "workload:web/web" {
		t.Fatalf("web's workload is %s", got)
	}

	register := func(i int) registry.Registered {
		addr := netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
		reg, err := s.Registry.RegisterWithCredential(ctx, webWorkload, addr, "web",
			registry.Registration{Address: addr.String(), Port: 8080, Zone: fmt.Sprintf("az%d", i%3+1)})
		if err != nil {
			t.Fatalf("register %s: %v", addr, err)
		}
		return reg
	}
	// The control: registered 15 s before the fleet, never renewed. It
	// lapses 15 s into the run and is expired 10 s later.
	control := register(fleet)
	s.Clock.Advance(15 * time.Second)

	start := time.Now()
	regs := make([]registry.Registered, fleet)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := w; i < fleet; i += workers {
				regs[i] = register(i)
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	t.Logf("registered %d instances in %s", fleet, time.Since(start).Round(time.Millisecond))
	start = time.Now()

	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: workers, MaxConnsPerHost: workers}, Timeout: 30 * time.Second}
	t.Cleanup(client.CloseIdleConnections)
	token := s.Token(t, webReq)
	renew := func(reg registry.Registered) (int, string) {
		req, err := http.NewRequest(http.MethodPut, s.URL+"/v1/instances/"+reg.ID.String()+"/lease", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set(registry.CredentialHeader, reg.Credential)
		res, err := client.Do(req)
		if err != nil {
			t.Errorf("renew %s: %v", reg.ID, err)
			return 0, ""
		}
		defer res.Body.Close()
		body, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(body)
	}

	expiredBefore := plainCounter(t, s, "muster_leases_expired_total")
	var refused, failed int
	var mu sync.Mutex
	// Lease i renews at second i%10 of every 10, for one TTL and a bit:
	// every lease renews three times, each before its previous renewal
	// ran out.
	for sec := 1; sec <= 3*cadence+1; sec++ {
		s.Clock.Advance(time.Second)
		next := make(chan registry.Registered)
		for range workers {
			wg.Go(func() {
				for reg := range next {
					status, body := renew(reg)
					mu.Lock()
					switch status {
					case http.StatusOK:
					case http.StatusTooManyRequests:
						refused++
					default:
						if failed++; failed <= 3 {
							t.Errorf("renew %s: %d %s", reg.ID, status, body)
						}
					}
					mu.Unlock()
				}
			})
		}
		for i := sec % cadence; i < fleet; i += cadence {
			next <- regs[i]
		}
		close(next)
		wg.Wait()
		if refused > 0 || failed > 0 {
			t.Fatalf("second %d: %d renewals refused 429 and %d failed, want none", sec, refused, failed)
		}
		if n, err := s.Reaper.RunOnce(ctx); err != nil || s.Reaper.InGrace() {
			t.Fatalf("second %d: reaper expired %d, in grace %v, %v", sec, n, s.Reaper.InGrace(), err)
		}
	}

	t.Logf("renewed each lease 3 times, %d renewals, in %s", 3*fleet+fleet/cadence, time.Since(start).Round(time.Millisecond))

	// The control expired; nothing else did, and every lease of the fleet
	// runs on.
	if n := plainCounter(t, s, "muster_leases_expired_total") - expiredBefore; n != 1 {
		t.Errorf("%v leases expired during the run, want 1 (the control)", n)
	}
	if got := instanceState(t, s, control.ID); got.State != registry.StateExpired {
		t.Errorf("the control, never renewed: %s, want expired", got.State)
	}
	now := s.Clock.Now()
	live := 0
	admin := s.Token(t, adminReq)
	for cursor := ""; ; {
		page := apptest.Decode[struct {
			Items      []registry.Instance
			NextCursor string `json:"next_cursor"`
		}](t, s.Do(t, "GET", "/v1/services/web/instances?limit=1000&cursor="+cursor, admin, "", ""))
		for _, in := range page.Items {
			if !in.LeaseExpiresAt.After(now) {
				t.Errorf("instance %s: lease ran out at %s, now %s", in.ID, in.LeaseExpiresAt, now)
			}
			live++
		}
		if cursor = page.NextCursor; cursor == "" {
			break
		}
	}
	if live != fleet {
		t.Errorf("%d instances of web active, want the fleet's %d", live, fleet)
	}
	if n := plainCounter(t, s, "muster_lease_renewals_refused_total"); n != 0 {
		t.Errorf("muster_lease_renewals_refused_total %v, want 0", n)
	}
}

// TestRefusedRenewalIsKept: a renewal refused by the rate limit is kept
// and applied by the reaper's next sweep (FlushRefusedRenewals, before it
// looks for lapses), as a renewal made when it was refused: the lease that had
// lapsed runs on. A refused "renewal" by an identity that could not have
// renewed the instance (another service's workload) keeps nothing, nor
// does one with a sibling's credential, nor one older than a TTL; a
// refused batch is kept as its single renewals would be.
func TestRefusedRenewalIsKept(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	base := policy.Limit{Max: 1, Window: time.Hour}
	s := apptest.New(t, apptest.Options{Limits: server.Limits{LeaseRenewals: base}})
	s.Seed(t)
	leaveGrace(t, s)
	a, b := registerOnHost(t, s, 9000), registerOnHost(t, s, 9001)
	web, api := s.Token(t, webReq), s.Token(t, apiReq)
	renewA := func() apptest.Response {
		return s.DoWith(t, "PUT", "/v1/instances/"+a.ID.String()+"/lease", web, "", "", credentialHeader(a.Credential))
	}

	// web holds 2 leases: 1 + 2 renewals at once, then 429.
	for i := range 3 {
		if r := renewA(); r.Status != http.StatusOK {
			t.Fatalf("renewal %d: %d %s", i, r.Status, r.Body)
		}
	}
	renewedAt := s.Clock.Now()
	s.Clock.Advance(3 * time.Second) // under a token back: 4 a TTL (30 s) for each of 2 leases
	r := renewA()
	if r.Status != http.StatusTooManyRequests || !strings.Contains(r.Problem(t).Detail, "kept and will be applied") {
		t.Fatalf("renewal past the limit: %d %s", r.Status, r.Body)
	}
	refusedAt := s.Clock.Now()
	// b, with a's credential: refused too, and not b's.
	if r := s.DoWith(t, "PUT", "/v1/instances/"+b.ID.String()+"/lease", web, "", "", credentialHeader(a.Credential)); r.Status != http.StatusTooManyRequests {
		t.Fatalf("b's renewal with a's credential: %d %s", r.Status, r.Body)
	}
	// api's workload, another service's: its limit is its own (1, no
	// leases), and what it asks of web's instances is nothing it could
	// have renewed.
	for i, want := range []int{http.StatusNotFound, http.StatusTooManyRequests} {
		if r := s.Do(t, "PUT", "/v1/instances/"+b.ID.String()+"/lease", api, "", ""); r.Status != want {
			t.Fatalf("api's renewal %d of b: %d %s, want %d", i, r.Status, r.Body, want)
		}
	}
	// A refused batch is kept as its renewals would be.
	c := registerOnHost(t, s, 9002)
	r = s.JSON(t, "POST", "/v1/leases/renewals", web, fmt.Sprintf(`{"renewals":[{"instance_id":%q,"credential":%q}]}`, c.ID, c.Credential))
	if r.Status != http.StatusTooManyRequests {
		t.Fatalf("a batch past the limit: %d %s", r.Status, r.Body)
	}
	if n := s.Registry.RefusedRenewalsPending(); n != 4 {
		t.Fatalf("%d refused renewals kept, want 4 (a, b twice, c)", n)
	}

	// a's last renewal ran out; the refused one would not have.
	s.Clock.Advance(registry.DefaultLeaseTTL - 3*time.Second)
	if exp := *instanceState(t, s, a.ID).LeaseExpiresAt; !exp.Equal(renewedAt.Add(registry.DefaultLeaseTTL)) || exp.After(s.Clock.Now()) {
		t.Fatalf("a's lease runs to %s, want lapsed at %s", exp, renewedAt.Add(registry.DefaultLeaseTTL))
	}
	// The reaper's next sweep applies them before it looks for lapses.
	if n, err := s.Reaper.RunOnce(ctx); err != nil || n != 0 {
		t.Fatalf("the reaper's sweep: expired %d, %v; want none", n, err)
	}
	if got := *instanceState(t, s, a.ID).LeaseExpiresAt; !got.Equal(refusedAt.Add(registry.DefaultLeaseTTL)) {
		t.Fatalf("a's lease after the flush runs to %s, want %s (the refused renewal's)", got, refusedAt.Add(registry.DefaultLeaseTTL))
	}
	if got := *instanceState(t, s, b.ID).LeaseExpiresAt; got.After(s.Clock.Now()) {
		t.Fatalf("b's lease runs to %s: kept alive by renewals that could not have renewed it", got)
	}
	if s.Registry.RefusedRenewalsPending() != 0 {
		t.Fatal("refused renewals still kept after the flush")
	}
	m := string(s.Scrape(t))
	for _, want := range []string{
		"muster_lease_renewals_refused_total 4",
		`muster_lease_refused_renewals_total{result="renewed"} 2`,
		`muster_lease_refused_renewals_total{result="refused"} 1`,
		`muster_http_rate_limited_total{limit="lease_renewals"} 4`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %s:\n%s", want, grepMetric([]byte(m), "renewal"))
		}
	}

	// A refused renewal older than a TTL keeps nothing.
	s.Clock.Advance(time.Hour) // the buckets refill
	for i := 0; renewA().Status != http.StatusTooManyRequests; i++ {
		if i == 10 {
			t.Fatal("no renewal refused after 10 at once")
		}
	}
	s.Clock.Advance(registry.DefaultLeaseTTL)
	if n, err := s.Registry.FlushRefusedRenewals(ctx); err != nil || n != 0 {
		t.Fatalf("flush of a renewal refused a TTL ago: %d renewed, %v", n, err)
	}
}

// TestRenewalBatch: POST /v1/leases/renewals decides each lease as a
// single renewal does (the caller's own, with or without a credential it
// has not proven, refused with a sibling's, ended, someone else's or no
// such instance), answers per lease in order, audits the refused ones as
// single renewals are, and refuses a malformed batch whole, changing
// nothing.
func TestRenewalBatch(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.Seed(t)
	web, api, admin := s.Token(t, webReq), s.Token(t, apiReq), s.Token(t, adminReq)
	a, b, c, e := registerOnHost(t, s, 9000), registerOnHost(t, s, 9001), registerOnHost(t, s, 9002), registerOnHost(t, s, 9003)
	rd := s.JSON(t, "POST", "/v1/services/api/instances", api, `{"address":"127.0.0.1","port":9100,"zone":"az1"}`)
	if rd.Status != http.StatusCreated {
		t.Fatalf("register api: %d %s", rd.Status, rd.Body)
	}
	d := apptest.Decode[registry.Registered](t, rd)
	// e proves its credential; c ends.
	if r := s.DoWith(t, "PUT", "/v1/instances/"+e.ID.String()+"/lease", web, "", "", credentialHeader(e.Credential)); r.Status != http.StatusOK {
		t.Fatalf("e's renewal: %d %s", r.Status, r.Body)
	}
	if r := s.DoWith(t, "DELETE", "/v1/instances/"+c.ID.String(), web, "", "", credentialHeader(c.Credential)); r.Status != http.StatusNoContent {
		t.Fatalf("c deregisters: %d %s", r.Status, r.Body)
	}
	nobody := uuid.Must(uuid.NewV7())
	withoutBefore := plainCounter(t, s, "muster_lease_renewals_without_credential_total")

	s.Clock.Advance(10 * time.Second)
	body := fmt.Sprintf(`{"renewals":[
		{"instance_id":%q,"credential":%q},
		{"instance_id":%q},
		{"instance_id":%q,"credential":%q},
		{"instance_id":%q,"credential":%q},
		{"instance_id":%q},
		{"instance_id":%q}]}`,
		a.ID, a.Credential, b.ID, c.ID, c.Credential, e.ID, b.Credential, d.ID, nobody)
	r := s.JSON(t, "POST", "/v1/leases/renewals", web, body)
	if r.Status != http.StatusOK {
		t.Fatalf("batch: %d %s", r.Status, r.Body)
	}
	if r.Header.Get("RateLimit-Remaining") == "" {
		t.Errorf("batch answered without RateLimit-* headers: %v", r.Header)
	}
	res := apptest.Decode[struct {
		Results []registry.RenewalResult
		Renewed int
	}](t, r)
	want := []struct {
		id      uuid.UUID
		outcome string
	}{
		{a.ID, registry.RenewalRenewed}, {b.ID, registry.RenewalRenewed}, {c.ID, registry.RenewalEnded},
		{e.ID, registry.RenewalForbidden}, {d.ID, registry.RenewalNotFound}, {nobody, registry.RenewalNotFound},
	}
	if len(res.Results) != len(want) || res.Renewed != 2 {
		t.Fatalf("batch answered %+v", res)
	}
	expires := s.Clock.Now().Add(registry.DefaultLeaseTTL)
	for i, w := range want {
		got := res.Results[i]
		if got.InstanceID != w.id || got.Outcome != w.outcome {
			t.Errorf("result %d: %+v, want %s %s", i, got, w.id, w.outcome)
		}
		if renewed := got.Outcome == registry.RenewalRenewed; renewed != (got.LeaseExpiresAt != nil) || renewed == (got.Detail != "") {
			t.Errorf("result %d: %+v, want an expiry when renewed and a detail when not", i, got)
		}
	}
	if strings.Contains(string(r.Body), a.Credential) || strings.Contains(string(r.Body), b.Credential) {
		t.Errorf("the answer shows a credential: %s", r.Body)
	}
	for _, id := range []uuid.UUID{a.ID, b.ID} {
		if got := *instanceState(t, s, id).LeaseExpiresAt; !got.Equal(expires) {
			t.Errorf("instance %s: lease runs to %s, want %s", id, got, expires)
		}
	}
	if got := *instanceState(t, s, d.ID).LeaseExpiresAt; !got.Before(expires) {
		t.Errorf("api's instance renewed by web's batch: lease runs to %s", got)
	}
	if n := plainCounter(t, s, "muster_lease_renewals_without_credential_total"); n != withoutBefore+1 {
		t.Errorf("renewals without credential: %v, want %v (b)", n, withoutBefore+1)
	}
	// a proved its credential in the batch: a renewal without it is not a's.
	if r := s.Do(t, "PUT", "/v1/instances/"+a.ID.String()+"/lease", web, "", ""); r.Status != http.StatusForbidden {
		t.Errorf("a's renewal without its credential after the batch: %d %s", r.Status, r.Body)
	}

	// Refused renewals are audited as single ones are (not the instance
	// that does not exist), with no credential in them.
	for _, tc := range []struct {
		id   uuid.UUID
		want int
	}{{c.ID, 1}, {e.ID, 1}, {d.ID, 1}, {nobody, 0}, {a.ID, 1}, {b.ID, 0}} {
		ev := apptest.Decode[struct{ Items []audit.Event }](t, s.Do(t, "GET", "/v1/audit?action=lease.renew&outcome=refused&target="+tc.id.String(), admin, "", ""))
		if len(ev.Items) != tc.want {
			t.Errorf("refused renewals of %s audited: %d, want %d: %+v", tc.id, len(ev.Items), tc.want, ev.Items)
		}
		for _, e := range ev.Items {
			if e.Actor != "workload:web/web" || strings.Contains(e.Reason, a.Credential) || strings.Contains(e.Reason, b.Credential) {
				t.Errorf("refused renewal audit: %+v", e)
			}
		}
	}

	// Another identity: web's instances are none of its business, its own
	// is renewed. An operator of web's team renews web's.
	r = s.JSON(t, "POST", "/v1/leases/renewals", api, renewalsOf(a.ID, d.ID))
	if r.Status != http.StatusOK {
		t.Fatalf("api's batch: %d %s", r.Status, r.Body)
	}
	if res := apptest.Decode[struct{ Results []registry.RenewalResult }](t, r); res.Results[0].Outcome != registry.RenewalNotFound || res.Results[1].Outcome != registry.RenewalRenewed {
		t.Fatalf("api's batch: %+v", res)
	}
	r = s.JSON(t, "POST", "/v1/leases/renewals", s.Token(t, oscarReq), renewalsOf(b.ID, d.ID))
	if res := apptest.Decode[struct{ Results []registry.RenewalResult }](t, r); r.Status != http.StatusOK || res.Results[0].Outcome != registry.RenewalRenewed || res.Results[1].Outcome != registry.RenewalForbidden {
		t.Fatalf("oscar's batch: %d %s", r.Status, r.Body)
	}

	// A malformed batch is refused whole, as problem+json, and renews
	// nothing.
	s.Clock.Advance(5 * time.Second)
	before := *instanceState(t, s, b.ID).LeaseExpiresAt
	many := make([]uuid.UUID, registry.MaxRenewalBatch+1)
	many[0] = b.ID
	for i := 1; i < len(many); i++ {
		many[i] = uuid.Must(uuid.NewV7())
	}
	for _, tc := range []struct {
		name, ctype, body string
		status            int
		typ               string
	}{
		{"not JSON", "application/json", `{"renewals":[{"instance_id":"` + b.ID.String() + `"}`, http.StatusBadRequest, "malformed-json"},
		{"unknown field", "application/json", `{"renewals":[{"instance_id":"` + b.ID.String() + `","for":"60s"}]}`, http.StatusBadRequest, "unknown-field"},
		{"twice", "application/json", renewalsOf(b.ID, a.ID, b.ID), http.StatusUnprocessableEntity, "validation"},
		{"too many", "application/json", renewalsOf(many...), http.StatusUnprocessableEntity, "validation"},
		{"none", "application/json", `{"renewals":[]}`, http.StatusUnprocessableEntity, "validation"},
		{"not an id", "application/json", `{"renewals":[{"instance_id":"` + b.ID.String() + `"},{"instance_id":"web-1"}]}`, http.StatusUnprocessableEntity, "validation"},
		{"form", "application/x-www-form-urlencoded", "renewals=" + b.ID.String(), http.StatusUnsupportedMediaType, "unsupported-media-type"},
	} {
		r := s.DoWith(t, "POST", "/v1/leases/renewals", web, tc.ctype, tc.body, nil)
		if r.Status != tc.status || r.Problem(t).Type != server.ProblemBase+tc.typ {
			t.Errorf("%s: %d %s, want %d %s", tc.name, r.Status, r.Body, tc.status, tc.typ)
		}
	}
	if got := *instanceState(t, s, b.ID).LeaseExpiresAt; !got.Equal(before) {
		t.Errorf("b's lease moved from %s to %s on refused batches", before, got)
	}
}

// renewalsOf is a batch renewing ids without credentials.
func renewalsOf(ids ...uuid.UUID) string {
	items := make([]string, len(ids))
	for i, id := range ids {
		items[i] = `{"instance_id":"` + id.String() + `"}`
	}
	return `{"renewals":[` + strings.Join(items, ",") + `]}`
}
