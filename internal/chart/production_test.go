package chart_test

import (
	"bytes"
	"net/url"
	"os"
	"path"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/common"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
)

const (
	productionValues = "production.yaml"
	productionDoc    = "../../docs/production.md"
	// productionMarker precedes, in docs/production.md, the fenced YAML
	// block that must equal testdata/production.yaml.
	productionMarker = "<!-- internal/chart/testdata/production.yaml -->"
)

// docBlock returns the fenced block that follows marker in the Markdown
// file at p.
func docBlock(t *testing.T, p, marker string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Count(b, []byte(marker)) != 1 {
		t.Fatalf("%s: want the marker %q once", p, marker)
	}
	_, after, _ := bytes.Cut(b, []byte(marker))
	after = bytes.TrimLeft(after, "\n")
	fence, rest, ok := bytes.Cut(after, []byte("\n"))
	if !ok || !bytes.HasPrefix(fence, []byte("```")) {
		t.Fatalf("%s: the marker is not followed by a fenced block", p)
	}
	block, _, ok := bytes.Cut(rest, []byte("```\n"))
	if !ok {
		t.Fatalf("%s: the block after the marker is not closed", p)
	}
	return block
}

// TestProductionValuesAreTheDocs: the values the production test renders
// are the block docs/production.md gives operators, byte for byte.
func TestProductionValuesAreTheDocs(t *testing.T) {
	file, err := os.ReadFile("testdata/" + productionValues)
	if err != nil {
		t.Fatal(err)
	}
	if doc := docBlock(t, productionDoc, productionMarker); !bytes.Equal(doc, file) {
		t.Fatalf("docs/production.md's values block differs from testdata/%s: copy one over the other\n--- docs:\n%s\n--- testdata:\n%s", productionValues, doc, file)
	}
}

