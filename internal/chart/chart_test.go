// Package chart_test renders the Helm chart in deploy/helm/muster with
// Helm's own Go library (the loader, values.schema.json validation and the
// engine, through a client-only install as `helm template` runs it) for
// the values files in testdata/, decodes every rendered object strictly
// into the Kubernetes API types, and checks what the chart promises.
package chart_test

import (
	"bufio"
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"io"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/loader"
	release "helm.sh/helm/v4/pkg/release/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/json"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/musterhq/muster/internal/reconcile"
)

const (
	chartDir    = "../../deploy/helm/muster"
	releaseName = "muster"
	namespace   = "muster"
)

// expectedKinds are the only kinds the chart may render.
var expectedKinds = []string{"StatefulSet", "Service", "PodDisruptionBudget", "NetworkPolicy", "ServiceAccount",
	"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ConfigMap",
	"ServiceMonitor", "PrometheusRule", "Job"}

// strictDecoder decodes YAML into the Kubernetes API types and refuses
// unknown and duplicate fields.
var strictDecoder = json.NewSerializerWithOptions(json.DefaultMetaFactory, scheme.Scheme, scheme.Scheme,
	json.SerializerOptions{Yaml: true, Strict: true})

// render renders the chart as `helm template` would, with the values files
// (from testdata) merged in order and then set over them.
func render(t *testing.T, files []string, set map[string]any) (string, error) {
	t.Helper()
	return renderOn(t, "v1.33.0", files, set)
}

// renderOn renders as render does, for a cluster of the given version.
func renderOn(t *testing.T, kubeVersion string, files []string, set map[string]any) (string, error) {
	t.Helper()
	manifest, _, err := renderRelease(t, kubeVersion, files, set)
	return manifest, err
}

// renderHooks renders as render does and returns the Helm hooks (which
// Helm keeps out of the release's manifest) as one manifest.
func renderHooks(t *testing.T, files []string, set map[string]any) (string, error) {
	t.Helper()
	_, hooks, err := renderRelease(t, "v1.33.0", files, set)
	return hooks, err
}

// renderRelease renders the release's objects and, apart, its hooks.
func renderRelease(t *testing.T, kubeVersion string, files []string, set map[string]any) (manifest, hooks string, err error) {
	t.Helper()
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatalf("load the chart: %v", err)
	}
	vals := map[string]any{}
	for _, f := range files {
		v, err := common.ReadValuesFile(filepath.Join("testdata", f))
		if err != nil {
			t.Fatalf("values %s: %v", f, err)
		}
		merge(vals, v)
	}
	merge(vals, set)
	install := action.NewInstall(action.NewConfiguration())
	install.DryRunStrategy = action.DryRunClient
	install.ReleaseName, install.Namespace = releaseName, namespace
	if install.KubeVersion, err = common.ParseKubeVersion(kubeVersion); err != nil {
		t.Fatal(err)
	}
	rel, err := install.Run(ch, vals)
	if err != nil {
		return "", "", err
	}
	r, ok := rel.(*release.Release)
	if !ok {
		t.Fatalf("install returned a %T", rel)
	}
	var hb strings.Builder
	for _, h := range r.Hooks {
		hb.WriteString("---\n# Source: " + h.Path + "\n" + h.Manifest + "\n")
	}
	return r.Manifest, hb.String(), nil
}

// merge sets src over dst, maps merged key by key.
func merge(dst, src map[string]any) {
	for k, v := range src {
		if sm, ok := v.(map[string]any); ok {
			if dm, ok := dst[k].(map[string]any); ok {
				merge(dm, sm)
				continue
			}
			cp := map[string]any{}
			merge(cp, sm)
			dst[k] = cp
			continue
		}
		dst[k] = v
	}
}

// objects is a rendering decoded: every document, strictly.
type objects struct {
	all []runtime.Object
}

// decodeAll splits the manifest into its YAML documents and decodes each
// strictly; a document that does not decode whole fails the test.
func decodeAll(t *testing.T, manifest string) objects {
	t.Helper()
	r := utilyaml.NewYAMLReader(bufio.NewReader(strings.NewReader(manifest)))
	var out objects
	docs := 0
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("split the manifest: %v", err)
		}
		if isBlank(doc) {
			continue
		}
		docs++
		obj, gvk, err := decodeStrict(doc)
		if err != nil {
			t.Fatalf("document %d does not decode strictly: %v\n%s", docs, err, doc)
		}
		if !slices.Contains(expectedKinds, gvk.Kind) {
			t.Errorf("unexpected kind %s", gvk)
		}
		out.all = append(out.all, obj)
	}
	if docs == 0 || len(out.all) != docs {
		t.Fatalf("decoded %d of %d documents", len(out.all), docs)
	}
	return out
}

// isBlank reports whether a YAML document holds only comments and space.
func isBlank(doc []byte) bool {
	for _, line := range strings.Split(string(doc), "\n") {
		if l := strings.TrimSpace(line); l != "" && l != "---" && !strings.HasPrefix(l, "#") {
			return false
		}
	}
	return true
}

func of[T runtime.Object](o objects) []T {
	var out []T
	for _, obj := range o.all {
		if v, ok := obj.(T); ok {
			out = append(out, v)
		}
	}
	return out
}

func one[T runtime.Object](t *testing.T, o objects) T {
	t.Helper()
	all := of[T](o)
	if len(all) != 1 {
		var zero T
		t.Fatalf("want one %T, got %d", zero, len(all))
	}
	return all[0]
}

