package chart_test

import (
	"bytes"
	encjson "encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// The Prometheus Operator's kinds are not in client-go's scheme, and the
// project does not depend on the operator's API module: these are the
// fields of monitoring.coreos.com/v1 the chart may render (names as in the
// CRDs), decoded refusing any other, so a misspelt or misplaced field
// fails as it would against the CRD's structural schema.
const monitoringGroup = "monitoring.coreos.com"

type serviceMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		JobLabel          string               `json:"jobLabel,omitempty"`
		TargetLabels      []string             `json:"targetLabels,omitempty"`
		Selector          metav1.LabelSelector `json:"selector"`
		NamespaceSelector struct {
			Any        bool     `json:"any,omitempty"`
			MatchNames []string `json:"matchNames,omitempty"`
		} `json:"namespaceSelector"`
		Endpoints []struct {
			Port          string `json:"port"`
			Path          string `json:"path,omitempty"`
			Scheme        string `json:"scheme,omitempty"`
			Interval      string `json:"interval,omitempty"`
			ScrapeTimeout string `json:"scrapeTimeout,omitempty"`
			TLSConfig     *struct {
				ServerName         string `json:"serverName,omitempty"`
				InsecureSkipVerify bool   `json:"insecureSkipVerify,omitempty"`
				CA                 *struct {
					Secret *corev1.SecretKeySelector `json:"secret,omitempty"`
				} `json:"ca,omitempty"`
			} `json:"tlsConfig,omitempty"`
			Relabelings []struct {
				Action       string   `json:"action,omitempty"`
				SourceLabels []string `json:"sourceLabels,omitempty"`
				Regex        string   `json:"regex,omitempty"`
				TargetLabel  string   `json:"targetLabel,omitempty"`
				Replacement  *string  `json:"replacement,omitempty"`
			} `json:"relabelings,omitempty"`
		} `json:"endpoints"`
	} `json:"spec"`
}

func (s *serviceMonitor) DeepCopyObject() runtime.Object { c := *s; return &c }