// TestProductionValues renders the production of docs/production.md,
// decodes every document strictly, lints it strictly, and checks each
// part the page describes is in the rendered objects, and that every file
// the container is told about lies in one of its mounts.
func TestProductionValues(t *testing.T) {
	o := mustRender(t, []string{productionValues}, nil)

	kv, err := common.ParseKubeVersion("v1.33.0")
	if err != nil {
		t.Fatal(err)
	}
	vals, err := common.ReadValuesFile("testdata/" + productionValues)
	if err != nil {
		t.Fatal(err)
	}
	l := action.NewLint()
	l.Strict, l.Namespace, l.KubeVersion = true, namespace, kv
	if res := l.Run([]string{chartDir}, vals); res.TotalChartsLinted != 1 || len(res.Errors) > 0 {
		t.Errorf("lint --strict: %v", res.Errors)
	}

	sts := one[*appsv1.StatefulSet](t, o)
	if sts.Spec.Replicas == nil || *sts.Spec.Replicas != 3 {
		t.Errorf("replicas %v, want 3", sts.Spec.Replicas)
	}
	pod := sts.Spec.Template.Spec
	c := container(t, sts)
	e := env(c)
	want := map[string]string{
		// TLS on every listener, the peers' CA, client certificates, SPIFFE.
		"MUSTER_TLS_CERT":      "/etc/muster/tls/tls.crt",
		"MUSTER_TLS_KEY":       "/etc/muster/tls/tls.key",
		"MUSTER_TLS_CA":        "/etc/muster/tls-ca/ca.crt",
		"MUSTER_TLS_CLIENT_CA": "/etc/muster/tls-client-ca/bundle.pem",
		"MUSTER_SPIFFE":        "/etc/muster/spiffe/spiffe.yaml",
		// PROXY protocol from the NLB's subnets, read on the API and xDS.
		"MUSTER_PROXY_PROTOCOL_FROM": "10.0.64.0/24,10.0.65.0/24,10.0.66.0/24",
		"MUSTER_XDS_ADDR":            ":18000",
		"MUSTER_METRICS_ADDR":        "[$(POD_IP)]:9464",
		// Aurora IAM, verified against the RDS bundle.
		"MUSTER_DB_IAM":        "1",
		"MUSTER_DB_IAM_REGION": "eu-west-1",
		"PGSSLMODE":            "verify-full",
		"PGSSLROOTCERT":        "/etc/muster/rds-ca/global-bundle.pem",
		// Peer regions, alert targets and their CAs.
		"MUSTER_PEER_REGIONS":  "us-east-1=https://muster.us-east-1.example.com,ap-southeast-2=https://muster.ap-southeast-2.example.com",
		"MUSTER_PEER_TOKENS":   "us-east-1=/etc/muster/peer-tokens/us-east-1,ap-southeast-2=/etc/muster/peer-tokens/ap-southeast-2",
		"MUSTER_PEER_CAS":      "us-east-1=/etc/muster/cas/us-east-1.pem,ap-southeast-2=/etc/muster/cas/ap-southeast-2.pem",
		"MUSTER_ALERT_TARGETS": "/etc/muster/alerts/targets.yaml",
		// 90% of the 2Gi limit.
		"GOMEMLIMIT": "1932735283",
		"MUSTER_PEERS": "https://muster-0.muster-peers.muster.svc.cluster.local:8080," +
			"https://muster-1.muster-peers.muster.svc.cluster.local:8080,https://muster-2.muster-peers.muster.svc.cluster.local:8080",
	}
	for k, v := range want {
		if got := e[k]; got.Value != v || got.ValueFrom != nil {
			t.Errorf("%s = %q (from %v), want %q", k, got.Value, got.ValueFrom, v)
		}
	}
	db, err := url.Parse(e["DATABASE_URL"].Value)
	if err != nil || db.Query().Get("sslmode") != "verify-full" || db.User == nil || db.User.Username() != "muster_app" {
		t.Errorf("DATABASE_URL %q: want muster_app with sslmode=verify-full (%v)", e["DATABASE_URL"].Value, err)
	}
	if _, pw := db.User.Password(); pw {
		t.Errorf("DATABASE_URL carries a password with IAM")
	}
	// xDS serves the API's pair (one reloader, client certificates asked).
	if !slices.Contains(c.Args, "--xds-tls-cert=/etc/muster/tls/tls.crt") || !slices.Contains(c.Args, "--xds-tls-key=/etc/muster/tls/tls.key") {
		t.Errorf("args %v: want xDS on the API's pair", c.Args)
	}

	// Every file named in the arguments and environment is inside a mount
	// of a volume the pod has, so it exists in the pod.
	vols := map[string]corev1.Volume{}
	for _, v := range pod.Volumes {
		vols[v.Name] = v
	}
	mounted := func(p string) *corev1.VolumeMount {
		for i, m := range c.VolumeMounts {
			if strings.HasPrefix(p, strings.TrimSuffix(m.MountPath, "/")+"/") {
				return &c.VolumeMounts[i]
			}
		}
		return nil
	}
	var files []string
	for _, a := range c.Args {
		if _, v, ok := strings.Cut(a, "="); ok && strings.HasPrefix(v, "/") {
			files = append(files, v)
		}
	}
	for _, ev := range c.Env {
		for _, item := range strings.Split(ev.Value, ",") {
			if i := strings.Index(item, "=/"); i >= 0 {
				item = item[i+1:]
			}
			if strings.HasPrefix(item, "/") {
				files = append(files, item)
			}
		}
	}
	if len(files) < 14 {
		t.Fatalf("only %d files named: %v", len(files), files)
	}
	for _, f := range files {
		m := mounted(path.Clean(f))
		if m == nil {
			t.Errorf("%s is in no mount of the container", f)
			continue
		}
		v, ok := vols[m.Name]
		if !ok {
			t.Errorf("%s: mount %s names no volume", f, m.Name)
		}
		if !m.ReadOnly && m.MountPath != "/tmp" {
			t.Errorf("%s: mount %s is writable", f, m.MountPath)
		}
		// A volume that lists its items must list this file.
		var items []corev1.KeyToPath
		switch {
		case v.Secret != nil:
			items = v.Secret.Items
		case v.ConfigMap != nil:
			items = v.ConfigMap.Items
		}
		rel := strings.TrimPrefix(f, strings.TrimSuffix(m.MountPath, "/")+"/")
		if len(items) > 0 && !slices.ContainsFunc(items, func(k corev1.KeyToPath) bool { return k.Path == rel }) {
			t.Errorf("%s: volume %s projects %v, not %s", f, v.Name, items, rel)
		}
	}
	if v := vols["rds-ca"]; v.ConfigMap == nil || v.ConfigMap.Name != "rds-ca-bundle" {
		t.Errorf("rds-ca volume %+v, want the rds-ca-bundle ConfigMap", v)
	}
	if v := vols["peer-tokens"]; v.Secret == nil || v.Secret.SecretName != "muster-peer-tokens" {
		t.Errorf("peer-tokens volume %+v", v)
	}

	// IRSA for the IAM tokens.
	var sa *corev1.ServiceAccount
	for _, s := range of[*corev1.ServiceAccount](o) {
		sa = s
	}
	if sa == nil || sa.Annotations["eks.amazonaws.com/role-arn"] != "arn:aws:iam::123456789012:role/muster-aurora" {
		t.Errorf("service account %+v: want the IRSA role", sa)
	}

	// The NLB: a LoadBalancer Service with the PROXY protocol annotation,
	// fronting the API and xDS.
	var lb *corev1.Service
	for _, s := range of[*corev1.Service](o) {
		if s.Spec.Type == corev1.ServiceTypeLoadBalancer {
			lb = s
		}
	}
	if lb == nil || lb.Annotations["service.beta.kubernetes.io/aws-load-balancer-proxy-protocol"] != "*" {
		t.Fatalf("no LoadBalancer Service with the PROXY protocol annotation: %+v", lb)
	}
	var lbPorts []int32
	for _, p := range lb.Spec.Ports {
		lbPorts = append(lbPorts, p.Port)
	}
	if !slices.Contains(lbPorts, 8080) || !slices.Contains(lbPorts, 18000) {
		t.Errorf("the NLB fronts ports %v, want the API's and xDS's", lbPorts)
	}

	// Egress to the database, the alert targets and the peer regions.
	np := one[*networkingv1.NetworkPolicy](t, o)
	egress := map[string][]int32{}
	for _, r := range np.Spec.Egress {
		for _, to := range r.To {
			if to.IPBlock == nil {
				continue
			}
			for _, p := range r.Ports {
				if p.Port != nil {
					egress[to.IPBlock.CIDR] = append(egress[to.IPBlock.CIDR], p.Port.IntVal)
				}
			}
		}
	}
	for cidr, port := range map[string]int32{"10.0.32.0/20": 5432, "10.100.0.0/16": 9093, "10.64.0.0/16": 443, "10.65.0.0/16": 443} {
		if !slices.Contains(egress[cidr], port) {
			t.Errorf("no egress to %s port %d (egress %v)", cidr, port, egress)
		}
	}

	// The Prometheus Operator's objects, scraping https.
	sm := one[*serviceMonitor](t, o)
	if sm.Labels["release"] != "kube-prometheus-stack" || len(sm.Spec.Endpoints) != 1 || sm.Spec.Endpoints[0].Scheme != "https" {
		t.Errorf("ServiceMonitor %+v: want https scrapes selected by release", sm)
	}
	pr := one[*prometheusRule](t, o)
	if pr.Labels["release"] != "kube-prometheus-stack" || len(pr.Spec.Groups) == 0 {
		t.Errorf("PrometheusRule %+v: want the rules selected by release", pr.ObjectMeta)
	}
}
