package reconcile_test

import (
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/reconcile"
	"github.com/musterhq/muster/internal/registry"
	"github.com/musterhq/muster/internal/wait"
)

// elsewhere is a Kubernetes Service in namespace attacker annotated for
// muster service web, and its slice of pods.
func elsewhere(pods ...pod) (*corev1.Service, *discoveryv1.EndpointSlice) {
	svc := service("evil", "web")
	svc.Namespace = "attacker"
	sl := slice("evil", "evil-1", pods...)
	sl.Namespace = "attacker"
	return svc, sl
}

// alarmsOf are the reconciler's open alarms of kind.
func (c *cluster) alarmsOf(kind string) []assembler.Alarm {
	var out []assembler.Alarm
	for _, a := range c.rc.Alarms() {
		if a.Kind == kind {
			out = append(out, a)
		}
	}
	return out
}

// apiAlarms are the open alarms of kind GET /v1/alarms lists.
func apiAlarms(t *testing.T, st *apptest.Stack, kind string) []assembler.Alarm {
	t.Helper()
	r := st.Do(t, "GET", "/v1/alarms", st.Token(t, apptest.Operator), "", "")
	if r.Status != http.StatusOK {
		t.Fatalf("alarms: %d %s", r.Status, r.Body)
	}
	var out []assembler.Alarm
	for _, a := range apptest.Decode[struct{ Alarms []assembler.Alarm }](t, r).Alarms {
		if a.Kind == kind {
			out = append(out, a)
		}
	}
	return out
}

// TestKubernetesUnauthorisedNamespaceAddsNothing: a Kubernetes Service in
// a namespace web does not take members from, annotated for web, adds
// nothing to web; the claim is alarmed (reconcile_unauthorised, naming
// the source, the namespace and the Service; in the reconciler's alarms,
// which GET /v1/alarms and the UI list) and counted. Once web's owning
// team authorises the namespace through the API, its endpoints join, and
// the configured list replaces the reconcile config's default for web.
func TestKubernetesUnauthorisedNamespaceAddsNothing(t *testing.T) {
	t.Parallel()
	evilSvc, evilSlice := elsewhere(running("e1", "10.9.0.1"), running("e2", "10.9.0.2"))
	c := newCluster(t, reconcile.Disbelief{},
		service("web", "web"), slice("web", "web-1", running("p1", "10.0.0.1")),
		evilSvc, evilSlice)
	c.sees(3)
	c.pass()
	want(t, "live after the first pass", addrs(c.live()), "10.0.0.1")

	got := c.alarmsOf(reconcile.AlarmUnauthorised)
	if len(got) != 1 || got[0].Service != "web" {
		t.Fatalf("reconcile_unauthorised alarms: %+v", got)
	}
	for _, s := range []string{"k8s/test", `"attacker"`, `"evil"`, "2 endpoints", "PUT /v1/services/web/member-sources"} {
		if !strings.Contains(got[0].Detail, s) {
			t.Errorf("alarm detail %q does not say %s", got[0].Detail, s)
		}
	}
	if n := gauge(t, c.metrics, "muster_reconcile_unauthorised", "k8s/test", "web"); n != 2 {
		t.Errorf("muster_reconcile_unauthorised{k8s/test,web} = %v, want 2", n)
	}
	// Passes again: still nothing added, the alarm keeps its start.
	c.pass()
	want(t, "live after a second pass", addrs(c.live()), "10.0.0.1")
	if again := c.alarmsOf(reconcile.AlarmUnauthorised); len(again) != 1 || !again[0].Since.Equal(got[0].Since) {
		t.Errorf("alarm after a second pass: %+v (first %+v)", again, got)
	}

	// The owning team's operator authorises attacker (and keeps shop:
	// a configured list is the whole list).
	r := c.st.JSON(t, "PUT", "/v1/services/web/member-sources", c.st.Token(t, apptest.Operator),
		`{"sources":[{"source":"k8s/test","namespaces":["shop","attacker"]}]}`)
	if r.Status != http.StatusOK {
		t.Fatalf("authorise attacker: %d %s", r.Status, r.Body)
	}
	c.pass()
	want(t, "live once authorised", addrs(c.live()), "10.0.0.1", "10.9.0.1", "10.9.0.2")
	if got := c.alarmsOf(reconcile.AlarmUnauthorised); len(got) != 0 {
		t.Errorf("alarms once authorised: %+v", got)
	}
	if n := testutil.CollectAndCount(c.metrics, "muster_reconcile_unauthorised"); n != 0 {
		t.Errorf("muster_reconcile_unauthorised series once authorised: %d", n)
	}

	// Authorising attacker alone: shop's pod stays (members are never
	// ended by authorisation), but a new pod in shop is not admitted.
	r = c.st.JSON(t, "PUT", "/v1/services/web/member-sources", c.st.Token(t, apptest.Operator),
		`{"sources":[{"source":"k8s/test","namespaces":["attacker"]}]}`)
	if r.Status != http.StatusOK {
		t.Fatalf("authorise attacker alone: %d %s", r.Status, r.Body)
	}
	c.update(slice("web", "web-1", running("p1", "10.0.0.1"), running("p2", "10.0.0.2")))
	c.sees(4)
	c.pass()
	want(t, "live after shop's authority went", addrs(c.live()), "10.0.0.1", "10.9.0.1", "10.9.0.2")
	got = c.alarmsOf(reconcile.AlarmUnauthorised)
	if len(got) != 1 || !strings.Contains(got[0].Detail, `"shop"`) || !strings.Contains(got[0].Detail, "1 of them were members already") {
		t.Errorf("alarms after shop's authority went: %+v", got)
	}
}

