package server_test

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/disbelief"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/registry"
)

// TestLeaseExpirySuppressedOverHTTP: 20% of the region's leases stop
// renewing together. Expiry is held, GET /v1/alarms and GET
// /v1/leases/expiry say so with the numbers, an ordinary token cannot
// release it (refused and audited), and an admin's confirmation does.
func TestLeaseExpirySuppressedOverHTTP(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := apptest.New(t, apptest.Options{})
	s.Seed(t)
	adminP := identity.Principal{Kind: identity.KindOperator, Subject: "alice", Role: identity.RoleAdmin}
	var ins []registry.Instance
	for i := range 20 {
		in, err := s.Registry.Register(ctx, adminP, netip.Addr{}, "api", registry.Registration{Address: fmt.Sprintf("10.0.0.%d", i+1), Port: 80, Zone: "az1"})
		if err != nil {
			t.Fatal(err)
		}
		ins = append(ins, in)
	}
	for range 6 {
		s.Clock.Advance(10 * time.Second)
		for _, in := range ins[4:] { // four of twenty (20%) stop
			if _, err := s.Registry.Renew(ctx, adminP, in.ID); err != nil {
				t.Fatal(err)
			}
		}
		if n, err := s.Reaper.RunOnce(ctx); err != nil || n != 0 {
			t.Fatalf("reaper: expired %d, %v", n, err)
		}
	}
	admin, viewer, web := s.Token(t, apptest.Admin), s.Token(t, apptest.Viewer), s.Token(t, apptest.Web)

	alarms := apptest.Decode[struct {
		Alarms []struct{ Kind, Service, Detail string }
	}](t, s.Do(t, "GET", "/v1/alarms", admin, "", ""))
	var found bool
	for _, a := range alarms.Alarms {
		if a.Kind == disbelief.AlarmRemovalHeld && strings.Contains(a.Detail, "lease-expiry: 4 of 20 leases in region") {
			found = true
		}
	}
	if !found {
		t.Fatalf("no removal_held alarm with the numbers: %+v", alarms)
	}
	st := apptest.Decode[struct {
		Grace bool
		Holds []disbelief.Hold
	}](t, s.Do(t, "GET", "/v1/leases/expiry", viewer, "", ""))
	if st.Grace || len(st.Holds) != 1 || st.Holds[0].Held != 4 || st.Holds[0].Scope.Kind != disbelief.Region {
		t.Fatalf("GET /v1/leases/expiry: %+v", st)
	}
	all := apptest.Decode[struct {
		LeaseGrace bool `json:"lease_grace"`
		Holds      []disbelief.Hold
	}](t, s.Do(t, "GET", "/v1/removal-holds", viewer, "", ""))
	if len(all.Holds) != 1 || all.Holds[0].Gate != "lease-expiry" || len(all.Holds[0].Instances) != 4 {
		t.Fatalf("GET /v1/removal-holds: %+v", all)
	}
	if r := s.Do(t, "GET", "/v1/leases/expiry", web, "", ""); r.Status != http.StatusForbidden {
		t.Fatalf("a workload reads lease expiry: %d", r.Status)
	}

	const path = "/v1/leases/expiry-confirmations"
	for _, tc := range []struct {
		tok, body string
		want      int
	}{
		{web, `{"reason":"x"}`, http.StatusForbidden},
		{viewer, `{"reason":"x"}`, http.StatusForbidden},
		{admin, `{"reason":""}`, http.StatusUnprocessableEntity},
		{admin, `{"reason":"x","extra":1}`, http.StatusBadRequest},
		{admin, `{"service":"Not A Name","reason":"x"}`, http.StatusBadRequest},
		{admin, `{"service":"nope","reason":"x"}`, http.StatusNotFound},
	} {
		if r := s.JSON(t, "POST", path, tc.tok, tc.body); r.Status != tc.want {
			t.Errorf("POST %s %s: %d %s, want %d", path, tc.body, r.Status, r.Body, tc.want)
		}
	}
	if n, _ := s.Reaper.RunOnce(ctx); n != 0 {
		t.Fatalf("refused confirmations released %d", n)
	}
	r := s.JSON(t, "POST", path, admin, `{"reason":"the az1 batch hosts were decommissioned"}`)
	if r.Status != http.StatusCreated {
		t.Fatalf("confirm: %d %s", r.Status, r.Body)
	}
	if c := apptest.Decode[registry.Confirmation](t, r); c.Released != 4 || c.ConfirmedBy != adminP.String() {
		t.Fatalf("confirmation %+v", c)
	}
	if n, err := s.Reaper.RunOnce(ctx); err != nil || n != 4 {
		t.Fatalf("after the confirmation: expired %d, %v", n, err)
	}
	evs := apptest.Decode[struct{ Items []audit.Event }](t, s.Do(t, "GET", "/v1/audit?action=lease.expiry.confirm", admin, "", ""))
	var refused, accepted int
	for _, e := range evs.Items {
		switch e.Outcome {
		case audit.Refused:
			refused++
		case audit.Accepted:
			accepted++
		}
	}
	if refused < 3 || accepted != 1 {
		t.Fatalf("audited confirmations: %d refused, %d accepted: %+v", refused, accepted, evs.Items)
	}
}
