package chart_test

import (
	"encoding/json"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/common/util"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/musterhq/muster/internal/ownership"
	"github.com/musterhq/muster/internal/proxied"
)

// TestExtraVolumesAndEnv: the files production mounts beyond the chart's
// own (a CSI secret store, ConfigMaps of CAs, the SPIFFE bundle) reach the
// pod and the muster container as given, with the environment naming
// them, and the pod stays valid: every mount names a volume, no two
// mounts share a path, no variable is set twice.
func TestExtraVolumesAndEnv(t *testing.T) {
	o := mustRender(t, []string{"extras.yaml"}, nil)
	sts := one[*appsv1.StatefulSet](t, o)
	pod := sts.Spec.Template.Spec
	c := container(t, sts)
	vols := map[string]corev1.Volume{}
	for _, v := range pod.Volumes {
		if _, dup := vols[v.Name]; dup {
			t.Errorf("volume %s twice", v.Name)
		}
		vols[v.Name] = v
	}
	if v := vols["store"]; v.CSI == nil || v.CSI.Driver != "secrets-store.csi.k8s.io" || v.CSI.VolumeAttributes["secretProviderClass"] != "muster-peer-regions" {
		t.Errorf("CSI volume = %+v", v)
	}
	if v := vols["cas"]; v.ConfigMap == nil || v.ConfigMap.Name != "muster-cas" {
		t.Errorf("CA volume = %+v", v)
	}
	paths := map[string]bool{}
	for _, m := range c.VolumeMounts {
		if _, ok := vols[m.Name]; !ok {
			t.Errorf("mount %s names no volume", m.Name)
		}
		if paths[m.MountPath] {
			t.Errorf("two mounts at %s", m.MountPath)
		}
		paths[m.MountPath] = true
	}
	for _, p := range []string{"/etc/muster/store", "/etc/muster/cas", "/etc/muster/spiffe", "/var/run/muster/signing-key"} {
		if !paths[p] {
			t.Errorf("nothing mounted at %s (mounts %v)", p, c.VolumeMounts)
		}
	}
	seen := map[string]bool{}
	for _, e := range c.Env {
		if seen[e.Name] {
			t.Errorf("%s set twice", e.Name)
		}
		seen[e.Name] = true
	}
	e := env(c)
	if e["MUSTER_PEER_TOKENS"].Value != "us-east-1=/etc/muster/store/peer-token-us-east-1" || e["MUSTER_SPIFFE"].Value != "/etc/muster/spiffe/spiffe.yaml" {
		t.Errorf("extraEnv not rendered: %+v", c.Env)
	}
	// The database URL from the CSI store's file, and only from there.
	if _, ok := e["DATABASE_URL"]; ok || e["DATABASE_URL_FILE"].Value != "/etc/muster/store/database-url" {
		t.Errorf("DATABASE_URL %+v, DATABASE_URL_FILE %+v: want only the file", e["DATABASE_URL"], e["DATABASE_URL_FILE"])
	}
	// The signing key is still the Secret's 0440 file, whatever else is
	// mounted from a CSI store.
	if e["MUSTER_AUDIT_SIGNING_KEY_FILE"].Value != "/var/run/muster/signing-key/signing.key" || vols["signing-key"].Secret == nil ||
		*vols["signing-key"].Secret.DefaultMode != 0o440 {
		t.Errorf("signing key: %q from %+v", e["MUSTER_AUDIT_SIGNING_KEY_FILE"].Value, vols["signing-key"])
	}
}

