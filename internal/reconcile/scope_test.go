package reconcile_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/devissuer"
	"github.com/musterhq/muster/internal/disbelief"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/reconcile"
	"github.com/musterhq/muster/internal/registry"
)

// sam operates search, the team that owns api (apptest.Seed); oscar
// (apptest.Operator) operates payments, which owns web.
var sam = devissuer.TokenRequest{Kind: identity.KindOperator, Subject: "sam", Team: "search", Role: identity.RoleOperator}

// threeServices is a snapshot of web instances i-w… (10.7.0.x), api
// instances i-a… (10.7.1.x) and db instances i-d… (10.7.2.x): db is large
// enough that losing every web and api instance is under the source's
// threshold, so web and api are each held on their own.
func threeServices(web, api, db int) string {
	var rows []string
	for i := 1; i <= web; i++ {
		rows = append(rows, fmt.Sprintf(`{"id":"i-w%d","service":"web","address":"10.7.0.%d","port":8080,"zone":"az1"}`, i, i))
	}
	for i := 1; i <= api; i++ {
		rows = append(rows, fmt.Sprintf(`{"id":"i-a%d","service":"api","address":"10.7.1.%d","port":8080,"zone":"az1"}`, i, i))
	}
	for i := 1; i <= db; i++ {
		rows = append(rows, fmt.Sprintf(`{"id":"i-d%d","service":"db","address":"10.7.2.%d","port":8080,"zone":"az1"}`, i, i))
	}
	return `{"instances":[` + strings.Join(rows, ",") + `]}`
}

// scopeStack is muster reconciling snapshot/fleet of web (payments), api
// (search) and db (storage): 5, 3 and 40 instances, then a reading that
// lacks every web and api instance, so both are held.
func scopeStack(t *testing.T, opts apptest.Options, path string) (*apptest.Stack, *reconcile.Worker) {
	t.Helper()
	src, err := reconcile.NewSnapshotSource(reconcile.SnapshotConfig{Name: "fleet", File: path})
	if err != nil {
		t.Fatal(err)
	}
	opts.Reconcile = reconcile.Config{Sources: []reconcile.Source{src}}
	st := apptest.New(t, opts)
	w, ok := st.Reconcile.Worker("snapshot/fleet")
	if !ok {
		t.Fatal("no worker for snapshot/fleet")
	}
	return st, w
}

// holdScopes lists GET /v1/removal-holds as "gate scope held" lines.
func holdScopes(t *testing.T, st *apptest.Stack) []string {
	t.Helper()
	r := st.Do(t, "GET", "/v1/removal-holds", st.Token(t, apptest.Admin), "", "")
	if r.Status != http.StatusOK {
		t.Fatalf("removal holds: %d %s", r.Status, r.Body)
	}
	var out []string
	for _, h := range apptest.Decode[struct {
		Holds []disbelief.Hold `json:"holds"`
	}](t, r).Holds {
		out = append(out, fmt.Sprintf("%s %s %d", h.Gate, h.Scope, h.Held))
	}
	return out
}