func mustRender(t *testing.T, files []string, set map[string]any) objects {
	t.Helper()
	m, err := render(t, files, set)
	if err != nil {
		t.Fatalf("render %v: %v", files, err)
	}
	return decodeAll(t, m)
}

func container(t *testing.T, sts *appsv1.StatefulSet) corev1.Container {
	t.Helper()
	for _, c := range sts.Spec.Template.Spec.Containers {
		if c.Name == "muster" {
			return c
		}
	}
	t.Fatal("no muster container")
	return corev1.Container{}
}

func env(c corev1.Container) map[string]corev1.EnvVar {
	m := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		m[e.Name] = e
	}
	return m
}

// generatedKey is a fresh Ed25519 key in PKCS #8 PEM, for the values that
// create the key's Secret (no key is kept in the repository).
func generatedKey(t *testing.T) string {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}))
}

// variants are every values file with what it needs set.
func variants(t *testing.T) map[string]map[string]any {
	return map[string]map[string]any{
		"minimal.yaml":    nil,
		"tls-mtls.yaml":   nil,
		"aurora-iam.yaml": nil,
		"proxy-nlb.yaml":  nil,
		"reconcile.yaml":  nil,
		"extras.yaml":     nil,
		"monitoring.yaml": nil,
		"single.yaml":     nil,
	}
}

func TestEveryVariantDecodesStrictly(t *testing.T) {
	for _, f := range slices.Sorted(maps.Keys(variants(t))) {
		t.Run(f, func(t *testing.T) {
			o := mustRender(t, []string{f}, variants(t)[f])
			one[*appsv1.StatefulSet](t, o)
			if n := len(of[*corev1.Service](o)); n != 2 {
				t.Errorf("want the API Service and the headless one, got %d Services", n)
			}
			hooks, err := renderHooks(t, []string{f}, variants(t)[f])
			if err != nil {
				t.Fatal(err)
			}
			one[*batchv1.Job](t, decodeAll(t, hooks))
		})
	}
}