// TestRDSBundleWithoutIAM: Aurora with a password and sslmode=verify-full
// is verified against the RDS CA bundle built into muster; a bundle of
// one's own comes in as an extra volume with PGSSLROOTCERT, which only
// IAM with database.iam.caBundle reserves.
func TestRDSBundleWithoutIAM(t *testing.T) {
	o := mustRender(t, []string{"minimal.yaml"}, map[string]any{
		"extraVolumes":      []any{map[string]any{"name": "rds-bundle", "configMap": map[string]any{"name": "rds-ca-bundle"}}},
		"extraVolumeMounts": []any{map[string]any{"name": "rds-bundle", "mountPath": "/etc/muster/rds-bundle", "readOnly": true}},
		"extraEnv":          []any{map[string]any{"name": "PGSSLROOTCERT", "value": "/etc/muster/rds-bundle/global-bundle.pem"}},
	})
	c := container(t, one[*appsv1.StatefulSet](t, o))
	if got := env(c)["PGSSLROOTCERT"].Value; got != "/etc/muster/rds-bundle/global-bundle.pem" {
		t.Errorf("PGSSLROOTCERT = %q", got)
	}
	if _, err := render(t, []string{"aurora-iam.yaml"}, map[string]any{"extraEnv": []any{map[string]any{"name": "PGSSLROOTCERT", "value": "/x"}}}); err == nil || !strings.Contains(err.Error(), "PGSSLROOTCERT, which the chart sets itself") {
		t.Errorf("PGSSLROOTCERT in extraEnv with IAM and caBundle: %v", err)
	}
	// With IAM and no caBundle the chart sets no PGSSLROOTCERT: a bundle
	// may come in as an extra volume, as without IAM.
	o = mustRender(t, []string{"aurora-iam.yaml"}, map[string]any{
		"database":          map[string]any{"iam": map[string]any{"caBundle": map[string]any{"configMap": ""}}},
		"extraVolumes":      []any{map[string]any{"name": "rds-bundle", "configMap": map[string]any{"name": "rds-ca-bundle"}}},
		"extraVolumeMounts": []any{map[string]any{"name": "rds-bundle", "mountPath": "/etc/muster/rds-bundle", "readOnly": true}},
		"extraEnv":          []any{map[string]any{"name": "PGSSLROOTCERT", "value": "/etc/muster/rds-bundle/global-bundle.pem"}},
	})
	if got := env(container(t, one[*appsv1.StatefulSet](t, o)))["PGSSLROOTCERT"].Value; got != "/etc/muster/rds-bundle/global-bundle.pem" {
		t.Errorf("IAM without caBundle, PGSSLROOTCERT from extraEnv = %q", got)
	}
}

// TestExtraValuesRefused: what would shadow the chart's own files or
// settings is refused with a message naming it.
func TestExtraValuesRefused(t *testing.T) {
	vol := []any{map[string]any{"name": "store", "csi": map[string]any{"driver": "secrets-store.csi.k8s.io"}}}
	for _, tc := range []struct {
		name string
		set  map[string]any
		want string
	}{
		{"a CSI mount over the signing key", map[string]any{"extraVolumes": vol, "extraVolumeMounts": []any{map[string]any{"name": "store", "mountPath": "/var/run/muster/signing-key"}}}, "give the key's path there as signingKey.file"},
		{"a mount inside the signing key's", map[string]any{"extraVolumes": vol, "extraVolumeMounts": []any{map[string]any{"name": "store", "mountPath": "/var/run/muster/signing-key/x/"}}}, "over the signing key's Secret"},
		{"a mount inside the TLS files'", map[string]any{"extraVolumes": vol, "extraVolumeMounts": []any{map[string]any{"name": "store", "mountPath": "/etc/muster/tls/extra"}}}, "inside the chart's own mount /etc/muster/tls"},
		{"a mount of no extra volume", map[string]any{"extraVolumes": vol, "extraVolumeMounts": []any{map[string]any{"name": "tls", "mountPath": "/x"}}}, "not in extraVolumes"},
		{"a relative mount path", map[string]any{"extraVolumes": vol, "extraVolumeMounts": []any{map[string]any{"name": "store", "mountPath": "x"}}}, "mountPath"},
		{"a mount without a path", map[string]any{"extraVolumes": vol, "extraVolumeMounts": []any{map[string]any{"name": "store"}}}, "mountPath"},
		{"a misspelt mount field", map[string]any{"extraVolumes": vol, "extraVolumeMounts": []any{map[string]any{"name": "store", "mountPath": "/x", "readonly": true}}}, "readonly"},
		{"a volume named as the chart's", map[string]any{"extraVolumes": []any{map[string]any{"name": "tls", "emptyDir": map[string]any{}}}}, "chart's own"},
		{"a volume without a name", map[string]any{"extraVolumes": []any{map[string]any{"emptyDir": map[string]any{}}}}, "name"},
		{"a variable the chart sets", map[string]any{"extraEnv": []any{map[string]any{"name": "MUSTER_AUDIT_SIGNING_KEY_FILE", "value": "/mnt/store/key"}}}, "which the chart sets itself"},
		{"the database URL's file outside every mount", map[string]any{"database": map[string]any{"existingSecret": "", "urlFile": "/etc/db/url"}}, "database.urlFile \"/etc/db/url\" is in none of extraVolumeMounts"},
		{"the database URL's file and its Secret", map[string]any{"extraVolumes": vol, "extraVolumeMounts": []any{map[string]any{"name": "store", "mountPath": "/etc/db"}}, "database": map[string]any{"urlFile": "/etc/db/url"}}, "set one of database.existingSecret, database.url and database.urlFile"},
		{"the database URL's file, relative", map[string]any{"database": map[string]any{"existingSecret": "", "urlFile": "db/url"}}, "urlFile"},
		{"a variable twice", map[string]any{"extraEnv": []any{map[string]any{"name": "MUSTER_SPIFFE", "value": "/a"}, map[string]any{"name": "MUSTER_SPIFFE", "value": "/b"}}}, "MUSTER_SPIFFE twice"},
		{"GOMEMLIMIT while the chart computes it", map[string]any{"extraEnv": []any{map[string]any{"name": "GOMEMLIMIT", "value": "1GiB"}}}, "GOMEMLIMIT"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := render(t, []string{"minimal.yaml"}, tc.set)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want one naming %q", err, tc.want)
			}
		})
	}
	// GOMEMLIMIT of one's own, with the chart's switched off.
	o := mustRender(t, []string{"minimal.yaml"}, map[string]any{"goMemLimitPercent": 0, "extraEnv": []any{map[string]any{"name": "GOMEMLIMIT", "value": "1GiB"}}})
	if got := env(container(t, one[*appsv1.StatefulSet](t, o)))["GOMEMLIMIT"].Value; got != "1GiB" {
		t.Errorf("GOMEMLIMIT = %q, want extraEnv's", got)
	}
}

