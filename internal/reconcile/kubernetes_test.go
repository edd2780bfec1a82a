package reconcile_test

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/disbelief"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/reconcile"
	"github.com/musterhq/muster/internal/registry"
	"github.com/musterhq/muster/internal/wait"
)

// The Kubernetes tests run on client-go's fake clientset (FAKE: no API
// server can run here): a real object tracker behind a real clientset
// interface, driving real shared informers (informers.NewSharedInformerFactory)
// with their real reflectors, caches and watch error handling. Everything
// on muster's side is real: PostgreSQL, the registry, the evaluator, the
// publisher and the HTTP API (apptest).

const ns = "shop"

// pod is one endpoint of the fake cluster.
type pod struct {
	uid                         string
	ip                          string
	zone                        string
	ready, serving, terminating bool
}

func running(uid, ip string) pod {
	return pod{uid: uid, ip: ip, zone: "az1", ready: true, serving: true}
}

func service(name, muster string) *corev1.Service {
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: map[string]string{reconcile.DefaultServiceAnnotation: muster}},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}}
}

func slice(svc, name string, pods ...pod) *discoveryv1.EndpointSlice {
	port, pname := int32(8080), "http"
	sl := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &pname, Port: &port}},
	}
	for _, p := range pods {
		ready, serving, terminating, zone := p.ready, p.serving, p.terminating, p.zone
		sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{p.ip},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready, Serving: &serving, Terminating: &terminating},
			Zone:       &zone,
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: "web-" + p.uid, UID: types.UID(p.uid)},
		})
	}
	return sl
}

// cluster is a fake cluster reconciled into a real muster.
type cluster struct {
	t      *testing.T
	st     *apptest.Stack
	client *fake.Clientset
	src    *reconcile.KubernetesSource
	rc     *reconcile.Reconciler
	w      *reconcile.Worker
	// watches counts the informers' watches the fake has opened (nil: the
	// test handles watches itself).
	watches *atomic.Int32
	// metrics holds the reconciler's metrics (a fresh registry per start).
	metrics *prometheus.Registry
}

func newCluster(t *testing.T, d reconcile.Disbelief, objs ...runtime.Object) *cluster {
	t.Helper()
	st := apptest.New(t, apptest.Options{})
	admin := st.Token(t, apptest.Admin)
	// web declares a readiness signal: a new instance awaits its first
	// readiness success before it is capacity.
	if r := st.JSON(t, "PUT", "/v1/services/web", admin, `{"owner":"payments","capabilities":["self","readiness","passive"]}`); r.Status != http.StatusCreated {
		t.Fatalf("create web: %d %s", r.Status, r.Body)
	}
	c := &cluster{t: t, st: st, client: fake.NewClientset(objs...), watches: &atomic.Int32{}}
	// The fake clientset does not replay what changed between an
	// informer's list and its watch (a known limit of the fake; a real API
	// server resumes from the list's resourceVersion): a change made in
	// that gap is lost for good. So start waits until both watches are
	// open, counted here, before a test changes anything.
	c.client.PrependWatchReactor("*", func(a k8stesting.Action) (bool, watch.Interface, error) {
		w, err := c.client.Tracker().Watch(a.GetResource(), a.GetNamespace())
		if err != nil {
			return false, nil, err
		}
		c.watches.Add(1)
		return true, w, nil
	})
	return c.start(d)
}

