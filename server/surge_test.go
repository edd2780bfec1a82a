package server_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/registry"
)

// A surge deploy through the real stack (issue 12): web (a probe service)
// has 2 instances serving in az1 when 3 more register. The new ones are
// not capacity until each succeeds: nothing trips, no alarm opens, the
// view keeps the 2 and says 5 are registered; the first new one to
// succeed enters at the slow start's first step and ramps.
func TestSurgeDeployTripsNothing(t *testing.T) {
	t.Parallel()
	s := apptest.New(t, apptest.Options{})
	s.Seed(t)
	oscar := s.Token(t, apptest.Operator)
	register := func(n int) string {
		t.Helper()
		r := s.JSON(t, "POST", "/v1/services/web/instances", oscar, fmt.Sprintf(`{"address":"10.0.0.%d","port":8080,"zone":"az1"}`, n))
		if r.Status != http.StatusCreated {
			t.Fatalf("register: %d %s", r.Status, r.Body)
		}
		return apptest.Decode[registry.Instance](t, r).ID.String()
	}
	if r := s.JSON(t, "PUT", "/v1/services/web/grants", oscar, `{"callers":["api"]}`); r.Status != http.StatusOK {
		t.Fatalf("grant: %d %s", r.Status, r.Body)
	}
	publish := func() {
		s.Publisher.RunOnce()
		s.Clock.Advance(assembler.DefaultMaxAdditionWindow + time.Second)
		s.Publisher.RunOnce()
	}
	type view struct {
		Endpoints []struct {
			InstanceID string  `json:"instance_id"`
			Weight     float64 `json:"weight"`
			State      string  `json:"state"`
		} `json:"endpoints"`
		Zones map[string]assembler.ZoneStatus `json:"zones"`
	}
	resolve := func() view {
		t.Helper()
		r := s.Do(t, "GET", "/v1/resolve/web", s.Token(t, apptest.API), "", "")
		if r.Status != http.StatusOK {
			t.Fatalf("resolve: %d %s", r.Status, r.Body)
		}
		var v view
		if err := json.Unmarshal(r.Body, &v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	alarms := func() string {
		r := s.Do(t, "GET", "/v1/alarms", oscar, "", "")
		if r.Status != http.StatusOK {
			t.Fatalf("alarms: %d %s", r.Status, r.Body)
		}
		return string(r.Body)
	}

	// A brand-new service: nothing routable, no alarm.
	ready := []string{register(1), register(2)}
	if err := s.Evaluator.SyncNow(t.Context()); err != nil {
		t.Fatal(err)
	}
	s.Evaluator.EvaluateNow()
	publish()
	if v := resolve(); len(v.Endpoints) != 0 || v.Zones["az1"].Guard != "ok" || v.Zones["az1"].Registered != 2 {
		t.Fatalf("a new service before any success: %+v", v)
	}
	if a := alarms(); strings.Contains(a, "fraction_guard") || strings.Contains(a, "last_instance") {
		t.Fatalf("alarms for a service that never had capacity: %s", a)
	}

	s.Admit(t, ready...)
	publish()
	if v := resolve(); len(v.Endpoints) != 2 {
		t.Fatalf("after the first successes: %+v", v)
	}

	surge := []string{register(3), register(4), register(5)}
	if err := s.Evaluator.SyncNow(t.Context()); err != nil {
		t.Fatal(err)
	}
	s.Evaluator.EvaluateNow()
	publish()
	v := resolve()
	if z := v.Zones["az1"]; z.Guard != "ok" || z.Eligible != 2 || z.Total != 2 || z.Registered != 5 || len(v.Endpoints) != 2 {
		t.Fatalf("during the surge: zone %+v, %d endpoints; want ok, 2 of 2 counted, 5 registered, 2 published", z, len(v.Endpoints))
	}
	if a := alarms(); strings.Contains(a, "fraction_guard") {
		t.Fatalf("a surge deploy raised an alarm: %s", a)
	}

	s.Admit(t, surge[0])
	publish()
	v = resolve()
	var w float64
	for _, e := range v.Endpoints {
		if e.InstanceID == surge[0] {
			w = e.Weight
		}
	}
	if len(v.Endpoints) != 3 || !(w > 0 && w < 1) {
		t.Fatalf("after the first new instance succeeds: %+v; want 3 published, the new one ramping (0 < weight < 1), got %v", v, w)
	}
}