// TestChecksumsRollPods: the ConfigMap the chart creates is hashed into
// the pod template, so changing it (a new reconcile file) changes the
// template and rolls the pods; rendering the same values twice gives the
// same hash.
func TestChecksumsRollPods(t *testing.T) {
	ann := func(set map[string]any, reconcileEvery string) map[string]string {
		t.Helper()
		merge(set, map[string]any{"reconcile": map[string]any{"config": map[string]any{"every": reconcileEvery}}})
		return one[*appsv1.StatefulSet](t, mustRender(t, []string{"single.yaml"}, set)).Spec.Template.Annotations
	}
	base := ann(map[string]any{}, "5s")
	if len(base["checksum/reconcile"]) != 64 {
		t.Fatalf("annotation checksum/reconcile = %q, want a SHA-256", base["checksum/reconcile"])
	}
	again := ann(map[string]any{}, "5s")
	newConfig := ann(map[string]any{}, "10s")
	if again["checksum/reconcile"] != base["checksum/reconcile"] {
		t.Error("the same values hash differently")
	}
	if newConfig["checksum/reconcile"] == base["checksum/reconcile"] {
		t.Errorf("a new reconcile file: %v, was %v; want checksum/reconcile changed", newConfig, base)
	}
	// The operator's annotations sit beside the hashes.
	withOwn := ann(map[string]any{"podAnnotations": map[string]any{"example.com/team": "infra"}}, "5s")
	if withOwn["example.com/team"] != "infra" || withOwn["checksum/reconcile"] != base["checksum/reconcile"] {
		t.Errorf("annotations %v: want podAnnotations and the hashes", withOwn)
	}
	// Nothing created by the chart: nothing to hash.
	for k := range one[*appsv1.StatefulSet](t, mustRender(t, []string{"minimal.yaml"}, nil)).Spec.Template.Annotations {
		if strings.HasPrefix(k, "checksum/") {
			t.Errorf("annotation %s without a chart-made ConfigMap", k)
		}
	}
}

