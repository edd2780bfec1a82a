package app_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/evaluator"
)

// TestQuarantineIsListedInAlarms: a flap quarantine in force is an open
// alarm like the others: GET /v1/alarms lists it (kind
// instance_quarantined, with its service, zone, instance and flap
// history) and muster_alarms_open counts it, which the alert rules read;
// when the quarantine ends both drop it.
func TestQuarantineIsListedInAlarms(t *testing.T) {
	t.Parallel()
	st := apptest.New(t, apptest.Options{})
	ids, until, probe := flapUntilQuarantined(t, st)
	token := st.Token(t, apptest.Admin)
	list := func() []assembler.Alarm {
		t.Helper()
		r := st.Do(t, "GET", "/v1/alarms", token, "", "")
		if r.Status != http.StatusOK {
			t.Fatalf("GET /v1/alarms: %d %s", r.Status, r.Body)
		}
		var out []assembler.Alarm
		for _, a := range apptest.Decode[struct{ Alarms []assembler.Alarm }](t, r).Alarms {
			if a.Kind == evaluator.AlarmInstanceQuarantined {
				out = append(out, a)
			}
		}
		return out
	}
	const gauge = `muster_alarms_open{kind="instance_quarantined"} 1`
	qs := list()
	if len(qs) != 1 {
		t.Fatalf("GET /v1/alarms lists %d quarantines, want 1: %+v", len(qs), qs)
	}
	if q := qs[0]; q.Service != "web" || q.Zone != "az1" || q.Instance != ids[0] || !strings.Contains(q.Detail, "flap history:") || q.Since.IsZero() {
		t.Fatalf("the quarantine is listed as %+v", q)
	}
	if !strings.Contains(string(st.Scrape(t)), gauge) {
		t.Fatalf("muster_alarms_open does not count the quarantine (%s)", gauge)
	}

	st.Clock.Set(until().Add(time.Second))
	probe("success", ids...)
	if qs := list(); len(qs) != 0 {
		t.Fatalf("the quarantine ended and is still listed: %+v", qs)
	}
	if strings.Contains(string(st.Scrape(t)), `kind="instance_quarantined"`) {
		t.Fatal("muster_alarms_open still counts the ended quarantine")
	}
}