func (c *cluster) start(d reconcile.Disbelief) *cluster {
	t := c.t
	src, err := reconcile.NewKubernetesSource(reconcile.KubernetesConfig{Cluster: "test", Client: c.client, Now: c.st.Clock.Now,
		// The reconcile config vouches for namespace shop for web (members:).
		Members: map[string][]string{"web": {ns}}})
	if err != nil {
		t.Fatal(err)
	}
	c.src = src
	c.metrics = prometheus.NewRegistry()
	if c.rc, err = reconcile.New(reconcile.Config{Sources: []reconcile.Source{src}, Registry: c.st.Registry, Evidence: c.st.Evaluator,
		Disbelief: d, Now: c.st.Clock.Now, Registerer: c.metrics}); err != nil {
		t.Fatal(err)
	}
	c.w = c.rc.Workers()[0]
	// The source runs (informers); passes are stepped by the test.
	var before int32
	if c.watches != nil {
		before = c.watches.Load()
	}
	if err := src.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(src.Stop)
	if c.watches != nil {
		wait.For(t, 10*time.Second, "the informers' watches of Services and EndpointSlices", func() bool { return c.watches.Load() >= before+2 })
	}
	return c
}

// sees waits until the informers' cache holds n endpoints.
func (c *cluster) sees(n int) {
	c.t.Helper()
	wait.For(c.t, 10*time.Second, fmt.Sprintf("the informers' cache to hold %d endpoints", n), func() bool {
		r, err := c.src.Read(c.t.Context())
		return err == nil && len(r.Endpoints) == n
	})
}

func (c *cluster) pass() {
	c.t.Helper()
	if err := c.w.RunOnce(c.t.Context()); err != nil {
		c.t.Fatalf("pass: %v", err)
	}
}

// publish evaluates and publishes (past the addition window).
func (c *cluster) publish() {
	c.st.Evaluator.EvaluateNow()
	c.st.Publisher.RunOnce()
	c.st.Clock.Advance(assembler.DefaultAdditionWindow + 100*time.Millisecond)
	c.st.Publisher.RunOnce()
}

func (c *cluster) update(sl *discoveryv1.EndpointSlice) {
	c.t.Helper()
	if _, err := c.client.DiscoveryV1().EndpointSlices(ns).Update(c.t.Context(), sl, metav1.UpdateOptions{}); err != nil {
		c.t.Fatal(err)
	}
}

// live is the registry's live instances of the source, by address.
func (c *cluster) live() map[string]registry.Instance {
	c.t.Helper()
	ins, err := c.st.Registry.ReconciledInstances(c.t.Context(), "k8s/test")
	if err != nil {
		c.t.Fatal(err)
	}
	out := map[string]registry.Instance{}
	for _, in := range ins {
		if in.LeaseExpiresAt != nil || in.Source != "k8s/test" {
			c.t.Errorf("instance %s: source %s, lease %v; want k8s/test, no lease", in.ID, in.Source, in.LeaseExpiresAt)
		}
		out[in.Address] = in
	}
	return out
}

// view is the published view of web, by address: state.
func (c *cluster) view() map[string]string {
	c.t.Helper()
	r := c.st.Do(c.t, "GET", "/v1/resolve/web", c.st.Token(c.t, apptest.Web), "", "")
	if r.Status != http.StatusOK {
		c.t.Fatalf("resolve web: %d %s", r.Status, r.Body)
	}
	out := map[string]string{}
	for _, e := range apptest.Decode[assembler.View](c.t, r).Endpoints {
		out[e.Address] = e.State
	}
	return out
}

func addrs[V any](m map[string]V) []string {
	var out []string
	for a := range m {
		out = append(out, a)
	}
	slices.Sort(out)
	return out
}

func want(t *testing.T, what string, got []string, want ...string) {
	t.Helper()
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("%s = %v, want %v", what, got, want)
	}
}