// TestGOMEMLIMIT: GOMEMLIMIT is goMemLimitPercent of the memory limit, in
// bytes, as Kubernetes reads the limit's quantity.
func TestGOMEMLIMIT(t *testing.T) {
	for _, tc := range []struct {
		limit string
		pct   int
	}{{"2Gi", 90}, {"1500M", 80}, {"1.5Gi", 90}, {"3221225472", 75}, {"512Mi", 100}} {
		t.Run(tc.limit, func(t *testing.T) {
			o := mustRender(t, []string{"minimal.yaml"}, map[string]any{"goMemLimitPercent": tc.pct, "resources": map[string]any{"limits": map[string]any{"memory": tc.limit}}})
			got, err := strconv.ParseInt(env(container(t, one[*appsv1.StatefulSet](t, o)))["GOMEMLIMIT"].Value, 10, 64)
			if err != nil {
				t.Fatalf("GOMEMLIMIT: %v", err)
			}
			q := resource.MustParse(tc.limit)
			if want := q.Value() * int64(tc.pct) / 100; got < want-1 || got > want {
				t.Errorf("GOMEMLIMIT = %d, want %d (%d%% of %s)", got, want, tc.pct, tc.limit)
			}
		})
	}
	// A limit written as a bare number of bytes, as YAML gives it.
	vals, err := common.ReadValues([]byte("resources:\n  limits:\n    memory: 3221225472\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := env(container(t, one[*appsv1.StatefulSet](t, mustRender(t, []string{"minimal.yaml"}, vals))))["GOMEMLIMIT"].Value; got != "2899102924" {
		t.Errorf("GOMEMLIMIT = %q for a limit of 3221225472 bytes, want 2899102924", got)
	}
	// The chart's default: 90% of 2Gi.
	if got := env(container(t, one[*appsv1.StatefulSet](t, mustRender(t, []string{"minimal.yaml"}, nil))))["GOMEMLIMIT"].Value; got != "1932735283" {
		t.Errorf("default GOMEMLIMIT = %q, want 1932735283", got)
	}
	for name, set := range map[string]map[string]any{
		"no limit":     {"resources": map[string]any{"limits": nil}},
		"switched off": {"goMemLimitPercent": 0},
	} {
		o := mustRender(t, []string{"minimal.yaml"}, set)
		if _, ok := env(container(t, one[*appsv1.StatefulSet](t, o)))["GOMEMLIMIT"]; ok {
			t.Errorf("%s: GOMEMLIMIT set", name)
		}
	}
	if _, err := render(t, []string{"minimal.yaml"}, map[string]any{"resources": map[string]any{"limits": map[string]any{"memory": "2GB"}}}); err == nil || !strings.Contains(err.Error(), "resources.limits.memory") {
		t.Errorf("a limit of 2GB: %v, want a refusal naming resources.limits.memory", err)
	}
	if _, err := render(t, []string{"minimal.yaml"}, map[string]any{"goMemLimitPercent": 101}); err == nil || !strings.Contains(err.Error(), "goMemLimitPercent") {
		t.Errorf("101%%: %v", err)
	}
}

// TestZoneSpread: from three replicas the zone spread is strict, so no
// zone holds two replicas while another has none; below three, or when
// set, it is what the values say.
func TestZoneSpread(t *testing.T) {
	zone := func(t *testing.T, files []string, set map[string]any) corev1.TopologySpreadConstraint {
		t.Helper()
		for _, c := range one[*appsv1.StatefulSet](t, mustRender(t, files, set)).Spec.Template.Spec.TopologySpreadConstraints {
			if c.TopologyKey == "topology.kubernetes.io/zone" {
				return c
			}
		}
		t.Fatal("no zone spread")
		return corev1.TopologySpreadConstraint{}
	}
	for _, tc := range []struct {
		name  string
		files []string
		set   map[string]any
		want  corev1.UnsatisfiableConstraintAction
	}{
		{"3 replicas", []string{"minimal.yaml"}, nil, corev1.DoNotSchedule},
		{"5 replicas", []string{"minimal.yaml"}, map[string]any{"replicaCount": 5}, corev1.DoNotSchedule},
		{"2 replicas", []string{"minimal.yaml"}, map[string]any{"replicaCount": 2}, corev1.ScheduleAnyway},
		{"1 replica", []string{"single.yaml"}, variants(t)["single.yaml"], corev1.ScheduleAnyway},
		{"3 replicas, set", []string{"minimal.yaml"}, map[string]any{"topologySpread": map[string]any{"zone": map[string]any{"whenUnsatisfiable": "ScheduleAnyway"}}}, corev1.ScheduleAnyway},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := zone(t, tc.files, tc.set)
			if c.WhenUnsatisfiable != tc.want || c.MaxSkew != 1 {
				t.Errorf("zone spread %s, maxSkew %d; want %s, 1", c.WhenUnsatisfiable, c.MaxSkew, tc.want)
			}
			if c.NodeTaintsPolicy == nil || *c.NodeTaintsPolicy != corev1.NodeInclusionPolicyHonor {
				t.Errorf("nodeTaintsPolicy %v: a lost zone's tainted nodes would still count", c.NodeTaintsPolicy)
			}
		})
	}
}