// TestKubernetesUnauthorisedAlarmInTheAPI: the alarm reaches GET
// /v1/alarms through the app's reconciler, like removal_held.
func TestKubernetesUnauthorisedAlarmInTheAPI(t *testing.T) {
	t.Parallel()
	evilSvc, evilSlice := elsewhere(running("e1", "10.9.0.1"))
	src, err := reconcile.NewKubernetesSource(reconcile.KubernetesConfig{Cluster: "test", Client: fake.NewClientset(evilSvc, evilSlice)})
	if err != nil {
		t.Fatal(err)
	}
	// The app holds the worker (the test runs its passes); the source's
	// informers run.
	if err := src.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(src.Stop)
	st := apptest.New(t, apptest.Options{Reconcile: reconcile.Config{Sources: []reconcile.Source{src}}})
	if r := st.JSON(t, "PUT", "/v1/services/web", st.Token(t, apptest.Admin), `{"owner":"payments","capabilities":["self","readiness","passive"]}`); r.Status != http.StatusCreated {
		t.Fatalf("create web: %d %s", r.Status, r.Body)
	}
	w, _ := st.Reconcile.Worker("k8s/test")
	wait.For(t, 10*time.Second, "the alarm in GET /v1/alarms", func() bool {
		_ = w.RunOnce(t.Context())
		return len(apiAlarms(t, st, reconcile.AlarmUnauthorised)) == 1
	})
	ins, err := st.Registry.ReconciledInstances(t.Context(), "k8s/test")
	if err != nil || len(ins) != 0 {
		t.Fatalf("instances from an unauthorised namespace: %v %v", ins, err)
	}
}

// TestMemberSourcesWrittenByHandAuthoriseNothing: a member-sources row
// inserted by hand, or one muster wrote and a hand then widened, does not
// authorise its namespaces; it is alarmed (member_sources_unsealed), and
// the service takes members as the reconcile config vouches (shop).
func TestMemberSourcesWrittenByHandAuthoriseNothing(t *testing.T) {
	t.Parallel()
	evilSvc, evilSlice := elsewhere(running("e1", "10.9.0.1"))
	c := newCluster(t, reconcile.Disbelief{},
		service("web", "web"), slice("web", "web-1", running("p1", "10.0.0.1")),
		evilSvc, evilSlice)
	c.sees(2)
	if _, err := c.st.Pool.Exec(t.Context(), `INSERT INTO member_sources (service, version, document, updated_by, updated_at)
		VALUES ('web', 1, '{"sources":[{"source":"k8s/test","namespaces":["shop","attacker"]}]}', 'operator:oscar', now())`); err != nil {
		t.Fatal(err)
	}
	c.pass()
	want(t, "live with a hand-inserted row", addrs(c.live()), "10.0.0.1")
	if got := c.alarmsOf(reconcile.AlarmMemberSourcesUnsealed); len(got) != 1 || got[0].Service != "web" || !strings.Contains(got[0].Detail, "not sealed") {
		t.Errorf("member_sources_unsealed alarms: %+v", got)
	}
	if got := c.alarmsOf(reconcile.AlarmUnauthorised); len(got) != 1 {
		t.Errorf("reconcile_unauthorised alarms with a hand-inserted row: %+v", got)
	}

	// Written by muster (shop only), then widened by hand.
	if _, err := c.st.Pool.Exec(t.Context(), `DELETE FROM member_sources`); err != nil {
		t.Fatal(err)
	}
	if r := c.st.JSON(t, "PUT", "/v1/services/web/member-sources", c.st.Token(t, apptest.Operator),
		`{"sources":[{"source":"k8s/test","namespaces":["shop"]}]}`); r.Status != http.StatusOK {
		t.Fatalf("put: %d %s", r.Status, r.Body)
	}
	c.pass()
	if got := c.alarmsOf(reconcile.AlarmMemberSourcesUnsealed); len(got) != 0 {
		t.Errorf("alarms with muster's own row: %+v", got)
	}
	if _, err := c.st.Pool.Exec(t.Context(), `UPDATE member_sources SET document = '{"sources":[{"source":"k8s/test","namespaces":["shop","attacker"]}]}'`); err != nil {
		t.Fatal(err)
	}
	c.pass()
	want(t, "live with a widened row", addrs(c.live()), "10.0.0.1")
	if got := c.alarmsOf(reconcile.AlarmMemberSourcesUnsealed); len(got) != 1 || !strings.Contains(got[0].Detail, "does not match") {
		t.Errorf("member_sources_unsealed alarms after widening: %+v", got)
	}
}