type promRule struct {
	Alert       string            `json:"alert,omitempty"`
	Record      string            `json:"record,omitempty"`
	Expr        string            `json:"expr"`
	For         string            `json:"for,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

type prometheusRule struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Groups []struct {
			Name     string     `json:"name"`
			Interval string     `json:"interval,omitempty"`
			Rules    []promRule `json:"rules"`
		} `json:"groups"`
	} `json:"spec"`
}

func (p *prometheusRule) DeepCopyObject() runtime.Object { c := *p; return &c }

// decodeStrict decodes one rendered document: the Prometheus Operator's
// kinds into the types above, everything else through strictDecoder.
func decodeStrict(doc []byte) (runtime.Object, *schema.GroupVersionKind, error) {
	j, err := utilyaml.ToJSON(doc)
	if err != nil {
		return nil, nil, err
	}
	var tm metav1.TypeMeta
	if err := encjson.Unmarshal(j, &tm); err != nil {
		return nil, nil, err
	}
	gvk := tm.GroupVersionKind()
	if gvk.Group != monitoringGroup {
		return strictDecoder.Decode(doc, nil, nil)
	}
	var obj runtime.Object
	switch {
	case gvk.Version == "v1" && gvk.Kind == "ServiceMonitor":
		obj = &serviceMonitor{}
	case gvk.Version == "v1" && gvk.Kind == "PrometheusRule":
		obj = &prometheusRule{}
	default:
		return nil, nil, fmt.Errorf("unknown kind %s", gvk)
	}
	dec := encjson.NewDecoder(bytes.NewReader(j))
	dec.DisallowUnknownFields()
	if err := dec.Decode(obj); err != nil {
		return nil, nil, err
	}
	return obj, &gvk, nil
}

// TestMonitoringOffByDefault: without the CRDs a cluster would refuse the
// whole release, so neither kind renders unless asked for.
func TestMonitoringOffByDefault(t *testing.T) {
	o := mustRender(t, []string{"minimal.yaml"}, nil)
	if n := len(of[*serviceMonitor](o)) + len(of[*prometheusRule](o)); n != 0 {
		t.Fatalf("%d Prometheus Operator objects by default", n)
	}
}

func TestServiceMonitor(t *testing.T) {
	o := mustRender(t, []string{"minimal.yaml"}, map[string]any{
		"region": "eu-west-1a",
		"metrics": map[string]any{"serviceMonitor": map[string]any{"enabled": true, "interval": "15s",
			"labels": map[string]any{"release": "kube-prometheus-stack"}}},
	})
	sm := one[*serviceMonitor](t, o)
	if sm.Namespace != namespace || sm.Labels["release"] != "kube-prometheus-stack" {
		t.Errorf("namespace %q labels %v", sm.Namespace, sm.Labels)
	}
	// It selects the headless Service, the one with the metrics port, and
	// only that one.
	sel, err := metav1.LabelSelectorAsSelector(&sm.Spec.Selector)
	if err != nil {
		t.Fatal(err)
	}
	var picked []*corev1.Service
	for _, svc := range of[*corev1.Service](o) {
		if sel.Matches(labels.Set(svc.Labels)) {
			picked = append(picked, svc)
		}
	}
	if len(picked) != 1 || picked[0].Spec.ClusterIP != "None" {
		t.Fatalf("the ServiceMonitor selects %d Services, want the headless one", len(picked))
	}
	if !slices.Equal(sm.Spec.NamespaceSelector.MatchNames, []string{namespace}) {
		t.Errorf("namespaceSelector %+v", sm.Spec.NamespaceSelector)
	}
	if len(sm.Spec.Endpoints) != 1 {
		t.Fatalf("%d endpoints", len(sm.Spec.Endpoints))
	}
	ep := sm.Spec.Endpoints[0]
	hasPort := false
	for _, p := range picked[0].Spec.Ports {
		hasPort = hasPort || p.Name == ep.Port
	}
	if ep.Port != "metrics" || !hasPort || ep.Path != "/metrics" || ep.Interval != "15s" {
		t.Errorf("endpoint %+v", ep)
	}
	set := map[string]string{}
	for _, r := range ep.Relabelings {
		if r.Action == "replace" && len(r.SourceLabels) == 0 && r.Replacement != nil {
			set[r.TargetLabel] = *r.Replacement
		}
	}
	if set["region"] != "eu-west-1a" {
		t.Errorf("region target label %q, want eu-west-1a", set["region"])
	}
	if set["job"] != "muster" {
		t.Errorf("job %q, want muster (the rules select job=~\"muster.*\")", set["job"])
	}
	// minimal.yaml has TLS between the replicas, so the metrics port serves
	// https: the scrape verifies it against the replicas' CA, for a name
	// their certificate (*.muster-peers.muster.svc.cluster.local) holds.
	tc := ep.TLSConfig
	if ep.Scheme != "https" || tc == nil || tc.InsecureSkipVerify {
		t.Fatalf("scheme %q tlsConfig %+v, want https verified", ep.Scheme, tc)
	}
	if tc.ServerName != "muster-0.muster-peers.muster.svc.cluster.local" {
		t.Errorf("serverName %q", tc.ServerName)
	}
	if tc.CA == nil || tc.CA.Secret == nil || tc.CA.Secret.Name != "muster-tls" || tc.CA.Secret.Key != "ca.crt" {
		t.Errorf("CA %+v, want muster-tls/ca.crt (tls.ca)", tc.CA)
	}

	// One replica on plain http: scraped over http.
	o = mustRender(t, []string{"minimal.yaml"}, map[string]any{
		"replicaCount": 1,
		"tls":          map[string]any{"enabled": false, "existingSecret": "", "ca": map[string]any{"existingSecret": ""}},
		"metrics":      map[string]any{"serviceMonitor": map[string]any{"enabled": true, "tlsServerName": "ignored.example"}},
	})
	ep = one[*serviceMonitor](t, o).Spec.Endpoints[0]
	if ep.Scheme != "http" || ep.TLSConfig != nil {
		t.Errorf("without TLS: scheme %q tlsConfig %+v", ep.Scheme, ep.TLSConfig)
	}
}

func TestServiceMonitorRefusals(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  map[string]any
		want string
	}{
		{"without metrics", map[string]any{"metrics": map[string]any{"enabled": false, "serviceMonitor": map[string]any{"enabled": true}}}, "needs metrics.enabled"},
		{"job the rules miss", map[string]any{"metrics": map[string]any{"serviceMonitor": map[string]any{"enabled": true, "jobName": "discovery"}}}, "jobName"},
		{"interval not a duration", map[string]any{"metrics": map[string]any{"serviceMonitor": map[string]any{"enabled": true, "interval": "30"}}}, "interval"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := render(t, []string{"minimal.yaml"}, tc.set); err == nil || !bytes.Contains([]byte(err.Error()), []byte(tc.want)) {
				t.Errorf("err = %v, want one naming %q", err, tc.want)
			}
		})
	}
}

func TestPrometheusRule(t *testing.T) {
	o := mustRender(t, []string{"minimal.yaml"}, map[string]any{
		"metrics": map[string]any{"prometheusRule": map[string]any{"enabled": true, "labels": map[string]any{"role": "alert-rules"}}},
	})
	pr := one[*prometheusRule](t, o)
	if pr.Namespace != namespace || pr.Labels["role"] != "alert-rules" {
		t.Errorf("namespace %q labels %v", pr.Namespace, pr.Labels)
	}
	// The rendered groups are the shipped file's, rule for rule: the
	// file's alert templates ({{ $labels.region }}) pass through Helm
	// untouched.
	shipped, err := os.ReadFile("../../deploy/prometheus/muster-alerts.rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	j, err := utilyaml.ToJSON(shipped)
	if err != nil {
		t.Fatal(err)
	}
	var want prometheusRule
	dec := encjson.NewDecoder(bytes.NewReader(j))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&want.Spec); err != nil {
		t.Fatal(err)
	}
	got, _ := encjson.Marshal(pr.Spec)
	exp, _ := encjson.Marshal(want.Spec)
	if !bytes.Equal(got, exp) {
		t.Fatalf("the PrometheusRule's groups differ from the shipped rules:\n got %s\nwant %s", got, exp)
	}
	n, templated := 0, false
	for _, g := range pr.Spec.Groups {
		for _, r := range g.Rules {
			n++
			templated = templated || bytes.Contains([]byte(r.Annotations["summary"]), []byte("{{ $labels.region }}"))
		}
	}
	if n < 20 || !templated {
		t.Errorf("%d rules, alert templates kept: %v", n, templated)
	}
}

// TestChartRulesCopyMatches: Helm reads only files inside the chart, so the
// chart carries a copy of the rules; it must not drift from the file the
// rule tests (internal/notify) check.
func TestChartRulesCopyMatches(t *testing.T) {
	shipped, err := os.ReadFile("../../deploy/prometheus/muster-alerts.rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	chart, err := os.ReadFile(chartDir + "/files/muster-alerts.rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(shipped, chart) {
		t.Fatal("deploy/helm/muster/files/muster-alerts.rules.yml differs from deploy/prometheus/muster-alerts.rules.yml: copy it over (cp deploy/prometheus/muster-alerts.rules.yml deploy/helm/muster/files/)")
	}
}

func TestNetworkPolicyAlertTargetsAndPeerRegions(t *testing.T) {
	egress := func(set map[string]any) map[string][]string {
		np := one[*networkingv1.NetworkPolicy](t, mustRender(t, []string{"minimal.yaml"}, set))
		out := map[string][]string{}
		for _, r := range np.Spec.Egress {
			for _, to := range r.To {
				if to.IPBlock == nil {
					continue
				}
				for _, p := range r.Ports {
					out[to.IPBlock.CIDR] = append(out[to.IPBlock.CIDR], p.Port.String())
				}
			}
		}
		return out
	}
	before := egress(nil)
	if len(before) != 1 || before["0.0.0.0/0"] == nil {
		t.Fatalf("default ipBlock egress %v, want only https to 0.0.0.0/0", before)
	}
	got := egress(map[string]any{"networkPolicy": map[string]any{"egress": map[string]any{
		"alertTargets": map[string]any{"cidrs": []any{"10.20.0.0/16"}, "ports": []any{9093}},
		"peerRegions":  map[string]any{"cidrs": []any{"192.0.2.0/24", "198.51.100.7/32"}},
	}}})
	for cidr, want := range map[string][]string{
		"10.20.0.0/16":    {"9093"},
		"192.0.2.0/24":    {"443", "8080"},
		"198.51.100.7/32": {"443", "8080"},
	} {
		if !slices.Equal(got[cidr], want) {
			t.Errorf("egress to %s on %v, want %v", cidr, got[cidr], want)
		}
	}
	if _, err := render(t, []string{"minimal.yaml"}, map[string]any{"networkPolicy": map[string]any{"egress": map[string]any{
		"peerRegions": map[string]any{"cidrs": []any{"eu-west-1"}}}}}); err == nil {
		t.Error("a peer region that is not a CIDR rendered")
	}
}

// TestNetworkPolicyHTTPSAllowAll: the issuers' toggle opens 443 to every
// address (IPv6 too, which 0.0.0.0/0 misses) and nothing else; without
// it, only the listed CIDRs.
func TestNetworkPolicyHTTPSAllowAll(t *testing.T) {
	https := func(set map[string]any) []networkingv1.NetworkPolicyEgressRule {
		np := one[*networkingv1.NetworkPolicy](t, mustRender(t, []string{"minimal.yaml"}, set))
		var out []networkingv1.NetworkPolicyEgressRule
		for _, r := range np.Spec.Egress {
			for _, p := range r.Ports {
				if p.Port.String() == "443" {
					out = append(out, r)
				}
			}
		}
		return out
	}
	all := https(map[string]any{"networkPolicy": map[string]any{"egress": map[string]any{"https": map[string]any{"allowAll": true}}}})
	if len(all) != 1 || len(all[0].To) != 0 || len(all[0].Ports) != 1 {
		t.Errorf("allowAll: %+v, want one rule on 443 to any address", all)
	}
	narrow := https(map[string]any{"networkPolicy": map[string]any{"egress": map[string]any{"https": map[string]any{"cidrs": []any{"203.0.113.0/24"}}}}})
	if len(narrow) != 1 || len(narrow[0].To) != 1 || narrow[0].To[0].IPBlock == nil || narrow[0].To[0].IPBlock.CIDR != "203.0.113.0/24" {
		t.Errorf("narrowed: %+v", narrow)
	}
	if none := https(map[string]any{"networkPolicy": map[string]any{"egress": map[string]any{"https": map[string]any{"cidrs": []any{}}}}}); len(none) != 0 {
		t.Errorf("no https CIDRs: %+v, want no rule", none)
	}
}

// TestMonitoringDecoderRefuses shows the Prometheus Operator kinds are
// decoded strictly too: a field the CRD lacks, or one misplaced, fails.
func TestMonitoringDecoderRefuses(t *testing.T) {
	good := "apiVersion: monitoring.coreos.com/v1\nkind: ServiceMonitor\nmetadata: {name: m}\nspec:\n  selector: {}\n  namespaceSelector: {}\n  endpoints: [{port: metrics}]\n"
	if _, _, err := decodeStrict([]byte(good)); err != nil {
		t.Fatalf("a good ServiceMonitor: %v", err)
	}
	for _, bad := range []string{
		strings.Replace(good, "port: metrics", "port: metrics, relabeling: []", 1),
		strings.Replace(good, "selector: {}", "selector: {}\n  interval: 30s", 1),
		"apiVersion: monitoring.coreos.com/v1\nkind: PrometheusRule\nmetadata: {name: r}\nspec:\n  groups: [{name: g, rules: [{alert: A, expr: up, severity: page}]}]\n",
		"apiVersion: monitoring.coreos.com/v1\nkind: PodMonitor\nmetadata: {name: p}\n",
	} {
		if _, _, err := decodeStrict([]byte(bad)); err == nil {
			t.Errorf("decoded:\n%s", bad)
		}
	}
}