// schemaValues are the chart's defaults with the values file and set
// merged over them, as Helm validates them.
func schemaErr(t *testing.T, file string, set map[string]any) error {
	t.Helper()
	vals, err := common.ReadValuesFile(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	f, err := common.ReadValuesFile(filepath.Join("testdata", file))
	if err != nil {
		t.Fatal(err)
	}
	merge(vals, f)
	merge(vals, set)
	schema, err := os.ReadFile(filepath.Join(chartDir, "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	return util.ValidateAgainstSingleSchema(vals, schema)
}

// TestSchemaRefusesBadValues: values.schema.json itself (what helm lint
// and offline validators check, before any template runs) refuses each
// bad value and accepts its good neighbour; the render does the same.
func TestSchemaRefusesBadValues(t *testing.T) {
	iamURL := func(u string) map[string]any {
		return map[string]any{"database": map[string]any{"existingSecret": "", "url": u,
			"iam": map[string]any{"enabled": true, "region": "eu-west-1", "caBundle": map[string]any{"configMap": "rds-ca"}}}}
	}
	saOff := func(name string) map[string]any {
		return map[string]any{"serviceAccount": map[string]any{"create": false, "name": name}}
	}
	for _, tc := range []struct {
		name, file string
		set        map[string]any
		refused    bool
	}{
		{"IAM, sslmode=disable", "minimal.yaml", iamURL("postgres://muster@db/muster?sslmode=disable"), true},
		{"IAM, sslmode=disable after verify-full", "minimal.yaml", iamURL("postgres://muster@db/muster?sslmode=verify-full&sslmode=disable"), true},
		{"IAM, sslmode=prefer", "minimal.yaml", iamURL("postgres://muster@db/muster?connect_timeout=5&sslmode=prefer"), true},
		{"IAM, sslmode=verify-ca", "minimal.yaml", iamURL("postgres://muster@db/muster?sslmode=verify-ca"), true},
		{"IAM, sslmode empty", "minimal.yaml", iamURL("postgres://muster@db/muster?sslmode="), true},
		{"IAM, sslmode=verify-full", "minimal.yaml", iamURL("postgres://muster@db/muster?sslmode=verify-full&connect_timeout=5"), false},
		{"IAM, sslmode left out", "minimal.yaml", iamURL("postgres://muster@db/muster"), false},
		{"IAM without a CA bundle of its own (the built-in one)", "minimal.yaml", merged(iamURL("postgres://muster@db/muster"), map[string]any{"database": map[string]any{"iam": map[string]any{"caBundle": map[string]any{"configMap": ""}}}}), false},
		{"IAM with a CA bundle ConfigMap that is no name", "minimal.yaml", merged(iamURL("postgres://muster@db/muster"), map[string]any{"database": map[string]any{"iam": map[string]any{"caBundle": map[string]any{"configMap": "RDS_CA"}}}}), true},
		{"IAM with a CA bundle key that is a path", "minimal.yaml", merged(iamURL("postgres://muster@db/muster"), map[string]any{"database": map[string]any{"iam": map[string]any{"caBundle": map[string]any{"key": "../etc/bundle.pem"}}}}), true},
		{"no IAM, sslmode=disable", "minimal.yaml", map[string]any{"database": map[string]any{"existingSecret": "", "url": "postgres://muster@localhost/muster?sslmode=disable"}}, false},
		{"RBAC bound to the default account", "reconcile.yaml", saOff(""), true},
		{"RBAC bound to the account named default", "reconcile.yaml", saOff("default"), true},
		{"RBAC bound to a named account", "reconcile.yaml", saOff("muster-reader"), false},
		{"own account, no RBAC", "minimal.yaml", saOff(""), false},
		{"own account, RBAC not created", "reconcile.yaml", merged(saOff(""), map[string]any{"rbac": map[string]any{"create": false}}), false},
		{"a bad CIDR in the network policy", "minimal.yaml", map[string]any{"networkPolicy": map[string]any{"ingress": map[string]any{"cidrs": []any{"10.0.0.0/33"}}}}, true},
		{"a bare address in the network policy", "minimal.yaml", map[string]any{"networkPolicy": map[string]any{"ingress": map[string]any{"cidrs": []any{"10.0.0.1"}}}}, true},
		{"a namespace that is no DNS label", "single.yaml", merged(map[string]any{"rbac": map[string]any{"namespaces": []any{"Shop"}}}, variants(t)["single.yaml"]), true},
		{"a cluster domain with a trailing dot", "minimal.yaml", map[string]any{"clusterDomain": "cluster.local."}, true},
		{"a cluster domain of its own", "minimal.yaml", map[string]any{"clusterDomain": "eu1.example.internal"}, false},
		{"an IPv6 network in the load balancer's ranges", "minimal.yaml", map[string]any{"service": map[string]any{"loadBalancerSourceRanges": []any{"2001:db8::/32"}}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := schemaErr(t, tc.file, tc.set); (err != nil) != tc.refused {
				t.Errorf("schema: err = %v, want refused %v", err, tc.refused)
			}
			if _, err := render(t, []string{tc.file}, tc.set); (err != nil) != tc.refused {
				t.Errorf("render: err = %v, want refused %v", err, tc.refused)
			}
		})
	}
	o := mustRender(t, []string{"reconcile.yaml"}, saOff("muster-reader"))
	if b := one[*rbacv1.ClusterRoleBinding](t, o); b.Subjects[0].Name != "muster-reader" || one[*appsv1.StatefulSet](t, o).Spec.Template.Spec.ServiceAccountName != "muster-reader" {
		t.Errorf("binding %+v: want the named account, which the pods run as", b.Subjects)
	}
	if _, err := render(t, []string{"aurora-iam.yaml"}, map[string]any{"serviceAccount": map[string]any{"create": false, "name": "muster"}}); err == nil || !strings.Contains(err.Error(), "serviceAccount.roleArn") {
		t.Errorf("roleArn on an account the chart does not create: %v", err)
	}
}

func merged(a, b map[string]any) map[string]any {
	merge(a, b)
	return a
}

// TestDuplicatePortsRefused: two listeners on one port are refused (the
// schema cannot compare values; the chart does); a disabled listener's
// port does not count.
func TestDuplicatePortsRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  map[string]any
		want string
	}{
		{"api and xds", map[string]any{"ports": map[string]any{"xds": 8080}}, "ports.api and ports.xds are both 8080"},
		{"api and metrics", map[string]any{"ports": map[string]any{"metrics": 8080}}, "ports.api and ports.metrics are both 8080"},
		{"xds and metrics", map[string]any{"ports": map[string]any{"metrics": 18000}}, "ports.metrics and ports.xds are both 18000"},
		{"xds off", map[string]any{"ports": map[string]any{"xds": 8080}, "xds": map[string]any{"enabled": false}}, ""},
		{"metrics off", map[string]any{"ports": map[string]any{"metrics": 18000}, "metrics": map[string]any{"enabled": false}}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := render(t, []string{"minimal.yaml"}, tc.set)
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("err = %v, want %q", err, tc.want)
			}
		})
	}
}