// TestKubernetesDeploymentLifecycle creates, scales, rolls and deletes a
// Deployment's EndpointSlice and follows its instances, their readiness
// evidence and the published view.
func TestKubernetesDeploymentLifecycle(t *testing.T) {
	t.Parallel()
	a, b, cc := running("uid-a", "10.1.0.1"), running("uid-b", "10.1.0.2"), pod{uid: "uid-c", ip: "10.1.0.3", zone: "az1"}
	c := newCluster(t, reconcile.Disbelief{}, service("web", "web"), slice("web", "web-1", a, b, cc))

	// Create: the two ready pods are instances; the unready one is not.
	c.sees(3)
	c.pass()
	live := c.live()
	want(t, "instances", addrs(live), "10.1.0.1", "10.1.0.2")
	if id := live["10.1.0.1"].ID; id != registry.ReconciledID("k8s/test", "web", "uid-a") {
		t.Fatalf("instance id %s is not derived from the pod UID", id)
	}
	// Readiness evidence (the ready condition) admits them: web's new
	// instances await a readiness success, and got it from the slice.
	c.publish()
	if v := c.view(); v["10.1.0.1"] != "eligible" || v["10.1.0.2"] != "eligible" || len(v) != 2 {
		t.Fatalf("view after create = %v, want both pods eligible", v)
	}

	// Scale: c becomes ready, d is added.
	cc.ready, cc.serving = true, true
	d := running("uid-d", "10.1.0.4")
	c.update(slice("web", "web-1", a, b, cc, d))
	c.sees(4)
	wait.For(t, 10*time.Second, "c ready in the cache", func() bool {
		r, _ := c.src.Read(t.Context())
		return slices.ContainsFunc(r.Endpoints, func(e reconcile.Endpoint) bool { return e.Address == "10.1.0.3" && e.Ready })
	})
	c.pass()
	want(t, "instances after scale", addrs(c.live()), "10.1.0.1", "10.1.0.2", "10.1.0.3", "10.1.0.4")
	c.publish()
	want(t, "view after scale", addrs(c.view()), "10.1.0.1", "10.1.0.2", "10.1.0.3", "10.1.0.4")

	// Roll, step 1: a terminates but still serves (KEP-1669): it stays
	// an instance and stays routable.
	a.ready, a.terminating = false, true
	a2 := running("uid-a2", "10.1.0.5")
	c.update(slice("web", "web-1", a, b, cc, d, a2))
	c.sees(5)
	c.pass()
	c.publish()
	if v := c.view(); v["10.1.0.1"] != "eligible" {
		t.Fatalf("a terminating but serving: view %v, want it still eligible", v)
	}
	// Step 2: a stops serving: it ends, and leaves the view.
	a.serving = false
	c.update(slice("web", "web-1", a, b, cc, d, a2))
	wait.For(t, 10*time.Second, "a not serving in the cache", func() bool {
		r, _ := c.src.Read(t.Context())
		return slices.ContainsFunc(r.Endpoints, func(e reconcile.Endpoint) bool { return e.Address == "10.1.0.1" && !e.Serving })
	})
	c.pass()
	want(t, "instances after roll", addrs(c.live()), "10.1.0.2", "10.1.0.3", "10.1.0.4", "10.1.0.5")
	c.publish()
	want(t, "view after roll", addrs(c.view()), "10.1.0.2", "10.1.0.3", "10.1.0.4", "10.1.0.5")

	// b fails its readiness probe: it stays an instance (readiness is
	// evidence, not existence), and the evaluator hears it failing.
	bUnready := b
	bUnready.ready, bUnready.serving = false, false
	c.update(slice("web", "web-1", bUnready, cc, d, a2))
	wait.For(t, 10*time.Second, "b unready in the cache", func() bool {
		r, _ := c.src.Read(t.Context())
		return slices.ContainsFunc(r.Endpoints, func(e reconcile.Endpoint) bool { return e.Address == "10.1.0.2" && !e.Ready })
	})
	c.st.Clock.Advance(time.Second)
	c.pass()
	want(t, "instances with b unready", addrs(c.live()), "10.1.0.2", "10.1.0.3", "10.1.0.4", "10.1.0.5")
	c.st.Evaluator.EvaluateNow()
	el, err := c.st.Evaluator.ServiceEligibility("web")
	if err != nil {
		t.Fatal(err)
	}
	bID := c.live()["10.1.0.2"].ID
	for _, iv := range el.Instances {
		self := iv.Evidence["self"]
		switch {
		case iv.InstanceID == bID && self.FailureRate <= 0:
			t.Fatalf("b unready: self evidence %+v, want failures heard", self)
		case iv.InstanceID != bID && (!self.Present || self.FailureRate != 0):
			t.Fatalf("instance %s ready: self evidence %+v, want present, no failures", iv.InstanceID, self)
		}
	}

	// A pod restarted with a new UID at the same address is a new
	// instance; the old one ends, and its id is never reused.
	old := c.live()["10.1.0.2"].ID
	b2 := running("uid-b-restarted", "10.1.0.2")
	c.update(slice("web", "web-1", b2, cc, d, a2))
	wait.For(t, 10*time.Second, "b restarted in the cache", func() bool {
		r, _ := c.src.Read(t.Context())
		return slices.ContainsFunc(r.Endpoints, func(e reconcile.Endpoint) bool { return e.Key == "uid-b-restarted" })
	})
	c.pass()
	admin := identity.Principal{Kind: identity.KindOperator, Subject: "test", Role: identity.RoleAdmin}
	if got := c.live()["10.1.0.2"].ID; got == old || got != registry.ReconciledID("k8s/test", "web", "uid-b-restarted") {
		t.Fatalf("restarted pod: instance %s, old %s; want a new instance from the new UID", got, old)
	}
	if in, err := c.st.Registry.GetInstance(t.Context(), admin, old); err != nil || in.State != registry.StateDeregistered {
		t.Fatalf("the restarted pod's old instance: %+v %v; want deregistered", in, err)
	}

	// Delete the Deployment: every endpoint goes at once. That is more
	// than 20% of what the source had: held, alarmed, until confirmed.
	if err := c.client.DiscoveryV1().EndpointSlices(ns).Delete(t.Context(), "web-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	c.sees(0)
	c.pass()
	if n := len(c.live()); n != 4 {
		t.Fatalf("after the delete: %d live instances, want the 4 held", n)
	}
	if h := c.rc.Holds(); len(h) != 1 || h[0].Gate != "reconcile/k8s/test" || h[0].Held != 4 || !strings.Contains(h[0].Alarm().Detail, "partitioned") && !strings.Contains(h[0].Alarm().Detail, "4 of 4 instances") {
		t.Fatalf("holds = %+v, want one of the source naming 4 of 4", h)
	}
	if _, err := c.rc.Confirm(t.Context(), admin, "k8s/test", disbelief.Scope{Kind: disbelief.Source, Name: "k8s/test"}, "the deployment was deleted on purpose"); err != nil {
		t.Fatal(err)
	}
	c.st.Clock.Advance(time.Second)
	c.pass()
	if n := len(c.live()); n != 0 {
		t.Fatalf("after confirmation: %d live instances, want 0", n)
	}
	if al, h := c.rc.Alarms(), c.rc.Holds(); len(al) != 0 || len(h) != 0 {
		t.Fatalf("alarms and holds after confirmation = %+v %+v, want none", al, h)
	}
}

// TestKubernetesDisappearanceHeld: 3 of 10 endpoints vanishing (30%, above
// the 20% threshold) are held with the alarm however long the same
// reading repeats (no timer releases a hold, issue 26), until the
// endpoints come back.
func TestKubernetesDisappearanceHeld(t *testing.T) {
	t.Parallel()
	var pods []pod
	for i := 1; i <= 10; i++ {
		pods = append(pods, running(fmt.Sprintf("uid-%d", i), fmt.Sprintf("10.2.0.%d", i)))
	}
	c := newCluster(t, reconcile.Disbelief{Window: time.Minute}, service("web", "web"), slice("web", "web-1", pods...))
	c.sees(10)
	c.pass()
	if n := len(c.live()); n != 10 {
		t.Fatalf("%d live, want 10", n)
	}
	c.update(slice("web", "web-1", pods[:7]...))
	c.sees(7)
	c.pass()
	if n := len(c.live()); n != 10 {
		t.Fatalf("30%% gone: %d live, want all 10 held", n)
	}
	h := c.rc.Holds()
	if len(h) != 1 || h[0].Scope.String() != "source k8s/test" || h[0].Held != 3 || !strings.Contains(h[0].Detail, "3 of 10 instances in source k8s/test") {
		t.Fatalf("holds = %+v", h)
	}
	for range 10 {
		c.st.Clock.Advance(time.Minute)
		c.pass()
		if n := len(c.live()); n != 10 {
			t.Fatalf("the same reading later: %d live, want 10", n)
		}
	}
	if h := c.rc.Holds(); len(h) != 1 || !h[0].Since.Equal(c.st.Clock.Now().Add(-10*time.Minute)) {
		t.Fatalf("holds ten minutes on = %+v, want the same hold since the first reading", h)
	}
	// The endpoints come back: the hold ends, nothing was removed.
	c.update(slice("web", "web-1", pods...))
	c.sees(10)
	c.pass()
	if n, h := len(c.live()), c.rc.Holds(); n != 10 || len(h) != 0 {
		t.Fatalf("recovered: %d live, holds %+v; want 10, none", n, h)
	}
}

// TestKubernetesWatchLostKeepsLastState: the informers' watch fails and
// relisting fails too (the API server unreachable); the reading stays the
// last state, marked stale with an alarm, and nothing is removed.
func TestKubernetesWatchLostKeepsLastState(t *testing.T) {
	t.Parallel()
	st := apptest.New(t, apptest.Options{})
	admin := st.Token(t, apptest.Admin)
	if r := st.JSON(t, "PUT", "/v1/services/web", admin, `{"owner":"payments","capabilities":["self","readiness"]}`); r.Status != http.StatusCreated {
		t.Fatalf("create web: %d %s", r.Status, r.Body)
	}
	client := fake.NewClientset(service("web", "web"), slice("web", "web-1", running("u1", "10.3.0.1"), running("u2", "10.3.0.2")))
	// The fake's watch of EndpointSlices is one the test controls; once
	// broken, every list and watch fails.
	fw := watch.NewFake()
	var broken atomic.Bool
	client.PrependWatchReactor("endpointslices", func(k8stesting.Action) (bool, watch.Interface, error) {
		if broken.Load() {
			return true, nil, errors.New("connection refused (fake API server down)")
		}
		return true, fw, nil
	})
	client.PrependReactor("list", "endpointslices", func(k8stesting.Action) (bool, runtime.Object, error) {
		if broken.Load() {
			return true, nil, errors.New("connection refused (fake API server down)")
		}
		return false, nil, nil
	})
	c := &cluster{t: t, st: st, client: client}
	c.start(reconcile.Disbelief{})
	c.sees(2)
	c.pass()
	if n := len(c.live()); n != 2 {
		t.Fatalf("%d live, want 2", n)
	}
	broken.Store(true)
	fw.Error(&metav1.Status{Status: metav1.StatusFailure, Message: "watch lost", Code: http.StatusInternalServerError})
	wait.For(t, 10*time.Second, "the source to say its watch was lost", func() bool {
		r, err := c.src.Read(t.Context())
		return err == nil && r.Stale != ""
	})
	c.pass()
	r, _ := c.src.Read(t.Context())
	if len(r.Endpoints) != 2 {
		t.Fatalf("the cache after the watch was lost holds %d endpoints, want the last 2", len(r.Endpoints))
	}
	if n := len(c.live()); n != 2 {
		t.Fatalf("after the watch was lost: %d live, want 2 (fail-static)", n)
	}
	st1 := c.w.Status()
	if st1.Stale == "" || !strings.Contains(st1.Stale, "watch") {
		t.Fatalf("status %+v, want stale naming the watch", st1)
	}
	if al := c.rc.Alarms(); len(al) != 1 || al[0].Kind != reconcile.AlarmStale {
		t.Fatalf("alarms = %+v, want reconcile_stale", al)
	}
}

// TestKubernetesWorkerFollowsEvents: the worker as serve runs it (Start):
// with a pass period of an hour, informer events alone bring a new
// slice's pods in and a deleted pod's instance out.
func TestKubernetesWorkerFollowsEvents(t *testing.T) {
	t.Parallel()
	c := newCluster(t, reconcile.Disbelief{}, service("web", "web"))
	rc, err := reconcile.New(reconcile.Config{Sources: []reconcile.Source{c.src}, Registry: c.st.Registry, Evidence: c.st.Evaluator,
		Every: time.Hour, Now: c.st.Clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	w := rc.Workers()[0]
	if err := w.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	sl := slice("web", "web-1", running("e1", "10.8.0.1"), running("e2", "10.8.0.2"))
	if _, err := c.client.DiscoveryV1().EndpointSlices(ns).Create(t.Context(), sl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 10*time.Second, "two instances from the informer's events", func() bool { return len(c.live()) == 2 })
	c.update(slice("web", "web-1", running("e1", "10.8.0.1")))
	wait.For(t, 10*time.Second, "one instance after the pod left", func() bool { return len(c.live()) == 1 })
}

// TestKubernetesReadMapping: which Services are muster services, which
// port, and what an endpoint's missing fields mean, on the fake clientset
// (no database).
func TestKubernetesReadMapping(t *testing.T) {
	t.Parallel()
	annotated := service("web", "web")
	annotated.Labels = map[string]string{"tier": "backend"}
	annotated.Annotations[reconcile.DefaultPortAnnotation] = "admin"
	unlabelled := service("api", "api") // fails the selector
	plain := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "db"}}
	sl := slice("web", "web-1", running("w1", "10.9.0.1"))
	admin, adminPort := "admin", int32(9090)
	sl.Ports = append(sl.Ports, discoveryv1.EndpointPort{Name: &admin, Port: &adminPort})
	// Conditions left nil: ready; no zone; no pod behind it.
	sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{Addresses: []string{"10.9.0.2"}})
	fqdn := slice("web", "web-fqdn", running("w3", "web.example.com"))
	fqdn.AddressType = discoveryv1.AddressTypeFQDN
	client := fake.NewClientset(annotated, unlabelled, plain, sl, fqdn,
		slice("api", "api-1", running("a1", "10.9.1.1")), slice("db", "db-1", running("d1", "10.9.2.1")))
	src, err := reconcile.NewKubernetesSource(reconcile.KubernetesConfig{Cluster: "test", Client: client, Selector: "tier=backend"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := src.Read(t.Context()); !errors.Is(err, reconcile.ErrNotSynced) {
		t.Fatalf("read before the start: %v, want ErrNotSynced", err)
	}
	if err := src.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(src.Stop)
	var r reconcile.Reading
	wait.For(t, 10*time.Second, "the informers synced", func() bool {
		r, err = src.Read(t.Context())
		return err == nil
	})
	got := map[string]reconcile.Endpoint{}
	for _, e := range r.Endpoints {
		got[e.Address] = e
	}
	if len(got) != 2 {
		t.Fatalf("endpoints %+v, want web's two IP endpoints only", r.Endpoints)
	}
	if e := got["10.9.0.1"]; e.Service != "web" || e.Port != 9090 || e.Key != "w1" || e.Zone != "az1" {
		t.Errorf("pod endpoint %+v, want web, the admin port 9090, key w1, az1", e)
	}
	if e := got["10.9.0.2"]; !e.Ready || !e.Serving || e.Terminating || e.Zone != reconcile.NoZone || e.Key != "address/10.9.0.2" {
		t.Errorf("bare endpoint %+v, want ready and serving (nil conditions), unzoned, keyed by address", e)
	}
	if _, err := reconcile.NewKubernetesSource(reconcile.KubernetesConfig{Cluster: "test", Client: client, Selector: "tier in ("}); err == nil {
		t.Error("a bad selector accepted")
	}
}