// TestReconciledEndpointKeepsBudget: a reconciled endpoint at a
// registered instance's address and port ends that instance only within
// the disruption budget an operator's deregistration needs. While the
// budget refuses (it is the last instance of web in the region), the
// operator's deregistration is refused and so is the replacement: the
// registered instance stays, the reconciled one is not added, the refusal
// is audited once (not every pass) and alarmed. Once capacity allows, the
// replacement goes ahead, audited with the budget's figures.
func TestReconciledEndpointKeepsBudget(t *testing.T) {
	t.Parallel()
	c := newCluster(t, reconcile.Disbelief{}, service("web", "web"), slice("web", "web-1"))
	admin := identity.Principal{Kind: identity.KindOperator, Subject: "test", Role: identity.RoleAdmin}
	reg, err := c.st.Registry.Register(t.Context(), admin, netip.Addr{}, "web", registry.Registration{Address: "10.0.0.9", Port: 8080, Zone: "az1"})
	if err != nil {
		t.Fatal(err)
	}
	c.st.Admit(t, reg.ID.String())

	// An operator's deregistration would be refused.
	r := c.st.JSON(t, "DELETE", "/v1/instances/"+reg.ID.String(), c.st.Token(t, apptest.Operator), `{"justification":"moving web onto the cluster"}`)
	if r.Status == http.StatusOK {
		t.Fatalf("operator's deregistration of the last instance: %d %s", r.Status, r.Body)
	}

	c.update(slice("web", "web-1", running("p9", "10.0.0.9")))
	c.sees(1)
	c.pass()
	c.pass()
	if got := c.live(); len(got) != 0 {
		t.Fatalf("reconciled instances over budget: %v", addrs(got))
	}
	if st := instanceState(t, c, reg.ID.String()); st != registry.StateActive {
		t.Fatalf("registered instance over budget: %s", st)
	}
	evs := replaceEvents(t, c)
	if len(evs) != 1 || evs[0].Outcome != audit.Refused || evs[0].Target != reg.ID.String() || !strings.Contains(evs[0].Reason, "last eligible instance") {
		t.Fatalf("instance.replace events over budget (two passes): %+v", evs)
	}
	if got := c.alarmsOf(reconcile.AlarmReplaceRefused); len(got) != 1 || !strings.Contains(got[0].Detail, reg.ID.String()) {
		t.Errorf("reconcile_replace_refused alarms: %+v", got)
	}

	// Capacity elsewhere in az1: the budget allows ending it.
	var more []string
	for _, a := range []string{"10.0.1.1", "10.0.1.2", "10.0.1.3"} {
		in, err := c.st.Registry.Register(t.Context(), admin, netip.Addr{}, "web", registry.Registration{Address: a, Port: 8080, Zone: "az1"})
		if err != nil {
			t.Fatal(err)
		}
		more = append(more, in.ID.String())
	}
	c.st.Admit(t, more...)
	c.pass()
	want(t, "reconciled within budget", addrs(c.live()), "10.0.0.9")
	if st := instanceState(t, c, reg.ID.String()); st != registry.StateReplaced {
		t.Fatalf("registered instance within budget: %s", st)
	}
	evs = replaceEvents(t, c)
	if len(evs) != 2 || evs[0].Outcome != audit.Accepted {
		t.Fatalf("instance.replace events within budget: %+v", evs)
	}
	if got := c.alarmsOf(reconcile.AlarmReplaceRefused); len(got) != 0 {
		t.Errorf("alarms after the replacement: %+v", got)
	}
}

func instanceState(t *testing.T, c *cluster, id string) string {
	t.Helper()
	r := c.st.Do(t, "GET", "/v1/instances/"+id, c.st.Token(t, apptest.Admin), "", "")
	if r.Status != http.StatusOK {
		t.Fatalf("get instance %s: %d %s", id, r.Status, r.Body)
	}
	return apptest.Decode[registry.Instance](t, r).State
}

// replaceEvents are the instance.replace audit events, newest first.
func replaceEvents(t *testing.T, c *cluster) []audit.Event {
	t.Helper()
	evs, err := audit.List(t.Context(), db.New(c.st.Pool), audit.Filter{Action: "instance.replace", Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	return evs
}

// gauge is the value of the gauge name{source, service} in reg (0 when
// there is no such series).
func gauge(t *testing.T, reg *prometheus.Registry, name, source, service string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			if l["source"] == source && l["service"] == service {
				return m.GetGauge().GetValue()
			}
		}
	}
	return 0
}