func TestDefaults(t *testing.T) {
	o := mustRender(t, []string{"minimal.yaml"}, nil)
	sts := one[*appsv1.StatefulSet](t, o)
	if sts.Spec.Replicas == nil || *sts.Spec.Replicas != 3 {
		t.Errorf("replicas = %v, want 3", sts.Spec.Replicas)
	}
	pod := sts.Spec.Template

	// The PDB selects the StatefulSet's pods, and only through its labels.
	pdb := one[*policyv1.PodDisruptionBudget](t, o)
	if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 1 {
		t.Errorf("PDB maxUnavailable = %v, want 1", pdb.Spec.MaxUnavailable)
	}
	sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
	if err != nil || sel.Empty() || !sel.Matches(labels.Set(pod.Labels)) {
		t.Errorf("the PDB's selector %v does not select the pods %v (%v)", pdb.Spec.Selector, pod.Labels, err)
	}
	stsSel, _ := metav1.LabelSelectorAsSelector(sts.Spec.Selector)
	if !stsSel.Matches(labels.Set(pod.Labels)) {
		t.Errorf("the StatefulSet's selector does not select its own pods")
	}

	c := container(t, sts)
	if p := c.ReadinessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/readyz" || p.HTTPGet.Scheme != corev1.URISchemeHTTPS {
		t.Errorf("readiness probe = %+v, want HTTPS GET /readyz", p)
	}
	if p := c.ReadinessProbe; p != nil && p.TimeoutSeconds <= 2 {
		t.Errorf("readiness timeout %d s: /readyz may take its own 2 s deadline", p.TimeoutSeconds)
	}
	if p := c.LivenessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/healthz" {
		t.Errorf("liveness probe = %+v, want HTTP GET /healthz (the route server/ serves)", p)
	}
	if c.Lifecycle == nil || c.Lifecycle.PreStop == nil || c.Lifecycle.PreStop.Sleep == nil || c.Lifecycle.PreStop.Sleep.Seconds < 1 {
		t.Fatalf("preStop = %+v, want a sleep action", c.Lifecycle)
	}
	grace := pod.Spec.TerminationGracePeriodSeconds
	if grace == nil || *grace < c.Lifecycle.PreStop.Sleep.Seconds+45 {
		t.Errorf("terminationGracePeriodSeconds %v leaves muster less than 45 s after the preStop pause", grace)
	}

	// Non-root, no shell: nothing execs, in any container.
	psc := pod.Spec.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser != 65532 ||
		psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod securityContext = %+v", psc)
	}
	for _, ct := range append(slices.Clone(pod.Spec.InitContainers), pod.Spec.Containers...) {
		sc := ct.SecurityContext
		if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.RunAsUser == nil || *sc.RunAsUser != 65532 ||
			sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
			sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
			sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0 {
			t.Errorf("container %s securityContext = %+v", ct.Name, sc)
		}
		for _, p := range []*corev1.Probe{ct.ReadinessProbe, ct.LivenessProbe, ct.StartupProbe} {
			if p != nil && p.Exec != nil {
				t.Errorf("container %s has an exec probe: the image has no shell", ct.Name)
			}
		}
		if l := ct.Lifecycle; l != nil && ((l.PreStop != nil && l.PreStop.Exec != nil) || (l.PostStart != nil && l.PostStart.Exec != nil)) {
			t.Errorf("container %s has an exec lifecycle hook", ct.Name)
		}
		if len(ct.Command) > 0 && slices.Contains([]string{"sh", "bash", "/bin/sh", "/bin/bash", "ash"}, ct.Command[0]) {
			t.Errorf("container %s runs a shell: %v", ct.Name, ct.Command)
		}
	}

	// Spread over zones and nodes.
	keys := map[string]bool{}
	for _, tsc := range pod.Spec.TopologySpreadConstraints {
		keys[tsc.TopologyKey] = true
		if s, _ := metav1.LabelSelectorAsSelector(tsc.LabelSelector); !s.Matches(labels.Set(pod.Labels)) {
			t.Errorf("spread over %s does not count muster's pods", tsc.TopologyKey)
		}
	}
	if !keys["topology.kubernetes.io/zone"] || !keys["kubernetes.io/hostname"] {
		t.Errorf("topology spread keys = %v, want zone and hostname", keys)
	}

	// Every replica is named in MUSTER_PEERS by its stable DNS name, under
	// the headless Service the StatefulSet names.
	e := env(c)
	want := []string{
		"https://muster-0.muster-peers.muster.svc.cluster.local:8080",
		"https://muster-1.muster-peers.muster.svc.cluster.local:8080",
		"https://muster-2.muster-peers.muster.svc.cluster.local:8080",
	}
	if got := e["MUSTER_PEERS"].Value; got != strings.Join(want, ",") {
		t.Errorf("MUSTER_PEERS = %q, want %q", got, strings.Join(want, ","))
	}
	if e["MUSTER_REPLICA"].Value != "$(POD_NAME)" || e["POD_NAME"].ValueFrom == nil || e["POD_NAME"].ValueFrom.FieldRef.FieldPath != "metadata.name" {
		t.Errorf("MUSTER_REPLICA is not the pod's name: %+v", e["MUSTER_REPLICA"])
	}
	// Each replica registers the name its peers list it under, so it
	// leaves itself out of MUSTER_PEERS and a certificate for the
	// headless Service's names fits every peer call.
	if got := e["MUSTER_ADVERTISE_URL"].Value; got != "https://$(POD_NAME).muster-peers.muster.svc.cluster.local:8080" {
		t.Errorf("MUSTER_ADVERTISE_URL = %q, want the pod's stable name", got)
	}
	if !slices.Contains(c.Args, "--addr=:8080") {
		t.Errorf("args %v: the API must listen on every interface (port-forward, the pod IP and its name alike)", c.Args)
	}
	var headless *corev1.Service
	for _, s := range of[*corev1.Service](o) {
		if s.Name == sts.Spec.ServiceName {
			headless = s
		}
	}
	if headless == nil || headless.Spec.ClusterIP != corev1.ClusterIPNone || !headless.Spec.PublishNotReadyAddresses {
		t.Errorf("the StatefulSet's service %q is not a headless Service publishing not-ready pods: %+v", sts.Spec.ServiceName, headless)
	}

	// The database URL comes from the Secret.
	if db := e["DATABASE_URL"]; db.Value != "" || db.ValueFrom == nil || db.ValueFrom.SecretKeyRef == nil || db.ValueFrom.SecretKeyRef.Name != "muster-database" {
		t.Errorf("DATABASE_URL = %+v, want from Secret muster-database", db)
	}
	if e["MUSTER_AUDIT_SIGNING_KEY_FILE"].Value != "/var/run/muster/signing-key/signing.key" {
		t.Errorf("MUSTER_AUDIT_SIGNING_KEY_FILE = %q", e["MUSTER_AUDIT_SIGNING_KEY_FILE"].Value)
	}
	// The key is the Secret's file, mode 0440 under the pod's fsGroup
	// (muster accepts a key its own group may read), no init container.
	if len(pod.Spec.InitContainers) != 0 {
		t.Errorf("init containers = %+v, want none", pod.Spec.InitContainers)
	}
	if sc := pod.Spec.SecurityContext; sc == nil || sc.FSGroup == nil || *sc.FSGroup != 65532 {
		t.Errorf("pod securityContext %+v, want fsGroup 65532 (the key's group)", sc)
	}
	var keyVol *corev1.SecretVolumeSource
	for _, v := range pod.Spec.Volumes {
		if v.Name == "signing-key" {
			keyVol = v.Secret
		}
	}
	if keyVol == nil || keyVol.DefaultMode == nil || *keyVol.DefaultMode != 0o440 || len(keyVol.Items) != 1 || keyVol.Items[0].Path != "signing.key" {
		t.Errorf("the key's Secret volume %+v, want signing.key mode 0440", keyVol)
	}
	for _, name := range []string{"MUSTER_PEER_ALLOW_HTTP", "MUSTER_DB_IAM", "PGSSLMODE", "MUSTER_PROXY_PROTOCOL_FROM"} {
		if _, ok := e[name]; ok {
			t.Errorf("%s is set by default", name)
		}
	}
	if len(of[*rbacv1.ClusterRole](o))+len(of[*rbacv1.Role](o)) != 0 {
		t.Error("RBAC rendered without reconciliation")
	}
	if pod.Spec.AutomountServiceAccountToken == nil || *pod.Spec.AutomountServiceAccountToken {
		t.Error("the API token is mounted without reconciliation")
	}

	// Every Service port points at a port the container has.
	ports := map[string]bool{}
	for _, p := range c.Ports {
		ports[p.Name] = true
	}
	for _, s := range of[*corev1.Service](o) {
		sel := labels.SelectorFromSet(s.Spec.Selector)
		if !sel.Matches(labels.Set(pod.Labels)) {
			t.Errorf("Service %s does not select muster's pods", s.Name)
		}
		for _, p := range s.Spec.Ports {
			if !ports[p.TargetPort.String()] {
				t.Errorf("Service %s port %s targets %s, which the container does not have", s.Name, p.Name, p.TargetPort.String())
			}
		}
	}
}