// TestConfirmOneServiceOfASource: web (payments) and api (search) are
// both held in snapshot/fleet. A confirmation of "service web" by
// payments' operator releases web's five held removals only: api's three
// stay held and routed, the answer and the audit row name the gate, the
// scope and what it released and left held. search's operator may not
// confirm web (403 naming web's team, audited with the scope asked for);
// malformed scopes, another source's scope and a service the source does
// not hold are refused as problems and change nothing. Before, the
// confirmation of web ended api's instances too, the audit row named only
// the source, and payments could not confirm web at all while api was
// held (403 naming api).
func TestConfirmOneServiceOfASource(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "fleet.json")
	writeAtomic(t, path, threeServices(5, 3, 40))
	st, w := scopeStack(t, apptest.Options{}, path)
	st.Seed(t)
	admin := st.Token(t, apptest.Admin)
	if r := st.JSON(t, "PUT", "/v1/services/db", admin, `{"owner":"storage","capabilities":["passive"]}`); r.Status != http.StatusCreated {
		t.Fatalf("create db: %d %s", r.Status, r.Body)
	}
	run := func() {
		t.Helper()
		if err := w.RunOnce(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	live := func() map[string]int {
		t.Helper()
		ins, err := st.Registry.ReconciledInstances(t.Context(), "snapshot/fleet")
		if err != nil {
			t.Fatal(err)
		}
		n := map[string]int{}
		for _, in := range ins {
			n[in.Service]++
		}
		return n
	}
	// routed counts the endpoints of svc's view at prefix, as its own
	// workload resolves it.
	routed := func(svc string, tok devissuer.TokenRequest, prefix string) int {
		t.Helper()
		st.Evaluator.EvaluateNow()
		st.Publisher.RunOnce()
		st.Clock.Advance(assembler.DefaultAdditionWindow + 100*time.Millisecond)
		st.Publisher.RunOnce()
		r := st.Do(t, "GET", "/v1/resolve/"+svc, st.Token(t, tok), "", "")
		if r.Status != http.StatusOK {
			t.Fatalf("resolve %s: %d %s", svc, r.Status, r.Body)
		}
		n := 0
		for _, e := range apptest.Decode[assembler.View](t, r).Endpoints {
			if strings.HasPrefix(e.Address, prefix) {
				n++
			}
		}
		return n
	}
	run()
	if n := live(); n["web"] != 5 || n["api"] != 3 || n["db"] != 40 {
		t.Fatalf("live %v, want 5 web, 3 api, 40 db", n)
	}
	if a, wb := routed("api", apptest.API, "10.7.1."), routed("web", apptest.Web, "10.7.0."); a != 3 || wb != 5 {
		t.Fatalf("before: api routes to %d, web to %d; want 3 and 5", a, wb)
	}
	writeAtomic(t, path, threeServices(0, 0, 40))
	run()
	if got, want := holdScopes(t, st), []string{"reconcile/snapshot/fleet service api 3", "reconcile/snapshot/fleet service web 5"}; !slices.Equal(got, want) {
		t.Fatalf("holds %q, want %q", got, want)
	}
	st.Clock.Advance(time.Minute)

	const url = "/v1/removal-holds/confirmations"
	confirm := func(tok devissuer.TokenRequest, scope string) apptest.Response {
		t.Helper()
		body, err := json.Marshal(map[string]string{"gate": "reconcile/snapshot/fleet", "scope": scope, "reason": "web moved to the new cluster"})
		if err != nil {
			t.Fatal(err)
		}
		return st.JSON(t, "POST", url, st.Token(t, tok), string(body))
	}
	// Bad input: a problem, nothing recorded, nothing released.
	for _, c := range []struct {
		scope  string
		status int
		says   string
	}{
		{"service web api", http.StatusUnprocessableEntity, "not one word"},
		{"service Web!", http.StatusUnprocessableEntity, "not a service name"},
		{"source snapshot/other", http.StatusUnprocessableEntity, "another source"},
		{"zone az1", http.StatusUnprocessableEntity, "not in a zone"},
		{"service nosuch", http.StatusNotFound, "no service named nosuch"},
		{"service db", http.StatusConflict, "holds no removals in service db (it holds only api (3), web (5))"},
	} {
		tok := apptest.Admin
		r := confirm(tok, c.scope)
		if r.Status != c.status || r.Header.Get("Content-Type") != "application/problem+json" || !strings.Contains(string(r.Body), c.says) {
			t.Fatalf("confirm %q: %d %s; want %d saying %q", c.scope, r.Status, r.Body, c.status, c.says)
		}
	}
	// search's operator may not vouch for payments' service, however the
	// hold is scoped.
	r := confirm(sam, "service web")
	if r.Status != http.StatusForbidden || !strings.Contains(string(r.Body), "web (owned by payments)") {
		t.Fatalf("search's operator confirms web: %d %s; want 403 naming web's team", r.Status, r.Body)
	}
	run()
	if n := live(); n["web"] != 5 || n["api"] != 3 {
		t.Fatalf("after refused confirmations: live %v, want 5 web and 3 api", n)
	}

	// payments' operator (not an admin) confirms web: web only.
	r = confirm(apptest.Operator, "service web")
	if r.Status != http.StatusCreated {
		t.Fatalf("payments' operator confirms web: %d %s", r.Status, r.Body)
	}
	c := apptest.Decode[registry.ReconcileConfirmation](t, r)
	if c.Gate != "reconcile/snapshot/fleet" || c.Scope.String() != "service web" || c.Released != 5 || len(c.Instances) != 5 ||
		c.ReleasedByService["web"] != 5 || c.StillHeld["api"] != 3 || len(c.StillHeld) != 1 || !slices.Equal(c.Services, []string{"web"}) {
		t.Fatalf("confirmation %+v; want gate, scope service web, 5 of web released, api's 3 still held", c)
	}
	st.Clock.Advance(time.Second)
	run()
	if n := live(); n["web"] != 0 || n["api"] != 3 || n["db"] != 40 {
		t.Fatalf("after web's confirmation: live %v, want web's 5 ended, api's 3 and db's 40 kept", n)
	}
	if got, want := holdScopes(t, st), []string{"reconcile/snapshot/fleet service api 3"}; !slices.Equal(got, want) {
		t.Fatalf("holds after web's confirmation %q, want %q", got, want)
	}
	if a, wb := routed("api", apptest.API, "10.7.1."), routed("web", apptest.Web, "10.7.0."); a != 3 || wb != 0 {
		t.Fatalf("after web's confirmation: api routes to %d, web to %d; want 3 and 0", a, wb)
	}
	// Passes go on: api stays held, however often the reading repeats.
	for range 3 {
		st.Clock.Advance(time.Minute)
		run()
	}
	if n := live(); n["api"] != 3 {
		t.Fatalf("api after more passes: %d live, want 3", n["api"])
	}
	// Web holds nothing now: confirming it again vouches for nothing.
	if r := confirm(apptest.Operator, "service web"); r.Status != http.StatusConflict {
		t.Fatalf("confirm web again: %d %s, want 409", r.Status, r.Body)
	}

	// The audit: the refusal and the acceptance each name the gate and
	// the scope asked for; the acceptance what it released and left held.
	a := st.Do(t, "GET", "/v1/audit?action=reconcile.confirm", admin, "", "")
	if a.Status != http.StatusOK {
		t.Fatalf("audit: %d %s", a.Status, a.Body)
	}
	type record struct {
		Gate              string          `json:"gate"`
		Scope             json.RawMessage `json:"scope"`
		Released          int             `json:"released"`
		ReleasedByService map[string]int  `json:"released_by_service"`
		StillHeld         map[string]int  `json:"still_held"`
	}
	var refusedSam, acceptedOscar *record
	for _, ev := range apptest.Decode[struct{ Items []audit.Event }](t, a).Items {
		var rec record
		if err := json.Unmarshal(ev.After, &rec); err != nil {
			t.Fatalf("audit row %d: %v: %s", ev.Seq, err, ev.After)
		}
		switch {
		case ev.Actor == "operator:sam" && ev.Outcome == audit.Refused:
			refusedSam = &rec
		case ev.Actor == "operator:oscar" && ev.Outcome == audit.Accepted:
			acceptedOscar = &rec
		}
	}
	if refusedSam == nil || refusedSam.Gate != "reconcile/snapshot/fleet" || string(refusedSam.Scope) != `"service web"` || refusedSam.Released != 5 || refusedSam.StillHeld["api"] != 3 {
		t.Fatalf("audit of search's refused confirmation: %+v; want gate, scope service web, 5 asked for, api's 3 outside: %s", refusedSam, a.Body)
	}
	if acceptedOscar == nil || acceptedOscar.Gate != "reconcile/snapshot/fleet" || string(acceptedOscar.Scope) != `{"kind":"service","name":"web"}` ||
		acceptedOscar.Released != 5 || acceptedOscar.ReleasedByService["web"] != 5 || acceptedOscar.StillHeld["api"] != 3 {
		t.Fatalf("audit of payments' confirmation: %+v: %s", acceptedOscar, a.Body)
	}

	// search's operator confirms api, its own: the hold ends.
	if r := confirm(sam, "service api"); r.Status != http.StatusCreated {
		t.Fatalf("search's operator confirms api: %d %s", r.Status, r.Body)
	}
	st.Clock.Advance(time.Second)
	run()
	if n := live(); n["api"] != 0 || n["db"] != 40 || w.Status().Hold != nil {
		t.Fatalf("after api's confirmation: live %v, hold %+v; want api ended, db kept, no hold", n, w.Status().Hold)
	}
}

// TestSourceConfirmationStillNeedsEveryOwner: a confirmation of the
// source as a whole (no scope, or the source's own) still needs
// authority over every service it releases: payments' operator is
// refused naming api, and an admin's releases both.
func TestSourceConfirmationStillNeedsEveryOwner(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "fleet.json")
	writeAtomic(t, path, threeServices(5, 3, 40))
	st, w := scopeStack(t, apptest.Options{}, path)
	st.Seed(t)
	if r := st.JSON(t, "PUT", "/v1/services/db", st.Token(t, apptest.Admin), `{"owner":"storage","capabilities":["passive"]}`); r.Status != http.StatusCreated {
		t.Fatalf("create db: %d %s", r.Status, r.Body)
	}
	if err := w.RunOnce(t.Context()); err != nil {
		t.Fatal(err)
	}
	writeAtomic(t, path, threeServices(0, 0, 40))
	if err := w.RunOnce(t.Context()); err != nil {
		t.Fatal(err)
	}
	st.Clock.Advance(time.Minute)
	for _, scope := range []string{"", "source snapshot/fleet"} {
		r := st.JSON(t, "POST", "/v1/removal-holds/confirmations", st.Token(t, apptest.Operator),
			fmt.Sprintf(`{"gate":"reconcile/snapshot/fleet","scope":%q,"reason":"scaled in"}`, scope))
		if r.Status != http.StatusForbidden || !strings.Contains(string(r.Body), "api (owned by search)") {
			t.Fatalf("payments' operator confirms the source (scope %q): %d %s; want 403 naming api", scope, r.Status, r.Body)
		}
	}
	r := st.JSON(t, "POST", "/v1/removal-holds/confirmations", st.Token(t, apptest.Admin), `{"gate":"reconcile/snapshot/fleet","scope":"","reason":"scaled in"}`)
	if r.Status != http.StatusCreated {
		t.Fatalf("the admin confirms the source: %d %s", r.Status, r.Body)
	}
	if c := apptest.Decode[registry.ReconcileConfirmation](t, r); c.Scope.String() != "source snapshot/fleet" || c.Released != 8 || len(c.StillHeld) != 0 {
		t.Fatalf("confirmation %+v; want the source, 8 released", c)
	}
	st.Clock.Advance(time.Second)
	if err := w.RunOnce(t.Context()); err != nil {
		t.Fatal(err)
	}
	if ins, _ := st.Registry.ReconciledInstances(t.Context(), "snapshot/fleet"); len(ins) != 40 || w.Status().Hold != nil {
		t.Fatalf("after the admin's confirmation: %d live, hold %+v; want 40, none", len(ins), w.Status().Hold)
	}
}