// TestProxyProtocolFromAsTheBinary: proxyProtocol.from takes what muster's
// MUSTER_PROXY_PROTOCOL_FROM takes (networks and single addresses) and
// refuses what it refuses, judged by internal/proxied itself.
func TestProxyProtocolFromAsTheBinary(t *testing.T) {
	for _, v := range []string{
		"10.0.0.0/8", "10.0.0.5", "10.0.0.5/32", "0.0.0.0/0", "192.168.1.0/24", "2001:db8::/32", "2001:db8::1", "::1", "::/0",
		"10.0.0.1/24", "10.0.0.0/33", "300.0.0.0/8", "10.0.0.0/08", "010.0.0.0/8", "nlb", "10.0.0.0/", "/8", "fe80::1%eth0",
	} {
		t.Run(v, func(t *testing.T) {
			_, binErr := proxied.ParseNetworks(v)
			_, err := render(t, []string{"minimal.yaml"}, map[string]any{"proxyProtocol": map[string]any{"from": []any{v}}})
			if (err == nil) != (binErr == nil) {
				t.Errorf("chart err = %v, muster's = %v", err, binErr)
			}
		})
	}
}

// TestNetworkPatternMatchesTheParser compares the schema's network pattern
// with the parser muster uses on addresses and networks in their every
// printed form (random, IPv4 and IPv6), and on near misses.
func TestNetworkPatternMatchesTheParser(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(chartDir, "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`"network": \{[^}]*"pattern": "([^"]+)"`).FindSubmatch(raw)
	if m == nil {
		t.Fatal("no $defs.network pattern in the schema")
	}
	pat := regexp.MustCompile(strings.ReplaceAll(string(m[1]), `\\`, `\`))
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 500 {
		var b [16]byte
		for j := range b {
			// Runs of zeros, so the compressed IPv6 forms come up.
			if r.IntN(3) > 0 {
				b[j] = byte(r.IntN(256))
			}
		}
		var a netip.Addr
		if i%2 == 0 {
			a = netip.AddrFrom4([4]byte(b[:4]))
		} else {
			a = netip.AddrFrom16(b)
		}
		forms := []string{a.String(), netip.PrefixFrom(a, r.IntN(a.BitLen()+1)).Masked().String()}
		if a.Is6() {
			forms = append(forms, a.StringExpanded())
		}
		for _, s := range forms {
			_, binErr := proxied.ParseNetworks(s)
			if binErr == nil && !pat.MatchString(s) {
				t.Fatalf("muster takes %q, the schema refuses it", s)
			}
		}
		// Near misses: a character changed, dropped or doubled.
		s := forms[0]
		k := r.IntN(len(s))
		for _, miss := range []string{s[:k] + s[k+1:], s[:k] + s[k:k+1] + s[k:], s[:k] + string("0123456789abcdefg:./x"[r.IntN(21)]) + s[k+1:], s + "/" + strconv.Itoa(r.IntN(200))} {
			_, binErr := proxied.ParseNetworks(miss)
			if binErr != nil && pat.MatchString(miss) && !strings.Contains(miss, "/") && a.Is4() {
				// An IPv4 address the parser refuses must not pass the pattern
				// (networks with host bits are the template's to refuse).
				t.Errorf("muster refuses %q (%v), the schema takes it", miss, binErr)
			}
			if binErr == nil && !pat.MatchString(miss) {
				t.Errorf("muster takes %q, the schema refuses it", miss)
			}
		}
	}
}

// TestLintStrict: `helm lint --strict` (Helm's own linter, warnings as
// errors) passes for every values file, and refuses a value the schema
// refuses.
func TestLintStrict(t *testing.T) {
	kv, err := common.ParseKubeVersion("v1.33.0")
	if err != nil {
		t.Fatal(err)
	}
	lint := func(f string, set map[string]any) *action.LintResult {
		vals := map[string]any{}
		v, err := common.ReadValuesFile(filepath.Join("testdata", f))
		if err != nil {
			t.Fatal(err)
		}
		merge(vals, v)
		merge(vals, set)
		l := action.NewLint()
		l.Strict, l.Namespace, l.KubeVersion = true, namespace, kv
		return l.Run([]string{chartDir}, vals)
	}
	for f, set := range variants(t) {
		if res := lint(f, set); res.TotalChartsLinted != 1 || len(res.Errors) > 0 {
			t.Errorf("%s: lint --strict: %v (%d linted)", f, res.Errors, res.TotalChartsLinted)
		}
	}
	// The linter validates the schema: what the schema refuses, lint
	// reports. (It renders with `fail` turned into a log line, so the
	// chart's render-time refusals, such as two listeners on one port, fail
	// helm install and helm template but not helm lint.)
	iam := map[string]any{"database": map[string]any{"existingSecret": "", "url": "postgres://muster@db/muster?sslmode=disable",
		"iam": map[string]any{"enabled": true, "region": "eu-west-1", "caBundle": map[string]any{"configMap": "rds-ca"}}}}
	if res := lint("minimal.yaml", iam); len(res.Errors) == 0 {
		t.Error("lint --strict passed IAM with sslmode=disable")
	}
}

// TestChartOwnNamesGuarded: every volume, mount path and variable the
// chart renders itself, in any values file, is refused as an extra, so
// the lists in _helpers.tpl keep up with statefulset.yaml.
func TestChartOwnNamesGuarded(t *testing.T) {
	vols, paths, envs := map[string]bool{}, map[string]bool{}, map[string]bool{}
	for f, set := range variants(t) {
		if f == "extras.yaml" {
			continue
		}
		sts := one[*appsv1.StatefulSet](t, mustRender(t, []string{f}, set))
		for _, v := range sts.Spec.Template.Spec.Volumes {
			vols[v.Name] = true
		}
		c := container(t, sts)
		for _, m := range c.VolumeMounts {
			paths[m.MountPath] = true
		}
		for _, e := range c.Env {
			envs[e.Name] = true
		}
	}
	// Every switch on at once: IAM, public keys, mutual TLS, reconciliation.
	all := mustRender(t, []string{"aurora-iam.yaml"}, map[string]any{
		"signingKey": map[string]any{"publicKeys": map[string]any{"existingSecret": "old-keys", "keys": []any{"old.pub"}}},
		"tls":        map[string]any{"clientCA": map[string]any{"existingSecret": "client-ca"}},
		"reconcile":  map[string]any{"enabled": true, "config": map[string]any{"kubernetes": []any{map[string]any{"cluster": "c", "members": map[string]any{"web": []any{"shop"}}}}}},
	})
	sts := one[*appsv1.StatefulSet](t, all)
	for _, v := range sts.Spec.Template.Spec.Volumes {
		vols[v.Name] = true
	}
	for _, m := range container(t, sts).VolumeMounts {
		paths[m.MountPath] = true
	}
	for _, e := range container(t, sts).Env {
		envs[e.Name] = true
	}
	if len(vols) < 8 || len(envs) < 20 {
		t.Fatalf("only %d volumes and %d variables rendered: the variants lost a switch", len(vols), len(envs))
	}
	refused := func(what string, set map[string]any) {
		t.Helper()
		if _, err := render(t, []string{"minimal.yaml"}, set); err == nil {
			t.Errorf("%s: rendered", what)
		}
	}
	for v := range vols {
		refused("extra volume "+v, map[string]any{"extraVolumes": []any{map[string]any{"name": v, "emptyDir": map[string]any{}}}})
	}
	for p := range paths {
		refused("extra mount at "+p, map[string]any{"extraVolumes": []any{map[string]any{"name": "x", "emptyDir": map[string]any{}}},
			"extraVolumeMounts": []any{map[string]any{"name": "x", "mountPath": p}}})
	}
	for e := range envs {
		// Variables the chart sets only in some values files are refused
		// when it sets them; render with the switch that sets each.
		set := map[string]any{"extraEnv": []any{map[string]any{"name": e, "value": "x"}}}
		if strings.HasPrefix(e, "MUSTER_DB_IAM") || strings.HasPrefix(e, "PGSSL") {
			if _, err := render(t, []string{"aurora-iam.yaml"}, set); err == nil {
				t.Errorf("extraEnv %s with IAM: rendered", e)
			}
			continue
		}
		refused("extraEnv "+e, set)
	}
}

// TestMinReadySecondsCoversTheShareBound: a rolling update moves to the
// next replica only once the new one has held its share of the shards,
// which a ready replica takes within ownership.ShareTakenWithin. The
// schema's minimum for minReadySeconds is at least that bound plus one
// ownership round (the rounds' own database work), the default at least
// twice the bound, the schema refuses one second under its minimum and
// takes the minimum, and the StatefulSet carries the default.
func TestMinReadySecondsCoversTheShareBound(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(chartDir, "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var schema struct {
		Properties struct {
			MinReadySeconds struct {
				Minimum *int `json:"minimum"`
			} `json:"minReadySeconds"`
		} `json:"properties"`
	}
	if err := json.Unmarshal(raw, &schema); err != nil {
		t.Fatal(err)
	}
	minimum := schema.Properties.MinReadySeconds.Minimum
	floor := ownership.ShareTakenWithin + ownership.DefaultInterval
	if minimum == nil || time.Duration(*minimum)*time.Second < floor {
		t.Fatalf("the schema's minimum for minReadySeconds is %v, want at least %s (ShareTakenWithin %s and a round)", minimum, floor, ownership.ShareTakenWithin)
	}
	vals, err := common.ReadValuesFile(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	def, ok := vals["minReadySeconds"].(float64)
	if !ok {
		t.Fatalf("values.yaml's minReadySeconds is %T %v", vals["minReadySeconds"], vals["minReadySeconds"])
	}
	if time.Duration(def)*time.Second < 2*ownership.ShareTakenWithin || int(def) < *minimum {
		t.Errorf("the default minReadySeconds %v is below twice ShareTakenWithin (%s) or the schema's minimum %d", def, 2*ownership.ShareTakenWithin, *minimum)
	}
	if err := schemaErr(t, "minimal.yaml", map[string]any{"minReadySeconds": *minimum - 1}); err == nil {
		t.Errorf("the schema takes minReadySeconds %d, under its minimum", *minimum-1)
	}
	if err := schemaErr(t, "minimal.yaml", map[string]any{"minReadySeconds": *minimum}); err != nil {
		t.Errorf("the schema refuses minReadySeconds %d, its minimum: %v", *minimum, err)
	}
	if got := one[*appsv1.StatefulSet](t, mustRender(t, []string{"minimal.yaml"}, nil)).Spec.MinReadySeconds; got != int32(def) {
		t.Errorf("the StatefulSet's minReadySeconds is %d, want the default %v", got, def)
	}
}
