package server_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/evaluator"
	"github.com/musterhq/muster/internal/registry"
	"github.com/musterhq/muster/internal/wait"
)

// Instance credentials (issue 25): every instance of a service on one
// host shares the address, so an instance proves itself with the
// credential its registration returned, not with the address alone.

// registerOnHost registers an instance of web from 127.0.0.1 (the test's
// host, shared by every instance registered here) as web's workload and
// returns what the registration answered.
func registerOnHost(t *testing.T, s *stack, port int) registry.Registered {
	t.Helper()
	r := s.JSON(t, "POST", "/v1/services/web/instances", s.Token(t, webReq), fmt.Sprintf(`{"address":"127.0.0.1","port":%d,"zone":"az1"}`, port))
	if r.Status != http.StatusCreated {
		t.Fatalf("register 127.0.0.1:%d: %d %s", port, r.Status, r.Body)
	}
	if cc := r.Header.Get("Cache-Control"); cc != "no-store" {
		t.Errorf("registration Cache-Control %q, want no-store", cc)
	}
	return apptest.Decode[registry.Registered](t, r)
}

// credentialHeader is the header presenting secret.
func credentialHeader(secret string) http.Header {
	h := http.Header{}
	h.Set(registry.CredentialHeader, secret)
	return h
}

// plainCounter reads an unlabelled counter from the stack's metrics.
func plainCounter(t *testing.T, s *stack, name string) float64 {
	t.Helper()
	mfs, err := s.Metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no counter %s", name)
	return 0
}

// TestRegistrationReturnsCredentialOnce: a workload's registration answers
// with a 256-bit credential, different per instance; PostgreSQL holds its
// SHA-256 and nowhere the secret (not the instance row, not the audit
// log), and reading the instance back does not show it. An operator's
// declared endpoint gets none.
func TestRegistrationReturnsCredentialOnce(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.Seed(t)
	a, b := registerOnHost(t, s, 9000), registerOnHost(t, s, 9001)
	for _, reg := range []registry.Registered{a, b} {
		raw, err := base64.RawURLEncoding.DecodeString(reg.Credential)
		if err != nil || len(raw) != 32 {
			t.Fatalf("credential %q: %d bytes, %v; want 32 bytes of base64url", reg.Credential, len(raw), err)
		}
	}
	if a.Credential == b.Credential {
		t.Fatal("two instances got the same credential")
	}

	ctx := context.Background()
	for _, reg := range []registry.Registered{a, b} {
		var hash []byte
		var row string
		if err := s.Pool.QueryRow(ctx, "SELECT credential_hash, row_to_json(i)::text FROM instances i WHERE id = $1", reg.ID).Scan(&hash, &row); err != nil {
			t.Fatal(err)
		}
		if want := sha256.Sum256([]byte(reg.Credential)); !bytes.Equal(hash, want[:]) {
			t.Errorf("instance %s: stored hash %x, want the credential's SHA-256 %x", reg.ID, hash, want)
		}
		if strings.Contains(row, reg.Credential) {
			t.Errorf("the instance row holds the credential: %s", row)
		}
		if r := s.Do(t, "GET", "/v1/instances/"+reg.ID.String(), s.Token(t, adminReq), "", ""); r.Status != http.StatusOK || bytes.Contains(r.Body, []byte(reg.Credential)) || bytes.Contains(r.Body, []byte(`"credential"`)) {
			t.Errorf("GET instance: %d %s", r.Status, r.Body)
		}
	}
	var auditText string
	if err := s.Pool.QueryRow(ctx, "SELECT coalesce(string_agg(row_to_json(e)::text, ''), '') FROM audit_events e").Scan(&auditText); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(auditText, a.ID.String()) {
		t.Fatal("the registrations are not in the audit log")
	}
	if strings.Contains(auditText, a.Credential) || strings.Contains(auditText, b.Credential) {
		t.Error("the audit log holds a credential")
	}

	// An operator declaring an endpoint: no credential, and no hash.
	r := s.JSON(t, "POST", "/v1/services/web/instances", s.Token(t, oscarReq), `{"address":"10.7.0.1","port":8080,"zone":"az1"}`)
	if r.Status != http.StatusCreated || bytes.Contains(r.Body, []byte(`"credential"`)) {
		t.Fatalf("operator's registration: %d %s", r.Status, r.Body)
	}
	var n int
	if err := s.Pool.QueryRow(ctx, "SELECT count(*) FROM instances WHERE id = $1 AND credential_hash IS NULL",
		apptest.Decode[registry.Instance](t, r).ID).Scan(&n); err != nil || n != 1 {
		t.Fatalf("declared endpoint's hash: %d rows without one, %v", n, err)
	}
}

