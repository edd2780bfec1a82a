package server_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/devissuer"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/registry"
	"github.com/musterhq/muster/internal/stream"
)

// TestGrantsAndOwnersWrittenOutsideMusterGrantNothing (issue 25) plays a
// database administrator against the services and service_grants tables:
// a grant inserted by hand shows web to nobody new (watch, resolve, the
// database path, the grants listing); web's owner changed by hand to
// another team gives that team no authority over web (its contract and
// grants refused), while the team muster sealed keeps it; a replica
// started afresh, knowing no sealed owner, lets only admins change web.
// Each is alarmed. An admin's write through muster seals web again.
func TestGrantsAndOwnersWrittenOutsideMusterGrantNothing(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.Seed(t)
	ctx := t.Context()
	admin, oscar := s.Token(t, adminReq), s.Token(t, oscarReq)
	if r := s.JSON(t, "PUT", "/v1/services/checkout", admin, `{"owner":"shop","capabilities":[]}`); r.Status != http.StatusCreated {
		t.Fatalf("create checkout: %d %s", r.Status, r.Body)
	}
	s.Hub.Publish([]stream.Update{{View: frame(stream.KindView, "web", 0, 1)}})
	checkout := s.Token(t, devissuer.TokenRequest{Kind: identity.KindWorkload, Service: "checkout"})
	alarms := func() string {
		t.Helper()
		r := s.JSON(t, "GET", "/v1/alarms", oscar, "")
		if r.Status != http.StatusOK {
			t.Fatalf("alarms: %d %s", r.Status, r.Body)
		}
		return string(r.Body)
	}

	// 1. A grant inserted by hand.
	if _, err := s.Pool.Exec(ctx, `INSERT INTO service_grants (service, caller, granted_at, granted_by) VALUES ('web', 'checkout', now(), 'operator:oscar')`); err != nil {
		t.Fatal(err)
	}
	if err := s.Authz.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if r := s.Do(t, "GET", "/v1/resolve/web", checkout, "", ""); r.Status != http.StatusForbidden {
		t.Errorf("resolve under a grant inserted by hand: %d %s", r.Status, r.Body)
	}
	if res, _ := openWatch(t, s, checkout, "service=web"); res.StatusCode != http.StatusForbidden {
		t.Errorf("watch under a grant inserted by hand: %d", res.StatusCode)
	}
	checkoutWL := identity.Principal{Kind: identity.KindWorkload, Subject: "c-1", Service: "checkout"}
	if err := s.Registry.MayResolve(ctx, checkoutWL, "web"); err == nil {
		t.Error("the database path believes the grant inserted by hand")
	}
	if r := s.JSON(t, "GET", "/v1/services/web/grants", oscar, ""); !strings.Contains(string(r.Body), `"callers":[]`) {
		t.Errorf("web's grants list the one inserted by hand: %s", r.Body)
	}
	if a := alarms(); !strings.Contains(a, `"kind":"grant_unsealed"`) {
		t.Errorf("no grant_unsealed alarm: %s", a)
	}

	// 2. web's owner changed by hand from payments to search.
	if _, err := s.Pool.Exec(ctx, `UPDATE services SET owner = 'search' WHERE name = 'web'`); err != nil {
		t.Fatal(err)
	}
	if err := s.Authz.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	sam := s.Token(t, devissuer.TokenRequest{Kind: identity.KindOperator, Subject: "sam", Team: "search", Role: identity.RoleOperator})
	if r := s.JSON(t, "PUT", "/v1/services/web/contract", sam, `{"min_healthy_fraction":0.1}`); r.Status != http.StatusForbidden {
		t.Errorf("the contract of web by the team written in by hand: %d %s", r.Status, r.Body)
	}
	if r := s.JSON(t, "PUT", "/v1/services/web/grants", sam, `{"callers":["api"]}`); r.Status != http.StatusForbidden {
		t.Errorf("the grants of web by the team written in by hand: %d %s", r.Status, r.Body)
	}
	if r := s.JSON(t, "PUT", "/v1/services/web", sam, `{"owner":"search","capabilities":["probe","self","passive"]}`); r.Status != http.StatusForbidden {
		t.Errorf("web itself by the team written in by hand: %d %s", r.Status, r.Body)
	}
	if r := s.JSON(t, "GET", "/v1/services/web", oscar, ""); !strings.Contains(string(r.Body), `"owner":"payments"`) {
		t.Errorf("web's owner as muster shows it: %s", r.Body)
	}
	// payments, the owner muster sealed, keeps web.
	if r := s.JSON(t, "PUT", "/v1/services/web/contract", oscar, `{"min_healthy_fraction":0.6}`); r.Status != http.StatusOK {
		t.Errorf("the contract of web by its sealed owner: %d %s", r.Status, r.Body)
	}
	if a := alarms(); !strings.Contains(a, `"kind":"service_unsealed"`) {
		t.Errorf("no service_unsealed alarm: %s", a)
	}

	// 3. A replica started afresh knows no sealed owner of web: nobody
	// but an admin may change it, and readers keep their access.
	cold := newStackOn(t, s.Pool)
	if err := cold.Authz.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	samReq := devissuer.TokenRequest{Kind: identity.KindOperator, Subject: "sam", Team: "search", Role: identity.RoleOperator}
	for who, tok := range map[string]string{"sam": cold.Token(t, samReq), "oscar": cold.Token(t, oscarReq)} {
		if r := cold.JSON(t, "PUT", "/v1/services/web/grants", tok, `{"callers":["api"]}`); r.Status != http.StatusForbidden {
			t.Errorf("the grants of web by %s on a cold replica: %d %s", who, r.Status, r.Body)
		}
	}
	if ok, err := cold.Authz.ServiceExists("web"); !ok || err != nil {
		t.Errorf("web on the cold replica: %v %v", ok, err)
	}
	if !strings.Contains(alarmKinds(cold.Server.Alarms()), registry.AlarmServiceUnsealed) {
		t.Errorf("the cold replica raises no %s", registry.AlarmServiceUnsealed)
	}

	// An admin writes web through muster: sealed again, payments' again.
	if r := cold.JSON(t, "PUT", "/v1/services/web", cold.Token(t, adminReq), `{"owner":"payments","capabilities":["probe","self","passive"]}`); r.Status != http.StatusOK {
		t.Fatalf("admin rewrites web: %d %s", r.Status, r.Body)
	}
	if r := cold.JSON(t, "PUT", "/v1/services/web/grants", cold.Token(t, oscarReq), `{"callers":["api"]}`); r.Status != http.StatusOK {
		t.Errorf("the grants of web by payments after the admin's write: %d %s", r.Status, r.Body)
	}
	if err := s.Authz.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if a := alarms(); strings.Contains(a, `"kind":"service_unsealed"`) || strings.Contains(a, `"kind":"grant_unsealed"`) {
		t.Errorf("alarms after muster rewrote web and its grants: %s", a)
	}
}