func TestTLSAndMutualTLS(t *testing.T) {
	o := mustRender(t, []string{"tls-mtls.yaml"}, nil)
	sts := one[*appsv1.StatefulSet](t, o)
	c := container(t, sts)
	e := env(c)
	vols := map[string]corev1.Volume{}
	for _, v := range sts.Spec.Template.Spec.Volumes {
		vols[v.Name] = v
	}
	// mountOf finds the read-only mount a path lies in, and the Secret behind it.
	mountOf := func(path string) (corev1.VolumeMount, string) {
		for _, m := range c.VolumeMounts {
			if strings.HasPrefix(path, strings.TrimSuffix(m.MountPath, "/")+"/") {
				if v, ok := vols[m.Name]; ok && v.Secret != nil {
					return m, v.Secret.SecretName
				}
			}
		}
		return corev1.VolumeMount{}, ""
	}
	for name, secret := range map[string]string{
		"MUSTER_TLS_CERT":      "muster-tls",
		"MUSTER_TLS_KEY":       "muster-tls",
		"MUSTER_TLS_CA":        "muster-tls",
		"MUSTER_TLS_CLIENT_CA": "muster-client-ca",
	} {
		path := e[name].Value
		m, got := mountOf(path)
		if path == "" || got != secret || !m.ReadOnly {
			t.Errorf("%s = %q: want a file in a read-only mount of Secret %s (mount %+v, Secret %q)", name, path, secret, m, got)
		}
	}
	if !strings.HasSuffix(e["MUSTER_TLS_CERT"].Value, "/tls.crt") || !strings.HasSuffix(e["MUSTER_TLS_KEY"].Value, "/tls.key") {
		t.Errorf("MUSTER_TLS_CERT/KEY = %q, %q: want the kubernetes.io/tls keys", e["MUSTER_TLS_CERT"].Value, e["MUSTER_TLS_KEY"].Value)
	}
	for _, p := range []*corev1.Probe{c.ReadinessProbe, c.LivenessProbe, c.StartupProbe} {
		if p.HTTPGet.Scheme != corev1.URISchemeHTTPS {
			t.Errorf("probe %s over %s, want HTTPS", p.HTTPGet.Path, p.HTTPGet.Scheme)
		}
	}
	if !strings.HasPrefix(e["MUSTER_PEERS"].Value, "https://") {
		t.Errorf("MUSTER_PEERS = %q, want https URLs", e["MUSTER_PEERS"].Value)
	}
	if !slices.Contains(c.Args, "--xds-tls-cert=/etc/muster/tls/tls.crt") {
		t.Errorf("args %v: xDS without TLS", c.Args)
	}
}

func TestAuroraIAMAndIRSA(t *testing.T) {
	const arn = "arn:aws:iam::123456789012:role/muster-aurora"
	o := mustRender(t, []string{"aurora-iam.yaml"}, nil)
	e := env(container(t, one[*appsv1.StatefulSet](t, o)))
	if e["MUSTER_DB_IAM"].Value != "1" || e["MUSTER_DB_IAM_REGION"].Value != "eu-west-1" {
		t.Errorf("MUSTER_DB_IAM = %q, MUSTER_DB_IAM_REGION = %q", e["MUSTER_DB_IAM"].Value, e["MUSTER_DB_IAM_REGION"].Value)
	}
	if u := e["DATABASE_URL"].Value; !strings.HasPrefix(u, "postgres://muster@") {
		t.Errorf("DATABASE_URL = %q, want a user and no password", u)
	}
	// The token goes only to a server verified against the RDS CA
	// bundle, mounted read-only from the ConfigMap named.
	sts := one[*appsv1.StatefulSet](t, o)
	c := container(t, sts)
	if e["PGSSLMODE"].Value != "verify-full" || e["PGSSLROOTCERT"].Value != "/etc/muster/rds-ca/global-bundle.pem" {
		t.Errorf("PGSSLMODE = %q, PGSSLROOTCERT = %q; want verify-full and the mounted bundle", e["PGSSLMODE"].Value, e["PGSSLROOTCERT"].Value)
	}
	mounted := false
	for _, m := range c.VolumeMounts {
		if m.MountPath == "/etc/muster/rds-ca" && m.ReadOnly {
			for _, v := range sts.Spec.Template.Spec.Volumes {
				mounted = mounted || (v.Name == m.Name && v.ConfigMap != nil && v.ConfigMap.Name == "rds-ca-bundle" &&
					len(v.ConfigMap.Items) == 1 && v.ConfigMap.Items[0].Key == "global-bundle.pem")
			}
		}
	}
	if !mounted {
		t.Error("the RDS CA bundle's ConfigMap is not mounted read-only at /etc/muster/rds-ca")
	}
	// Without a ConfigMap of its own the server is still verified
	// (verify-full), against the RDS bundle built into muster: no
	// PGSSLROOTCERT, no volume, and the render names no empty ConfigMap.
	noBundle := one[*appsv1.StatefulSet](t, mustRender(t, []string{"aurora-iam.yaml"}, map[string]any{
		"database": map[string]any{"iam": map[string]any{"caBundle": map[string]any{"configMap": ""}}}}))
	nc := container(t, noBundle)
	ne := env(nc)
	if _, set := ne["PGSSLROOTCERT"]; set || ne["PGSSLMODE"].Value != "verify-full" || ne["MUSTER_DB_IAM"].Value != "1" {
		t.Errorf("IAM without caBundle: PGSSLMODE = %q, PGSSLROOTCERT set %t; want verify-full against the built-in bundle", ne["PGSSLMODE"].Value, set)
	}
	for _, m := range nc.VolumeMounts {
		if m.MountPath == "/etc/muster/rds-ca" {
			t.Error("IAM without caBundle mounts /etc/muster/rds-ca")
		}
	}
	for _, v := range noBundle.Spec.Template.Spec.Volumes {
		if v.Name == "rds-ca" {
			t.Errorf("IAM without caBundle has the rds-ca volume %+v", v)
		}
	}
	sa := one[*corev1.ServiceAccount](t, o)
	if sa.Annotations["eks.amazonaws.com/role-arn"] != arn {
		t.Errorf("ServiceAccount annotations = %v, want the IRSA role", sa.Annotations)
	}
	if sts := one[*appsv1.StatefulSet](t, o); sts.Spec.Template.Spec.ServiceAccountName != sa.Name {
		t.Errorf("pods run as %q, not the annotated ServiceAccount %q", sts.Spec.Template.Spec.ServiceAccountName, sa.Name)
	}
	// The annotation is in the IAM values only.
	for f, set := range variants(t) {
		if f == "aurora-iam.yaml" {
			continue
		}
		for _, sa := range of[*corev1.ServiceAccount](mustRender(t, []string{f}, set)) {
			if _, ok := sa.Annotations["eks.amazonaws.com/role-arn"]; ok {
				t.Errorf("%s: the IRSA annotation is set", f)
			}
		}
	}
}