// TestSiblingDeregistrationIsNotSelf: two instances of web on one host
// (127.0.0.1, the same workload identity). Neither can deregister the
// other as itself, with no credential or with its own: the attempt goes
// to the override checks, where a workload is refused (403, audited);
// the other's removal is an operator's override, under the budget (409,
// kept for a co-signer). Each deregisters itself at once with its own
// credential, even where an operator's deregistration is over budget.
func TestSiblingDeregistrationIsNotSelf(t *testing.T) {
	t.Parallel()
	f := newOverrideFixture(t, apptest.Options{}, map[string]int{"az1": 3})
	a, b := registerOnHost(t, f.Stack, 9000), registerOnHost(t, f.Stack, 9001)
	f.Admit(t, a.ID.String(), b.ID.String())
	// 5 in rotation in az1: removing any one leaves 0.8, below 0.9.
	f.setMinFraction(t, 0.9)
	web := f.Token(t, webReq)
	ida := a.ID.String()

	// b, without a credential (an old client, or a sibling that does not
	// have a's): not a.
	m := wantProblem(t, f.deregisterWith(t, web, ida, "", nil), http.StatusForbidden, "forbidden")
	if detail, _ := m["detail"].(string); m["check"] != "authorization" || !strings.Contains(detail, "presented none") || !strings.Contains(detail, registry.CredentialHeader) {
		t.Errorf("deregistration without a credential: %v", m)
	}
	// b with its own credential: still not a.
	m = wantProblem(t, f.deregisterWith(t, web, ida, "a is broken, trust me", credentialHeader(b.Credential)), http.StatusForbidden, "forbidden")
	if detail, _ := m["detail"].(string); m["check"] != "authorization" || !strings.Contains(detail, "presented another instance's") {
		t.Errorf("deregistration with a sibling's credential: %v", m)
	}
	// A credential that is no instance's at all.
	wantProblem(t, f.deregisterWith(t, web, ida, "", credentialHeader("not-a-credential")), http.StatusForbidden, "forbidden")
	evs := deregisterEvents(t, f.Stack, ida)
	if len(evs) != 3 {
		t.Fatalf("audit events about a: %+v", evs)
	}
	for i, ev := range evs {
		if ev.Outcome != audit.Refused || ev.Actor != "workload:web/web" || decisionOf(t, ev).Check != "authorization" {
			t.Errorf("event %d: %s %s %s", i, ev.Outcome, ev.Actor, ev.Reason)
		}
		if strings.Contains(string(ev.Before), b.Credential) || strings.Contains(string(ev.After), b.Credential) || strings.Contains(ev.Reason, b.Credential) {
			t.Errorf("event %d holds the credential", i)
		}
	}
	if st := f.instanceState(t, ida); st != registry.StateActive {
		t.Fatalf("a is %s after its sibling's attempts", st)
	}

	// The way to remove a without a is an override, and the budget holds:
	// over it, the deregistration waits for a co-signer.
	m = wantProblem(t, f.deregister(t, f.Token(t, oscarReq), ida, "a misbehaves on host 127.0.0.1: INC-4"), http.StatusConflict, "budget-exceeded")
	if m["override_id"] == nil {
		t.Errorf("budget refusal not kept for a co-signer: %v", m)
	}
	if st := f.instanceState(t, ida); st != registry.StateActive {
		t.Fatalf("a is %s after a refused override", st)
	}

	// Each instance deregisters itself with its own credential, at once.
	for _, reg := range []registry.Registered{a, b} {
		if r := f.deregisterWith(t, web, reg.ID.String(), "", credentialHeader(reg.Credential)); r.Status != http.StatusNoContent {
			t.Fatalf("%s deregistering itself: %d %s", reg.ID, r.Status, r.Body)
		}
		if st := f.instanceState(t, reg.ID.String()); st != registry.StateDeregistered {
			t.Fatalf("%s is %s after deregistering itself", reg.ID, st)
		}
		evs := deregisterEvents(t, f.Stack, reg.ID.String())
		if last := evs[len(evs)-1]; last.Outcome != audit.Accepted || last.Actor != "workload:web/web" {
			t.Errorf("self-deregistration audit: %+v", last)
		}
	}
	verifyAudit(t, f.Stack)
}