// TestServiceConfirmationOnEveryReplica: two replicas read the same
// source and hold the same removals; web's team confirms web on the
// replica that does not apply the source. The owner of the source's
// shard ends web's instances only, and both replicas then hold api alone
// (each applies the confirmation, read from the database, to its own
// hold).
func TestServiceConfirmationOnEveryReplica(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "fleet.json")
	writeAtomic(t, path, threeServices(5, 3, 40))
	a, wa := scopeStack(t, apptest.Options{}, path)
	a.Seed(t)
	if r := a.JSON(t, "PUT", "/v1/services/db", a.Token(t, apptest.Admin), `{"owner":"storage","capabilities":["passive"]}`); r.Status != http.StatusCreated {
		t.Fatalf("create db: %d %s", r.Status, r.Body)
	}
	b, wb := scopeStack(t, apptest.Options{Pool: a.Pool}, path) // the newest: it owns every shard
	pass := func() {
		t.Helper()
		for _, w := range []*reconcile.Worker{wb, wa} {
			if err := w.RunOnce(t.Context()); err != nil {
				t.Fatal(err)
			}
		}
	}
	pass()
	if wa.Status().Applying || !wb.Status().Applying {
		t.Fatalf("applying: a %v, b %v; want b alone", wa.Status().Applying, wb.Status().Applying)
	}
	writeAtomic(t, path, threeServices(0, 0, 40))
	pass()
	held := []string{"reconcile/snapshot/fleet service api 3", "reconcile/snapshot/fleet service web 5"}
	for name, st := range map[string]*apptest.Stack{"a": a, "b": b} {
		if got := holdScopes(t, st); !slices.Equal(got, held) {
			t.Fatalf("replica %s holds %q, want %q", name, got, held)
		}
		st.Clock.Advance(time.Minute)
	}
	r := a.JSON(t, "POST", "/v1/removal-holds/confirmations", a.Token(t, apptest.Operator), `{"gate":"reconcile/snapshot/fleet","scope":"service web","reason":"web moved"}`)
	if r.Status != http.StatusCreated {
		t.Fatalf("confirm web on the replica not applying: %d %s", r.Status, r.Body)
	}
	a.Clock.Advance(time.Second)
	b.Clock.Advance(time.Second)
	pass()
	ins, err := a.Registry.ReconciledInstances(t.Context(), "snapshot/fleet")
	if err != nil {
		t.Fatal(err)
	}
	n := map[string]int{}
	for _, in := range ins {
		n[in.Service]++
	}
	if n["web"] != 0 || n["api"] != 3 || n["db"] != 40 {
		t.Fatalf("after web's confirmation: live %v; want web's 5 ended by the owner, api's 3 kept", n)
	}
	for name, st := range map[string]*apptest.Stack{"a": a, "b": b} {
		if got, want := holdScopes(t, st), []string{"reconcile/snapshot/fleet service api 3"}; !slices.Equal(got, want) {
			t.Fatalf("replica %s holds %q after web's confirmation, want %q", name, got, want)
		}
	}
}