// TestReplicasNeedTLS: more than one replica renders only with TLS
// between them, as the replicas refuse to follow a peer advertising
// plain http: every peer URL and each replica's advertised URL are then
// https, and MUSTER_TLS_CA, what a replica verifies its peers'
// certificates with, is the CA file of the Secret tls.ca names. Without
// TLS the render fails with a message naming what to set (tested in
// TestBadValuesFailToRender); one replica has no peers and renders on
// http; tls.allowPlainPeers (a lab) renders http with
// MUSTER_PEER_ALLOW_HTTP.
func TestReplicasNeedTLS(t *testing.T) {
	peerURLs := func(e map[string]corev1.EnvVar) []string {
		return append(strings.Split(e["MUSTER_PEERS"].Value, ","), e["MUSTER_ADVERTISE_URL"].Value)
	}
	t.Run("TLS", func(t *testing.T) {
		sts := one[*appsv1.StatefulSet](t, mustRender(t, []string{"minimal.yaml"}, map[string]any{"replicaCount": 5}))
		c := container(t, sts)
		e := env(c)
		urls := peerURLs(e)
		if len(urls) != 6 {
			t.Fatalf("peer URLs %v, want 5 peers and the advertised one", urls)
		}
		for _, u := range urls {
			if !strings.HasPrefix(u, "https://") || !strings.Contains(u, ".muster-peers.muster.svc.cluster.local:8080") {
				t.Errorf("peer URL %q, want https on the headless Service's names", u)
			}
		}
		if _, ok := e["MUSTER_PEER_ALLOW_HTTP"]; ok {
			t.Error("MUSTER_PEER_ALLOW_HTTP set with TLS")
		}
		// MUSTER_TLS_CA is the key tls.ca names, in a read-only mount of
		// the Secret tls.ca names.
		ca := e["MUSTER_TLS_CA"].Value
		var secret, key string
		for _, m := range c.VolumeMounts {
			if dir := strings.TrimSuffix(m.MountPath, "/") + "/"; strings.HasPrefix(ca, dir) && m.ReadOnly {
				for _, v := range sts.Spec.Template.Spec.Volumes {
					if v.Name == m.Name && v.Secret != nil {
						secret = v.Secret.SecretName
						for _, it := range v.Secret.Items {
							if it.Path == strings.TrimPrefix(ca, dir) {
								key = it.Key
							}
						}
					}
				}
			}
		}
		if secret != "muster-tls" || key != "ca.crt" {
			t.Errorf("MUSTER_TLS_CA = %q is key %q of Secret %q, want ca.crt of muster-tls (tls.ca)", ca, key, secret)
		}
	})
	t.Run("one replica", func(t *testing.T) {
		o := mustRender(t, []string{"single.yaml"}, variants(t)["single.yaml"])
		e := env(container(t, one[*appsv1.StatefulSet](t, o)))
		// One replica has no peer to follow, but muster refuses to start
		// advertising plain http off loopback unless told: the chart tells it.
		if e["MUSTER_PEER_ALLOW_HTTP"].Value != "true" || !strings.HasPrefix(e["MUSTER_ADVERTISE_URL"].Value, "http://") {
			t.Errorf("one replica: MUSTER_PEER_ALLOW_HTTP %+v, advertised %q; want plain http with the override", e["MUSTER_PEER_ALLOW_HTTP"], e["MUSTER_ADVERTISE_URL"].Value)
		}
	})
	t.Run("lab", func(t *testing.T) {
		o := mustRender(t, []string{"minimal.yaml"}, map[string]any{"tls": map[string]any{"enabled": false, "allowPlainPeers": true, "ca": map[string]any{"existingSecret": ""}}})
		e := env(container(t, one[*appsv1.StatefulSet](t, o)))
		if e["MUSTER_PEER_ALLOW_HTTP"].Value != "true" {
			t.Errorf("MUSTER_PEER_ALLOW_HTTP = %q, want true", e["MUSTER_PEER_ALLOW_HTTP"].Value)
		}
		for _, u := range peerURLs(e) {
			if !strings.HasPrefix(u, "http://") {
				t.Errorf("peer URL %q, want http in the lab", u)
			}
		}
	})
	t.Run("refused", func(t *testing.T) {
		_, err := render(t, []string{"minimal.yaml"}, map[string]any{"tls": map[string]any{"enabled": false, "ca": map[string]any{"existingSecret": ""}}})
		for _, want := range []string{"tls.enabled", "tls.existingSecret", "*.muster-peers.muster.svc.cluster.local", "tls.ca.existingSecret", "tls.allowPlainPeers=true"} {
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("3 replicas without TLS: %v; want a refusal naming %q", err, want)
			}
		}
	})
}

