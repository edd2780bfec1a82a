package reconcile_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/devissuer"
	"github.com/musterhq/muster/internal/disbelief"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/reconcile"
	"github.com/musterhq/muster/internal/registry"
)

// diffStack is muster as serve builds it (app), reconciling one snapshot
// file of web: i-1 and i-2 in service, i-3 never ready (a startup
// failure); and one instance of web registered by hand that no source
// knows (a leak).
func diffStack(t *testing.T) (*apptest.Stack, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "web.json")
	writeAtomic(t, path, `{"instances":[
		{"id":"i-1","service":"web","address":"10.6.0.1","port":8080,"zone":"az1"},
		{"id":"i-2","service":"web","address":"10.6.0.2","port":8080,"zone":"az1"},
		{"id":"i-3","service":"web","address":"10.6.0.3","port":8080,"zone":"az1","ready":false}]}`)
	src, err := reconcile.NewSnapshotSource(reconcile.SnapshotConfig{Name: "fleet", File: path})
	if err != nil {
		t.Fatal(err)
	}
	st := apptest.New(t, apptest.Options{UI: true, Reconcile: reconcile.Config{Sources: []reconcile.Source{src}}})
	st.Seed(t)
	admin := st.Token(t, apptest.Admin)
	r := st.JSON(t, "POST", "/v1/services/web/instances", admin, `{"address":"10.6.9.9","port":8080,"zone":"az1"}`)
	if r.Status != http.StatusCreated {
		t.Fatalf("register the leak: %d %s", r.Status, r.Body)
	}
	w, ok := st.Reconcile.Worker("snapshot/fleet")
	if !ok {
		t.Fatal("no worker for snapshot/fleet")
	}
	if err := w.RunOnce(t.Context()); err != nil {
		t.Fatal(err)
	}
	return st, path
}

// TestDiffAPI: the diff lists the startup failure and the leak, and the
// metrics count them per kind.
func TestDiffAPI(t *testing.T) {
	t.Parallel()
	st, _ := diffStack(t)
	admin := st.Token(t, apptest.Admin)
	r := st.Do(t, "GET", "/v1/reconcile/diff", admin, "", "")
	if r.Status != http.StatusOK {
		t.Fatalf("diff: %d %s", r.Status, r.Body)
	}
	d := apptest.Decode[reconcile.Diff](t, r)
	if d.Counts[reconcile.DiffMissing] != 1 || d.Counts[reconcile.DiffLeak] != 1 || len(d.Items) != 2 {
		t.Fatalf("diff = %+v; want one missing, one leak", d)
	}
	miss, leak := d.Items[1], d.Items[0] // "registered" sorts before "snapshot/fleet"
	if miss.Kind != reconcile.DiffMissing || miss.Key != "i-3" || !strings.Contains(miss.Detail, "startup failure") {
		t.Errorf("missing item = %+v", miss)
	}
	if leak.Kind != reconcile.DiffLeak || leak.Address != "10.6.9.9" || leak.Source != "registered" || !strings.Contains(leak.Detail, "registration leak") {
		t.Errorf("leak item = %+v", leak)
	}
	metrics := string(st.Scrape(t))
	for _, m := range []string{
		`muster_reconcile_diff{kind="missing",source="snapshot/fleet"} 1`,
		`muster_reconcile_diff{kind="leak",source="registered"} 1`,
	} {
		if !strings.Contains(metrics, m) {
			t.Errorf("metrics lack %s", m)
		}
	}
	// Estate-wide: a workload may not read it.
	if r := st.Do(t, "GET", "/v1/reconcile/diff", st.Token(t, apptest.Web), "", ""); r.Status != http.StatusForbidden {
		t.Errorf("diff as a workload: %d, want 403", r.Status)
	}
}