// TestSiblingSelfReportIsNotTheInstances: a self-report about an instance
// with a credential counts only with that credential. Its sibling on the
// same host, with its own credential or none, reporting hard failures
// about it is refused not_own_instance (and audited) and the instance
// stays in rotation; the instance's own hard failure, with its
// credential, takes it out.
func TestSiblingSelfReportIsNotTheInstances(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.Seed(t)
	a, b := registerOnHost(t, s, 9000), registerOnHost(t, s, 9001)
	s.Admit(t, a.ID.String(), b.ID.String())
	web := s.Token(t, webReq)
	state := func(id uuid.UUID) string {
		t.Helper()
		r := s.Do(t, "GET", "/v1/services/web/eligibility", s.Token(t, adminReq), "", "")
		for _, v := range apptest.Decode[evaluator.ServiceEligibility](t, r).Instances {
			if v.InstanceID == id {
				return v.State
			}
		}
		t.Fatalf("no verdict for %s", id)
		return ""
	}
	if st := state(a.ID); st != "eligible" {
		t.Fatalf("a after admission: %s", st)
	}
	failures := make([]string, 20)
	for i := range failures {
		failures[i] = selfReport(a.ID, "hard_failure")
	}
	for name, h := range map[string]http.Header{"no credential": nil, "the sibling's credential": credentialHeader(b.Credential)} {
		res := postReportsWith(t, s, web, h, failures...)
		if res.Accepted != 0 || len(res.Refused) != len(failures) {
			t.Fatalf("%s: %+v", name, res)
		}
		for _, r := range res.Refused {
			if r.Code != "not_own_instance" || strings.Contains(r.Reason, b.Credential) {
				t.Fatalf("%s: refusal %+v", name, r)
			}
		}
	}
	s.Evaluator.EvaluateNow()
	if st := state(a.ID); st != "eligible" {
		t.Fatalf("a is %s after its sibling's reports", st)
	}
	// The sibling's own reports about itself, in the same batch as one
	// about a, count for it only.
	res := postReportsWith(t, s, web, credentialHeader(b.Credential), selfReport(b.ID, "success"), selfReport(a.ID, "hard_failure"))
	if res.Accepted != 1 || len(res.Refused) != 1 || res.Refused[0].Index != 1 {
		t.Fatalf("mixed batch: %+v", res)
	}

	// On the audit record, by the sibling.
	wait.For(t, 10*time.Second, "the refused self-reports summarised in the audit log", func() bool {
		s.Refusals.RunOnce(context.Background(), false)
		r := s.Do(t, "GET", "/v1/audit?action=evidence.report&outcome=refused&limit=50", s.Token(t, adminReq), "", "")
		for _, e := range apptest.Decode[struct{ Items []audit.Event }](t, r).Items {
			if e.Actor == "workload:web/web" && e.Target == a.ID.String() && strings.Contains(e.Reason, "not_own_instance") {
				return true
			}
		}
		return false
	})

	// a's own report, with its credential, is its self-evidence.
	if res := postReportsWith(t, s, web, credentialHeader(a.Credential), selfReport(a.ID, "hard_failure")); res.Accepted != 1 {
		t.Fatalf("a's own report: %+v", res)
	}
	s.Evaluator.EvaluateNow()
	if st := state(a.ID); st != "ineligible" {
		t.Fatalf("a after its own hard failure: %s", st)
	}
}