func TestProxyProtocolBehindAnNLB(t *testing.T) {
	o := mustRender(t, []string{"proxy-nlb.yaml"}, nil)
	e := env(container(t, one[*appsv1.StatefulSet](t, o)))
	if got := e["MUSTER_PROXY_PROTOCOL_FROM"].Value; got != "10.0.0.0/24,10.0.1.0/24" {
		t.Errorf("MUSTER_PROXY_PROTOCOL_FROM = %q", got)
	}
	var api *corev1.Service
	for _, s := range of[*corev1.Service](o) {
		if s.Spec.ClusterIP != corev1.ClusterIPNone {
			api = s
		}
	}
	if api == nil || api.Spec.Type != corev1.ServiceTypeLoadBalancer ||
		api.Annotations["service.beta.kubernetes.io/aws-load-balancer-proxy-protocol"] != "*" ||
		api.Annotations["service.beta.kubernetes.io/aws-load-balancer-nlb-target-type"] != "ip" ||
		api.Spec.ExternalTrafficPolicy != corev1.ServiceExternalTrafficPolicyLocal {
		t.Fatalf("API Service = %+v", api)
	}
	for _, p := range api.Spec.Ports {
		if p.Name == "metrics" {
			t.Error("the unauthenticated metrics port is on the load balancer")
		}
	}
	np := one[*networkingv1.NetworkPolicy](t, o)
	var cidrs []string
	for _, peer := range np.Spec.Ingress[0].From {
		if peer.IPBlock != nil {
			cidrs = append(cidrs, peer.IPBlock.CIDR)
		}
	}
	if !slices.Equal(cidrs, []string{"10.0.0.0/24", "10.0.1.0/24"}) {
		t.Errorf("API ingress from %v, want the NLB's subnets", cidrs)
	}
}

func TestReconciliationRBAC(t *testing.T) {
	check := func(t *testing.T, rules []rbacv1.PolicyRule) {
		t.Helper()
		resources := map[string]bool{}
		for _, r := range rules {
			for _, v := range r.Verbs {
				if !slices.Contains([]string{"get", "list", "watch"}, v) {
					t.Errorf("verb %q: reconciliation only reads", v)
				}
			}
			if len(r.ResourceNames) > 0 || len(r.NonResourceURLs) > 0 {
				t.Errorf("rule %+v", r)
			}
			for _, g := range r.APIGroups {
				for _, res := range r.Resources {
					resources[g+"/"+res] = true
				}
			}
		}
		want := map[string]bool{"discovery.k8s.io/endpointslices": true, "/services": true}
		if !maps.Equal(resources, want) {
			t.Errorf("resources %v, want %v (internal/reconcile/kubernetes.go's informers)", resources, want)
		}
	}
	t.Run("cluster", func(t *testing.T) {
		o := mustRender(t, []string{"reconcile.yaml"}, nil)
		sts := one[*appsv1.StatefulSet](t, o)
		check(t, one[*rbacv1.ClusterRole](t, o).Rules)
		b := one[*rbacv1.ClusterRoleBinding](t, o)
		if b.RoleRef.Name != one[*rbacv1.ClusterRole](t, o).Name || len(b.Subjects) != 1 ||
			b.Subjects[0].Name != sts.Spec.Template.Spec.ServiceAccountName || b.Subjects[0].Namespace != namespace {
			t.Errorf("binding %+v does not bind the pods' ServiceAccount", b)
		}
		c := container(t, sts)
		if !slices.Contains(c.Args, "--reconcile-config=/etc/muster/reconcile/reconcile.yaml") {
			t.Errorf("args %v", c.Args)
		}
		// The ConfigMap holds a file muster's own parser takes.
		cm := one[*corev1.ConfigMap](t, o)
		rc, err := reconcile.ParseConfig("reconcile.yaml", []byte(cm.Data["reconcile.yaml"]))
		if err != nil || len(rc.Clusters) != 1 || rc.Clusters[0].Cluster != "prod-eu" {
			t.Errorf("reconcile config %q parsed to %+v, %v", cm.Data["reconcile.yaml"], rc, err)
		}
		if a := sts.Spec.Template.Spec.AutomountServiceAccountToken; a == nil || !*a {
			t.Error("no API token mounted for the in-cluster client")
		}
		np := one[*networkingv1.NetworkPolicy](t, o)
		found := false
		for _, r := range np.Spec.Egress {
			for _, to := range r.To {
				found = found || (to.IPBlock != nil && to.IPBlock.CIDR == "172.20.0.1/32")
			}
		}
		if !found {
			t.Error("no egress to the Kubernetes API")
		}
	})
	t.Run("namespace", func(t *testing.T) {
		o := mustRender(t, []string{"single.yaml"}, variants(t)["single.yaml"])
		if n := len(of[*rbacv1.ClusterRole](o)); n != 0 {
			t.Errorf("%d ClusterRoles for a namespaced reconciliation", n)
		}
		role := one[*rbacv1.Role](t, o)
		if role.Namespace != "shop" {
			t.Errorf("Role in %q, want shop", role.Namespace)
		}
		check(t, role.Rules)
		cm := one[*corev1.ConfigMap](t, o)
		if rc, err := reconcile.ParseConfig("reconcile.yaml", []byte(cm.Data["reconcile.yaml"])); err != nil || len(rc.Clusters) != 1 || rc.Clusters[0].Namespace != role.Namespace {
			t.Errorf("reconcile config %q parsed to %+v, %v: want the Role's namespace watched", cm.Data["reconcile.yaml"], rc, err)
		}
		if b := one[*rbacv1.RoleBinding](t, o); b.Namespace != "shop" || b.Subjects[0].Namespace != namespace {
			t.Errorf("RoleBinding %+v", b)
		}
	})
}