func alarmKinds(alarms []assembler.Alarm) string {
	var out []string
	for _, a := range alarms {
		out = append(out, a.Kind)
	}
	return strings.Join(out, ",")
}

// TestAuthzReloadConfirmationIsForAdmins: POST
// /v1/authz/reload-confirmations is refused to an operator and without a
// reason, accepted from an admin, and every attempt is audited.
func TestAuthzReloadConfirmationIsForAdmins(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.Seed(t)
	const path = "/v1/authz/reload-confirmations"
	if r := s.JSON(t, "POST", path, s.Token(t, oscarReq), `{"reason":"the restore lost them"}`); r.Status != http.StatusForbidden {
		t.Errorf("an operator's confirmation: %d %s", r.Status, r.Body)
	}
	admin := s.Token(t, adminReq)
	if r := s.JSON(t, "POST", path, admin, `{"reason":" "}`); r.Status != http.StatusUnprocessableEntity {
		t.Errorf("a confirmation without a reason: %d %s", r.Status, r.Body)
	}
	if r := s.JSON(t, "POST", path, admin, `{"reason":"c1-c4 retired", "extra":1}`); r.Status != http.StatusBadRequest {
		t.Errorf("an unknown field: %d %s", r.Status, r.Body)
	}
	r := s.JSON(t, "POST", path, admin, `{"reason":"c1-c4 were retired with the old cluster"}`)
	if r.Status != http.StatusCreated || !strings.Contains(string(r.Body), `"confirmed_by":"operator:alice"`) {
		t.Fatalf("an admin's confirmation: %d %s", r.Status, r.Body)
	}
	a := s.JSON(t, "GET", "/v1/audit?action=authz.reload.confirm", admin, "")
	if got := strings.Count(string(a.Body), `"action":"authz.reload.confirm"`); got != 3 {
		t.Errorf("%d audited confirmation attempts, want 3 (refused, invalid, accepted): %s", got, a.Body)
	}
}