// TestRenewalCredential: a renewal without the credential (a client from
// before credentials) still renews, counted; a sibling's credential is
// refused; once the instance has renewed with its own credential, a
// renewal without one is refused, and audited. An operator renews as
// before.
func TestRenewalCredential(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.Seed(t)
	a, b := registerOnHost(t, s, 9000), registerOnHost(t, s, 9001)
	web := s.Token(t, webReq)
	lease := "/v1/instances/" + a.ID.String() + "/lease"
	renew := func(h http.Header) apptest.Response {
		t.Helper()
		return s.DoWith(t, "PUT", lease, web, "", "", h)
	}
	before := plainCounter(t, s, "muster_lease_renewals_without_credential_total")

	// Old-style: no credential. The lease is renewed.
	s.Clock.Advance(20 * time.Second)
	r := renew(nil)
	if r.Status != http.StatusOK {
		t.Fatalf("renewal without a credential: %d %s", r.Status, r.Body)
	}
	if got := apptest.Decode[registry.Instance](t, r).LeaseExpiresAt; !got.Equal(s.Clock.Now().Add(30 * time.Second).Truncate(time.Microsecond)) {
		t.Fatalf("lease after an old-style renewal: %s", got)
	}
	if n := plainCounter(t, s, "muster_lease_renewals_without_credential_total"); n != before+1 {
		t.Errorf("renewals without credential: %v, want %v", n, before+1)
	}

	// A sibling's credential is not a's.
	r = renew(credentialHeader(b.Credential))
	if r.Status != http.StatusForbidden || r.Header.Get("Content-Type") != "application/problem+json" || !strings.Contains(r.Problem(t).Detail, "is not instance "+a.ID.String()) {
		t.Fatalf("renewal with the sibling's credential: %d %s", r.Status, r.Body)
	}

	// a's own credential: renewed; from then on a needs it.
	if r := renew(credentialHeader(a.Credential)); r.Status != http.StatusOK {
		t.Fatalf("renewal with the credential: %d %s", r.Status, r.Body)
	}
	r = renew(nil)
	if r.Status != http.StatusForbidden || !strings.Contains(r.Problem(t).Detail, "renewed with its credential before") {
		t.Fatalf("renewal without the credential after one with it: %d %s", r.Status, r.Body)
	}
	if r := renew(credentialHeader(a.Credential)); r.Status != http.StatusOK {
		t.Fatalf("renewal with the credential again: %d %s", r.Status, r.Body)
	}
	// b, never renewed with its credential, still renews without.
	if r := s.Do(t, "PUT", "/v1/instances/"+b.ID.String()+"/lease", web, "", ""); r.Status != http.StatusOK {
		t.Fatalf("b's old-style renewal: %d %s", r.Status, r.Body)
	}
	// An operator is no sibling.
	if r := s.Do(t, "PUT", lease, s.Token(t, oscarReq), "", ""); r.Status != http.StatusOK {
		t.Fatalf("operator's renewal: %d %s", r.Status, r.Body)
	}

	ev := apptest.Decode[struct{ Items []audit.Event }](t, s.Do(t, "GET", "/v1/audit?action=lease.renew&outcome=refused&target="+a.ID.String(), s.Token(t, adminReq), "", ""))
	if len(ev.Items) != 2 {
		t.Fatalf("refused renewals audited: %+v", ev.Items)
	}
	for _, e := range ev.Items {
		if e.Actor != "workload:web/web" || strings.Contains(e.Reason, a.Credential) || strings.Contains(e.Reason, b.Credential) {
			t.Errorf("refused renewal audit: %+v", e)
		}
	}
}