func TestSingleReplica(t *testing.T) {
	o := mustRender(t, []string{"single.yaml"}, nil)
	sts := one[*appsv1.StatefulSet](t, o)
	if *sts.Spec.Replicas != 1 {
		t.Errorf("replicas = %d", *sts.Spec.Replicas)
	}
	if n := len(of[*policyv1.PodDisruptionBudget](o)) + len(of[*networkingv1.NetworkPolicy](o)); n != 0 {
		t.Errorf("%d PDBs and network policies, want none", n)
	}
	c := container(t, sts)
	if got := env(c)["MUSTER_PEERS"].Value; got != "http://muster-0.muster-peers.muster.svc.cluster.local:8080" {
		t.Errorf("MUSTER_PEERS = %q", got)
	}
	if want := "ghcr.io/musterhq/muster@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"; c.Image != want {
		t.Errorf("image = %q, want %q", c.Image, want)
	}
	var secretVol string
	for _, v := range sts.Spec.Template.Spec.Volumes {
		if v.Name == "signing-key" {
			secretVol = v.Secret.SecretName
		}
	}
	if secretVol != "muster-signing-key" {
		t.Errorf("the key volume mounts Secret %q, want signingKey.existingSecret's", secretVol)
	}
}

// passwordInURL matches a URL carrying user:password@.
var passwordInURL = regexp.MustCompile(`[a-zA-Z][a-zA-Z0-9+.-]*://[^/@\s]*:[^/@\s]*@`)

func TestNoLiteralPasswords(t *testing.T) {
	for f, set := range variants(t) {
		o := mustRender(t, []string{f}, set)
		sts := one[*appsv1.StatefulSet](t, o)
		for _, ct := range append(slices.Clone(sts.Spec.Template.Spec.InitContainers), sts.Spec.Template.Spec.Containers...) {
			for _, e := range ct.Env {
				if passwordInURL.MatchString(e.Value) || strings.Contains(strings.ToLower(e.Value), "password") {
					t.Errorf("%s: %s carries a password: %q", f, e.Name, e.Value)
				}
			}
			for _, a := range ct.Args {
				if passwordInURL.MatchString(a) {
					t.Errorf("%s: argument %q carries a password", f, a)
				}
			}
		}
	}
}

func TestNetworkPolicy(t *testing.T) {
	o := mustRender(t, []string{"minimal.yaml"}, nil)
	np := one[*networkingv1.NetworkPolicy](t, o)
	pod := one[*appsv1.StatefulSet](t, o).Spec.Template
	if s, _ := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector); !s.Matches(labels.Set(pod.Labels)) {
		t.Fatal("the network policy does not apply to muster's pods")
	}
	if !slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{"Ingress", "Egress"}) {
		t.Errorf("policy types %v", np.Spec.PolicyTypes)
	}
	ingress := map[string]networkingv1.NetworkPolicyIngressRule{}
	for _, r := range np.Spec.Ingress {
		for _, p := range r.Ports {
			ingress[p.Port.String()] = r
		}
	}
	m := ingress["metrics"]
	if len(m.From) != 1 || m.From[0].NamespaceSelector == nil || m.From[0].NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"] != "monitoring" {
		t.Errorf("metrics ingress %+v, want from namespace monitoring", m)
	}
	peerIn := false
	for _, r := range np.Spec.Ingress {
		for _, from := range r.From {
			if from.PodSelector != nil && from.NamespaceSelector == nil {
				s, _ := metav1.LabelSelectorAsSelector(from.PodSelector)
				peerIn = peerIn || s.Matches(labels.Set(pod.Labels))
			}
		}
	}
	if !peerIn {
		t.Error("no ingress from the other replicas")
	}
	egressPorts := map[string]bool{}
	peerOut := false
	for _, r := range np.Spec.Egress {
		for _, p := range r.Ports {
			egressPorts[p.Port.String()+"/"+string(*p.Protocol)] = true
		}
		for _, to := range r.To {
			if to.PodSelector != nil && to.NamespaceSelector == nil {
				s, _ := metav1.LabelSelectorAsSelector(to.PodSelector)
				peerOut = peerOut || s.Matches(labels.Set(pod.Labels))
			}
		}
	}
	for _, want := range []string{"53/UDP", "53/TCP", "5432/TCP", "8080/TCP", "443/TCP"} {
		if !egressPorts[want] {
			t.Errorf("no egress to %s (have %v)", want, egressPorts)
		}
	}
	if !peerOut {
		t.Error("no egress to the other replicas")
	}
}