// TestRegistrationCollidesWithReconciled: registering an endpoint a
// reconciled instance holds is refused with the reason, and changes
// nothing.
func TestRegistrationCollidesWithReconciled(t *testing.T) {
	t.Parallel()
	st, _ := diffStack(t)
	tok := st.Token(t, devissuer.TokenRequest{Kind: identity.KindWorkload, Service: "web", Addresses: []string{"10.6.0.1"}})
	r := st.JSON(t, "POST", "/v1/services/web/instances", tok, `{"address":"10.6.0.1","port":8080,"zone":"az1"}`)
	if r.Status != http.StatusConflict {
		t.Fatalf("register over a reconciled instance: %d %s, want 409", r.Status, r.Body)
	}
	p := r.Problem(t)
	if !strings.HasSuffix(p.Type, "/reconciled-endpoint") || !strings.Contains(p.Detail, "reconciled from snapshot/fleet") {
		t.Fatalf("problem = %+v", p)
	}
	ins, err := st.Registry.ReconciledInstances(t.Context(), "snapshot/fleet")
	if err != nil || len(ins) != 2 {
		t.Fatalf("reconciled instances after the refusal: %d %v, want 2", len(ins), err)
	}
	if ins[0].State != registry.StateActive || ins[1].State != registry.StateActive {
		t.Fatalf("a refused registration changed a reconciled instance: %+v", ins)
	}
}

// TestConfirmAPI: a hold is confirmed by an operator through the API;
// a workload's attempt and a viewer's are refused, and all three are
// audited.
func TestConfirmAPI(t *testing.T) {
	t.Parallel()
	st, path := diffStack(t)
	// Three more instances, then all five vanish but one: held.
	writeAtomic(t, path, snapshotJSON(5, 1))
	w, _ := st.Reconcile.Worker("snapshot/fleet")
	if err := w.RunOnce(t.Context()); err != nil {
		t.Fatal(err)
	}
	writeAtomic(t, path, snapshotJSON(1, 1))
	if err := w.RunOnce(t.Context()); err != nil {
		t.Fatal(err)
	}
	if h := w.Status().Hold; h == nil || h.Lacking < 4 {
		t.Fatalf("status %+v, want a hold", w.Status())
	}
	admin := st.Token(t, apptest.Admin)
	al := st.Do(t, "GET", "/v1/alarms", admin, "", "")
	if !strings.Contains(string(al.Body), `"kind":"removal_held"`) || !strings.Contains(string(al.Body), "reconcile/snapshot/fleet") {
		t.Fatalf("alarms: %s", al.Body)
	}
	url := "/v1/reconcile/sources/snapshot/fleet/confirm"
	body := `{"reason":"the fleet was scaled in by the ASG"}`
	if r := st.JSON(t, "POST", url, st.Token(t, apptest.Web), body); r.Status != http.StatusForbidden {
		t.Fatalf("confirm as a workload: %d %s", r.Status, r.Body)
	}
	if r := st.JSON(t, "POST", url, st.Token(t, apptest.Viewer), body); r.Status != http.StatusForbidden {
		t.Fatalf("confirm as a viewer: %d %s", r.Status, r.Body)
	}
	if r := st.JSON(t, "POST", url, st.Token(t, apptest.Operator), `{"reason":" "}`); r.Status != http.StatusUnprocessableEntity {
		t.Fatalf("confirm without a reason: %d %s", r.Status, r.Body)
	}
	if r := st.JSON(t, "POST", "/v1/reconcile/sources/snapshot/nope/confirm", st.Token(t, apptest.Operator), body); r.Status != http.StatusNotFound {
		t.Fatalf("confirm an unknown source: %d %s", r.Status, r.Body)
	}
	r := st.JSON(t, "POST", url, st.Token(t, apptest.Operator), body)
	if r.Status != http.StatusCreated {
		t.Fatalf("confirm: %d %s", r.Status, r.Body)
	}
	st.Clock.Advance(1e9)
	if err := w.RunOnce(t.Context()); err != nil {
		t.Fatal(err)
	}
	if ins, _ := st.Registry.ReconciledInstances(t.Context(), "snapshot/fleet"); len(ins) != 1 || w.Status().Hold != nil {
		t.Fatalf("after confirmation: %d live, hold %+v; want 1, none", len(ins), w.Status().Hold)
	}
	a := st.Do(t, "GET", "/v1/audit?action=reconcile.confirm", admin, "", "")
	if a.Status != http.StatusOK {
		t.Fatalf("audit: %d %s", a.Status, a.Body)
	}
	got := string(a.Body)
	if strings.Count(got, `"outcome":"refused"`) != 3 || strings.Count(got, `"outcome":"accepted"`) != 1 || !strings.Contains(got, "operator:oscar") {
		t.Fatalf("audit of reconcile.confirm: %s", got)
	}
}