func TestBadValuesFailToRender(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  map[string]any
		want string
	}{
		{"replicas as a word", map[string]any{"replicaCount": "three"}, "replicaCount"},
		{"unknown top-level key", map[string]any{"replicas": 3}, "replicas"},
		{"unknown nested key", map[string]any{"tls": map[string]any{"secretName": "x"}}, "secretName"},
		{"password in the URL", map[string]any{"database": map[string]any{"existingSecret": "", "url": "postgres://muster:hunter2@db:5432/muster"}}, "carries a password"},
		{"password parameter", map[string]any{"database": map[string]any{"existingSecret": "", "url": "postgres://muster@db/muster?password=hunter2"}}, "password parameter"},
		{"no signing key", map[string]any{"signingKey": map[string]any{"existingSecret": ""}}, "/signingKey/existingSecret"},
		{"no issuers", map[string]any{"issuers": []any{}}, "MUSTER_ISSUERS"},
		{"IAM without region", map[string]any{"database": map[string]any{"existingSecret": "", "url": "postgres://muster@db/muster", "iam": map[string]any{"enabled": true}}}, "MUSTER_DB_IAM_REGION"},
		{"grace shorter than the drain", map[string]any{"terminationGracePeriodSeconds": 30}, "at least"},
		{"TLS without its Secret", map[string]any{"tls": map[string]any{"enabled": true, "existingSecret": ""}}, "kubernetes.io/tls"},
		{"mutual TLS without TLS", map[string]any{"replicaCount": 1, "tls": map[string]any{"enabled": false, "clientCA": map[string]any{"existingSecret": "ca"}}}, "needs tls.enabled"},
		{"replicas without TLS", map[string]any{"tls": map[string]any{"enabled": false}}, "3 replicas need TLS between them"},
		{"replicas' TLS without their CA", map[string]any{"tls": map[string]any{"ca": map[string]any{"existingSecret": ""}}}, "set tls.ca.existingSecret"},
		{"plain peers with TLS", map[string]any{"tls": map[string]any{"allowPlainPeers": true}}, "tls.allowPlainPeers is for replicas without TLS"},
		{"IAM with sslmode=require", map[string]any{"database": map[string]any{"existingSecret": "", "url": "postgres://muster@db/muster?sslmode=require", "iam": map[string]any{"enabled": true, "region": "eu-west-1", "caBundle": map[string]any{"configMap": "rds-ca"}}}}, "/database/url"},
		{"not a CIDR", map[string]any{"proxyProtocol": map[string]any{"from": []any{"nlb"}}}, "proxyProtocol"},
		{"bad role ARN", map[string]any{"serviceAccount": map[string]any{"roleArn": "muster-role"}}, "roleArn"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := render(t, []string{"minimal.yaml"}, tc.set)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want one naming %q", err, tc.want)
			}
		})
	}
	// The chart's own defaults lack what only the operator knows.
	if _, err := render(t, nil, nil); err == nil {
		t.Error("the bare defaults rendered")
	}
}

// TestREADMEListsEveryValue: the chart's README names every top-level
// value of values.yaml (the table an operator reads).
func TestREADMEListsEveryValue(t *testing.T) {
	vals, err := common.ReadValuesFile(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(chartDir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for k := range vals {
		if !bytes.Contains(readme, []byte("`"+k)) {
			t.Errorf("README.md does not list the value %s", k)
		}
	}
}

// TestNeedsKubernetes130: the preStop hook is a sleep action (the image
// has no shell), which Kubernetes has from 1.30; Helm refuses an older
// cluster by the chart's kubeVersion.
func TestNeedsKubernetes130(t *testing.T) {
	if _, err := renderOn(t, "v1.29.9", []string{"minimal.yaml"}, nil); err == nil || !strings.Contains(err.Error(), "kubeVersion") {
		t.Errorf("rendered for Kubernetes 1.29 (err = %v)", err)
	}
	if _, err := renderOn(t, "v1.30.0", []string{"minimal.yaml"}, nil); err != nil {
		t.Errorf("Kubernetes 1.30: %v", err)
	}
}

// TestStrictDecoderRefuses shows the decoding above is strict: a rendered
// object with an unknown or a duplicate field does not decode.
func TestStrictDecoderRefuses(t *testing.T) {
	m, err := render(t, []string{"minimal.yaml"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var pdb string
	for _, doc := range strings.Split(m, "\n---") {
		if strings.Contains(doc, "kind: PodDisruptionBudget") {
			pdb = doc
		}
	}
	if _, _, err := strictDecoder.Decode([]byte(pdb), nil, nil); err != nil {
		t.Fatalf("the PDB as rendered does not decode: %v", err)
	}
	for name, doc := range map[string]string{
		"unknown field":   strings.Replace(pdb, "spec:\n", "spec:\n  maxUnavialable: 2\n", 1),
		"duplicate field": strings.Replace(pdb, "spec:\n", "spec:\n  maxUnavailable: 2\n", 1),
	} {
		if doc == pdb {
			t.Fatalf("%s: the PDB has no spec line to edit", name)
		}
		_, _, err := strictDecoder.Decode([]byte(doc), nil, nil)
		if err == nil || !runtime.IsStrictDecodingError(err) {
			t.Errorf("%s: decoded (err = %v)", name, err)
		}
	}
}