// fleetStack is diffStack with its worker and a function that runs one
// pass of it.
func fleetStack(t *testing.T) (*apptest.Stack, string, *reconcile.Worker, func()) {
	t.Helper()
	st, path := diffStack(t)
	w, _ := st.Reconcile.Worker("snapshot/fleet")
	return st, path, w, func() {
		t.Helper()
		if err := w.RunOnce(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
}

// mixedSnapshot is a snapshot of web instances i-w1… (owned by payments)
// and api instances i-a1… (owned by search).
func mixedSnapshot(web, api int) string {
	var rows []string
	for i := 1; i <= web; i++ {
		rows = append(rows, fmt.Sprintf(`{"id":"i-w%d","service":"web","address":"10.7.0.%d","port":8080,"zone":"az1"}`, i, i))
	}
	for i := 1; i <= api; i++ {
		rows = append(rows, fmt.Sprintf(`{"id":"i-a%d","service":"api","address":"10.7.1.%d","port":8080,"zone":"az1"}`, i, i))
	}
	return `{"instances":[` + strings.Join(rows, ",") + `]}`
}

// TestConfirmNeedsTheOwnersOfWhatIsHeld: a source spans teams, so an
// operator vouches only for removals of services their team owns. A hold
// of web (payments) and api (search) is refused to payments' operator and
// to search's, each told which services are not theirs, and all refusals
// are audited; an admin's confirmation releases it. Before, any operator
// of any team could end another team's instances through this door.
func TestConfirmNeedsTheOwnersOfWhatIsHeld(t *testing.T) {
	t.Parallel()
	st, path, w, run := fleetStack(t)
	writeAtomic(t, path, mixedSnapshot(5, 5))
	run()
	writeAtomic(t, path, mixedSnapshot(3, 3)) // 4 of 10 gone: held
	run()
	if h := w.Status().Hold; h == nil || h.Lacking != 4 {
		t.Fatalf("status %+v, want a hold lacking 4", w.Status())
	}
	url := "/v1/reconcile/sources/snapshot/fleet/confirm"
	body := `{"reason":"both teams scaled in"}`
	sam := devissuer.TokenRequest{Kind: identity.KindOperator, Subject: "sam", Team: "search", Role: identity.RoleOperator}
	for _, c := range []struct {
		who       string
		tok       string
		notTheirs string
	}{
		{"payments' operator", st.Token(t, apptest.Operator), "api (owned by search)"},
		{"search's operator", st.Token(t, sam), "web (owned by payments)"},
	} {
		r := st.JSON(t, "POST", url, c.tok, body)
		if r.Status != http.StatusForbidden || !strings.Contains(string(r.Body), c.notTheirs) || r.Header.Get("Content-Type") != "application/problem+json" {
			t.Fatalf("confirm as %s: %d %s, want 403 naming %s", c.who, r.Status, r.Body, c.notTheirs)
		}
	}
	run()
	if ins, _ := st.Registry.ReconciledInstances(t.Context(), "snapshot/fleet"); len(ins) != 10 || w.Status().Hold == nil {
		t.Fatalf("after refused confirmations: %d live, hold %+v; want 10, held", len(ins), w.Status().Hold)
	}
	admin := st.Token(t, apptest.Admin)
	r := st.JSON(t, "POST", url, admin, body)
	if r.Status != http.StatusCreated {
		t.Fatalf("confirm as admin: %d %s", r.Status, r.Body)
	}
	c := apptest.Decode[registry.ReconcileConfirmation](t, r)
	if len(c.Instances) != 4 || strings.Join(c.Services, ",") != "api,web" {
		t.Fatalf("confirmation %+v, want 4 instances of api and web", c)
	}
	st.Clock.Advance(1e9)
	run()
	if ins, _ := st.Registry.ReconciledInstances(t.Context(), "snapshot/fleet"); len(ins) != 6 || w.Status().Hold != nil {
		t.Fatalf("after the admin's confirmation: %d live, hold %+v; want 6, none", len(ins), w.Status().Hold)
	}
	// Nothing is held now: a confirmation would vouch for nothing.
	if r := st.JSON(t, "POST", url, admin, body); r.Status != http.StatusConflict {
		t.Fatalf("confirm with nothing held: %d %s, want 409", r.Status, r.Body)
	}
	a := st.Do(t, "GET", "/v1/audit?action=reconcile.confirm", admin, "", "")
	got := string(a.Body)
	if strings.Count(got, `"outcome":"refused"`) != 3 || strings.Count(got, `"outcome":"accepted"`) != 1 || !strings.Contains(got, "operator:sam") {
		t.Fatalf("audit of reconcile.confirm: %s", got)
	}
}

// TestConfirmationCoversOnlyWhatWasHeld: a confirmation names the
// instances held when it was given. Absences the hold gains afterwards
// are held until confirmed again, so an operator's word for three
// instances is never taken for a fourth.
func TestConfirmationCoversOnlyWhatWasHeld(t *testing.T) {
	t.Parallel()
	st, path, w, run := fleetStack(t)
	writeAtomic(t, path, mixedSnapshot(10, 0))
	run()
	writeAtomic(t, path, mixedSnapshot(7, 0)) // 3 of 10 gone: held
	run()
	url := "/v1/reconcile/sources/snapshot/fleet/confirm"
	if r := st.JSON(t, "POST", url, st.Token(t, apptest.Operator), `{"reason":"scaled in"}`); r.Status != http.StatusCreated {
		t.Fatalf("confirm: %d %s", r.Status, r.Body)
	}
	writeAtomic(t, path, mixedSnapshot(6, 0)) // one more gone before the next pass
	st.Clock.Advance(1e9)
	run()
	ins, _ := st.Registry.ReconciledInstances(t.Context(), "snapshot/fleet")
	if h := w.Status().Hold; len(ins) != 10 || h == nil || h.Lacking != 4 {
		t.Fatalf("after the hold grew: %d live, hold %+v; want 10 live, held lacking 4", len(ins), h)
	}
	if r := st.JSON(t, "POST", url, st.Token(t, apptest.Operator), `{"reason":"scaled in further"}`); r.Status != http.StatusCreated {
		t.Fatalf("confirm again: %d %s", r.Status, r.Body)
	}
	st.Clock.Advance(1e9)
	run()
	if ins, _ := st.Registry.ReconciledInstances(t.Context(), "snapshot/fleet"); len(ins) != 6 || w.Status().Hold != nil {
		t.Fatalf("after the second confirmation: %d live, hold %+v; want 6, none", len(ins), w.Status().Hold)
	}
}

// TestAServiceDrainedWithinASourceIsHeld: through the worker, the
// registry and the API. A snapshot of 20 web and 3 api instances that
// suddenly lacks every api instance lacks 13% of itself, under the
// threshold, and was believed: api was drained by one reading. Now api's
// absences are held and alarmed while web's ordinary churn goes ahead,
// and the team that owns api (search) can confirm them on its own.
func TestAServiceDrainedWithinASourceIsHeld(t *testing.T) {
	t.Parallel()
	st, path, w, run := fleetStack(t)
	writeAtomic(t, path, mixedSnapshot(20, 3))
	run()
	writeAtomic(t, path, mixedSnapshot(19, 0))
	run()
	h := w.Status().Hold
	if h == nil || h.Lacking != 3 || strings.Join(h.Services, ",") != "api" {
		t.Fatalf("hold %+v, want api's 3 held", h)
	}
	if ins, _ := st.Registry.ReconciledInstances(t.Context(), "snapshot/fleet"); len(ins) != 22 {
		t.Fatalf("%d live, want 22 (web's one absence believed, api's three held)", len(ins))
	}
	admin := st.Token(t, apptest.Admin)
	al := st.Do(t, "GET", "/v1/alarms", admin, "", "")
	if !strings.Contains(string(al.Body), "3 of 3 instances in service api would be removed at once") {
		t.Fatalf("alarms: %s", al.Body)
	}
	sam := devissuer.TokenRequest{Kind: identity.KindOperator, Subject: "sam", Team: "search", Role: identity.RoleOperator}
	if r := st.JSON(t, "POST", "/v1/reconcile/sources/snapshot/fleet/confirm", st.Token(t, sam), `{"reason":"api moved to the new cluster"}`); r.Status != http.StatusCreated {
		t.Fatalf("confirm as search's operator: %d %s", r.Status, r.Body)
	}
	st.Clock.Advance(1e9)
	run()
	if ins, _ := st.Registry.ReconciledInstances(t.Context(), "snapshot/fleet"); len(ins) != 19 || w.Status().Hold != nil {
		t.Fatalf("after confirmation: %d live, hold %+v; want 19, none", len(ins), w.Status().Hold)
	}
}

// TestEmptyReadingHeldUntilConfirmed (issue 26): a snapshot exporter
// starts writing a valid, empty list and keeps writing it for 10 minutes.
// Nothing ends, however often the empty reading repeats; the view keeps
// every instance; the hold is on GET /v1/removal-holds with one
// removal_held alarm; a workload and a viewer cannot confirm it (refused,
// audited); an operator of the owning team can, and only then do the
// instances end. Before, a second empty reading 2 minutes later was
// believed and every instance ended.
func TestEmptyReadingHeldUntilConfirmed(t *testing.T) {
	t.Parallel()
	st, path, w, pass := fleetStack(t)
	admin := st.Token(t, apptest.Admin)
	writeAtomic(t, path, snapshotJSON(5, 1))
	pass()
	view := func() int {
		t.Helper()
		st.Evaluator.EvaluateNow()
		st.Publisher.RunOnce()
		st.Clock.Advance(assembler.DefaultAdditionWindow + 100*time.Millisecond)
		st.Publisher.RunOnce()
		r := st.Do(t, "GET", "/v1/resolve/web", st.Token(t, apptest.Web), "", "")
		if r.Status != http.StatusOK {
			t.Fatalf("resolve web: %d %s", r.Status, r.Body)
		}
		n := 0
		for _, e := range apptest.Decode[assembler.View](t, r).Endpoints {
			if strings.HasPrefix(e.Address, "10.4.0.") {
				n++
			}
		}
		return n
	}
	if n := view(); n != 5 {
		t.Fatalf("before: %d reconciled endpoints in the view, want 5", n)
	}

	writeAtomic(t, path, `{"instances":[]}`)
	start := st.Clock.Now()
	for minute := 0; minute <= 10; minute++ {
		pass()
		if ins, _ := st.Registry.ReconciledInstances(t.Context(), "snapshot/fleet"); len(ins) != 5 {
			t.Fatalf("minute %d of the empty reading: %d live, want 5", minute, len(ins))
		}
		if n := view(); n != 5 {
			t.Fatalf("minute %d of the empty reading: %d reconciled endpoints in the view, want 5", minute, n)
		}
		st.Clock.Advance(time.Minute - assembler.DefaultAdditionWindow - 100*time.Millisecond)
	}
	if !st.Clock.Now().After(start.Add(10 * time.Minute)) {
		t.Fatalf("the loop covered %s, want over 10 minutes", st.Clock.Now().Sub(start))
	}

	r := st.Do(t, "GET", "/v1/removal-holds", admin, "", "")
	if r.Status != http.StatusOK {
		t.Fatalf("removal holds: %d %s", r.Status, r.Body)
	}
	var holds struct {
		Holds []disbelief.Hold `json:"holds"`
	}
	if err := json.Unmarshal(r.Body, &holds); err != nil {
		t.Fatal(err)
	}
	if len(holds.Holds) != 1 || holds.Holds[0].Gate != "reconcile/snapshot/fleet" || holds.Holds[0].Scope.String() != "source snapshot/fleet" ||
		holds.Holds[0].Held != 5 || !holds.Holds[0].Since.Equal(start) || !strings.Contains(holds.Holds[0].Detail, "no endpoints at all") {
		t.Fatalf("removal holds: %s", r.Body)
	}
	if got := alarmsOf(t, st, disbelief.AlarmRemovalHeld); len(got) != 1 {
		t.Fatalf("removal_held alarms: %v, want one", got)
	}

	url := "/v1/removal-holds/confirmations"
	body := `{"gate":"reconcile/snapshot/fleet","scope":"source snapshot/fleet","reason":"the fleet was retired"}`
	for _, who := range []devissuer.TokenRequest{apptest.Web, apptest.Viewer} {
		if r := st.JSON(t, "POST", url, st.Token(t, who), body); r.Status != http.StatusForbidden {
			t.Fatalf("confirm as %s: %d %s", who.Subject, r.Status, r.Body)
		}
	}
	for _, bad := range []string{
		`{"gate":"reconcile/snapshot/fleet","scope":"galaxy far","reason":"x"}`,
		`{"gate":"nonsense","scope":"region","reason":"x"}`,
		`{"gate":"reconcile/snapshot/fleet","scope":"zone az1","reason":"x"}`,
	} {
		if r := st.JSON(t, "POST", url, st.Token(t, apptest.Operator), bad); r.Status != http.StatusUnprocessableEntity || r.Header.Get("Content-Type") != "application/problem+json" {
			t.Fatalf("confirm %s: %d %s", bad, r.Status, r.Body)
		}
	}
	pass()
	if ins, _ := st.Registry.ReconciledInstances(t.Context(), "snapshot/fleet"); len(ins) != 5 {
		t.Fatalf("after refused confirmations: %d live, want 5", len(ins))
	}
	if r := st.JSON(t, "POST", url, st.Token(t, apptest.Operator), body); r.Status != http.StatusCreated {
		t.Fatalf("confirm as the owning team's operator: %d %s", r.Status, r.Body)
	}
	st.Clock.Advance(time.Second)
	pass()
	if ins, _ := st.Registry.ReconciledInstances(t.Context(), "snapshot/fleet"); len(ins) != 0 || w.Status().Hold != nil {
		t.Fatalf("after confirmation: %d live, hold %+v; want 0, none", len(ins), w.Status().Hold)
	}
	a := st.Do(t, "GET", "/v1/audit?action=reconcile.confirm", admin, "", "")
	if got := string(a.Body); strings.Count(got, `"outcome":"refused"`) != 2 || strings.Count(got, `"outcome":"accepted"`) != 1 {
		t.Fatalf("audit of reconcile.confirm: %s", got)
	}
}

// alarmsOf lists the details of the open alarms of kind.
func alarmsOf(t *testing.T, st *apptest.Stack, kind string) []string {
	t.Helper()
	r := st.Do(t, "GET", "/v1/alarms", st.Token(t, apptest.Admin), "", "")
	if r.Status != http.StatusOK {
		t.Fatalf("alarms: %d %s", r.Status, r.Body)
	}
	var out []string
	for _, a := range apptest.Decode[struct {
		Alarms []assembler.Alarm `json:"alarms"`
	}](t, r).Alarms {
		if a.Kind == kind {
			out = append(out, a.Detail)
		}
	}
	return out
}
