package chart_test

import (
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// hooksOf renders values' Helm hooks and decodes them strictly.
func hooksOf(t *testing.T, files []string, set map[string]any) objects {
	t.Helper()
	h, err := renderHooks(t, files, set)
	if err != nil {
		t.Fatalf("render %v: %v", files, err)
	}
	if strings.TrimSpace(h) == "" {
		return objects{}
	}
	return decodeAll(t, h)
}

// withoutReconcile drops the reconcile file's volume or mount, which the
// Job alone leaves out (a ConfigMap of the release, absent when a
// pre-install hook runs).
func withoutReconcile[T corev1.Volume | corev1.VolumeMount](all []T) []T {
	return slices.DeleteFunc(slices.Clone(all), func(v T) bool {
		switch v := any(v).(type) {
		case corev1.Volume:
			return v.Name == "reconcile"
		case corev1.VolumeMount:
			return v.Name == "reconcile"
		}
		return false
	})
}

// TestMigrationsJob: by default the chart renders a Helm pre-install and
// pre-upgrade hook Job running `muster migrate up` with exactly the
// replicas' image, environment, files (the reconcile file aside),
// security settings and scheduling, no probe, its limits from values, and
// pod labels no Service or budget of the release selects; the replicas
// get MUSTER_MIGRATE=skip. With IRSA it runs as a hook ServiceAccount of
// its own carrying the role (the release's does not exist yet at
// install); with serviceAccount.create=false as the named one. Off, there
// is no Job and the replicas migrate (no MUSTER_MIGRATE).
func TestMigrationsJob(t *testing.T) {
	for _, f := range []string{"minimal.yaml", "aurora-iam.yaml", "extras.yaml", "single.yaml", "tls-mtls.yaml", "proxy-nlb.yaml"} {
		t.Run(f, func(t *testing.T) {
			set := map[string]any{
				"migrations":   map[string]any{"job": map[string]any{"backoffLimit": 5, "activeDeadlineSeconds": 900}},
				"nodeSelector": map[string]any{"pool": "system"},
			}
			o := mustRender(t, []string{f}, set)
			sts := one[*appsv1.StatefulSet](t, o)
			hooks := hooksOf(t, []string{f}, set)
			job := one[*batchv1.Job](t, hooks)
			if job.Annotations["helm.sh/hook"] != "pre-install,pre-upgrade" || job.Annotations["helm.sh/hook-delete-policy"] != "before-hook-creation" {
				t.Errorf("Job annotations %v: want a pre-install,pre-upgrade hook deleted before the next one", job.Annotations)
			}
			if job.Spec.BackoffLimit == nil || *job.Spec.BackoffLimit != 5 || job.Spec.ActiveDeadlineSeconds == nil || *job.Spec.ActiveDeadlineSeconds != 900 {
				t.Errorf("backoffLimit %v, activeDeadlineSeconds %v: want 5 and 900 from values", job.Spec.BackoffLimit, job.Spec.ActiveDeadlineSeconds)
			}
			pod, jpod := sts.Spec.Template.Spec, job.Spec.Template.Spec
			if len(jpod.Containers) != 1 || len(jpod.InitContainers) != 0 {
				t.Fatalf("Job containers %d, init containers %d: want one", len(jpod.Containers), len(jpod.InitContainers))
			}
			c, jc := container(t, sts), jpod.Containers[0]
			if !slices.Equal(jc.Args, []string{"migrate", "up"}) || len(jc.Command) != 0 {
				t.Errorf("Job runs %v %v, want the image's muster with migrate up", jc.Command, jc.Args)
			}
			if jc.StartupProbe != nil || jc.LivenessProbe != nil || jc.ReadinessProbe != nil {
				t.Error("the Job has a probe: a long migration would be killed half-way")
			}
			if jpod.RestartPolicy != corev1.RestartPolicyNever {
				t.Errorf("restartPolicy %s, want Never (backoffLimit counts pods)", jpod.RestartPolicy)
			}
			for what, diff := range map[string]string{
				"image":                     cmp.Diff(c.Image, jc.Image),
				"imagePullPolicy":           cmp.Diff(c.ImagePullPolicy, jc.ImagePullPolicy),
				"env":                       cmp.Diff(c.Env, jc.Env),
				"volumeMounts":              cmp.Diff(withoutReconcile(c.VolumeMounts), jc.VolumeMounts),
				"volumes":                   cmp.Diff(withoutReconcile(pod.Volumes), jpod.Volumes),
				"container securityContext": cmp.Diff(c.SecurityContext, jc.SecurityContext),
				"pod securityContext":       cmp.Diff(pod.SecurityContext, jpod.SecurityContext),
				"resources":                 cmp.Diff(c.Resources, jc.Resources),
				"nodeSelector":              cmp.Diff(pod.NodeSelector, jpod.NodeSelector),
				"tolerations":               cmp.Diff(pod.Tolerations, jpod.Tolerations),
				"imagePullSecrets":          cmp.Diff(pod.ImagePullSecrets, jpod.ImagePullSecrets),
			} {
				if diff != "" {
					t.Errorf("the Job's %s differs from the replicas' (-replicas +Job):\n%s", what, diff)
				}
			}
			if e := env(c)["MUSTER_MIGRATE"]; e.Value != "skip" {
				t.Errorf("replicas' MUSTER_MIGRATE = %+v, want skip", e)
			}
			// No Service, budget or replica selector picks the Job's pod.
			jl := labels.Set(job.Spec.Template.Labels)
			if s, _ := metav1.LabelSelectorAsSelector(sts.Spec.Selector); s.Matches(jl) {
				t.Errorf("the StatefulSet's selector matches the Job's pod %v", jl)
			}
			for _, svc := range of[*corev1.Service](o) {
				if labels.SelectorFromSet(svc.Spec.Selector).Matches(jl) {
					t.Errorf("Service %s selects the Job's pod", svc.Name)
				}
			}
			// Its identity exists before the release's objects do.
			var hookSA *corev1.ServiceAccount
			for _, sa := range of[*corev1.ServiceAccount](hooks) {
				hookSA = sa
			}
			if hookSA == nil || jpod.ServiceAccountName != hookSA.Name || !strings.HasPrefix(hookSA.Annotations["helm.sh/hook"], "pre-install,pre-upgrade") ||
				weight(hookSA.Annotations) >= weight(job.Annotations) {
				t.Errorf("the Job runs as %q; hook ServiceAccount %+v: want one created as a hook before the Job", jpod.ServiceAccountName, hookSA)
			}
			releaseSA := one[*corev1.ServiceAccount](t, o)
			if hookSA != nil && hookSA.Annotations["eks.amazonaws.com/role-arn"] != releaseSA.Annotations["eks.amazonaws.com/role-arn"] {
				t.Errorf("the Job's ServiceAccount carries role %q, the replicas' %q", hookSA.Annotations["eks.amazonaws.com/role-arn"], releaseSA.Annotations["eks.amazonaws.com/role-arn"])
			}
		})
	}

	t.Run("own ServiceAccount", func(t *testing.T) {
		hooks := hooksOf(t, []string{"minimal.yaml"}, map[string]any{"serviceAccount": map[string]any{"create": false, "name": "platform-muster"}})
		if n := len(of[*corev1.ServiceAccount](hooks)); n != 0 {
			t.Errorf("%d hook ServiceAccounts with serviceAccount.create=false", n)
		}
		if sa := one[*batchv1.Job](t, hooks).Spec.Template.Spec.ServiceAccountName; sa != "platform-muster" {
			t.Errorf("the Job runs as %q, want serviceAccount.name", sa)
		}
	})

	t.Run("off", func(t *testing.T) {
		off := map[string]any{"migrations": map[string]any{"job": map[string]any{"enabled": false}}}
		if h, err := renderHooks(t, []string{"minimal.yaml"}, off); err != nil || strings.TrimSpace(h) != "" {
			t.Errorf("hooks with the Job off: %q %v", h, err)
		}
		if e, ok := env(container(t, one[*appsv1.StatefulSet](t, mustRender(t, []string{"minimal.yaml"}, off))))["MUSTER_MIGRATE"]; ok {
			t.Errorf("MUSTER_MIGRATE = %+v with the Job off: the replicas must migrate", e)
		}
	})

	t.Run("refused", func(t *testing.T) {
		for _, set := range []map[string]any{
			{"migrations": map[string]any{"job": map[string]any{"activeDeadlineSeconds": 0}}},
			{"migrations": map[string]any{"job": map[string]any{"backoffLimit": -1}}},
			{"migrations": map[string]any{"job": map[string]any{"enable": true}}},
			{"extraEnv": []any{map[string]any{"name": "MUSTER_MIGRATE", "value": "up"}}},
		} {
			if _, err := render(t, []string{"minimal.yaml"}, set); err == nil {
				t.Errorf("%v rendered", set)
			}
		}
	})
}

// TestSigningKeyNotAValue: the chart takes no private key as a value
// (Helm would keep it in its release record): the schema itself refuses
// signingKey.privateKey with the commands that create the Secret, without
// echoing the key, and so does the render; no Secret is rendered. The key
// may instead be a CSI secret store's file (signingKey.file), which must
// lie in one of the mounts; with a csi volume the chart sets
// MUSTER_SECRET_FILES_ALLOW_SHARED=true, and only then.
func TestSigningKeyNotAValue(t *testing.T) {
	key := generatedKey(t)
	body := strings.Split(key, "\n")[1]
	set := map[string]any{"signingKey": map[string]any{"existingSecret": "", "privateKey": key}}
	serr := schemaErr(t, "single.yaml", set)
	_, rerr := render(t, []string{"single.yaml"}, set)
	for what, err := range map[string]error{"schema": serr, "render": rerr} {
		if err == nil {
			t.Fatalf("%s: signingKey.privateKey accepted", what)
		}
		for _, want := range []string{"signingKey.privateKey", "openssl genpkey -algorithm ed25519", "kubectl -n NAMESPACE create secret generic muster-signing-key --from-file=signing.key", "signingKey.existingSecret"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%s: %v, want it to say %q", what, err, want)
			}
		}
		if strings.Contains(err.Error(), body) {
			t.Errorf("%s: the refusal echoes the key", what)
		}
	}
	for f, set := range variants(t) {
		if n := strings.Count(mustRenderText(t, f, set), "\nkind: Secret\n"); n != 0 {
			t.Errorf("%s: %d Secrets rendered", f, n)
		}
	}

	store := map[string]any{
		"signingKey":        map[string]any{"existingSecret": "", "file": "/etc/muster/store/signing.key"},
		"extraVolumes":      []any{map[string]any{"name": "store", "csi": map[string]any{"driver": "secrets-store.csi.k8s.io", "readOnly": true}}},
		"extraVolumeMounts": []any{map[string]any{"name": "store", "mountPath": "/etc/muster/store", "readOnly": true}},
	}
	sts := one[*appsv1.StatefulSet](t, mustRender(t, []string{"minimal.yaml"}, store))
	e := env(container(t, sts))
	if e["MUSTER_AUDIT_SIGNING_KEY_FILE"].Value != "/etc/muster/store/signing.key" || e["MUSTER_SECRET_FILES_ALLOW_SHARED"].Value != "true" {
		t.Errorf("signing key file %+v, MUSTER_SECRET_FILES_ALLOW_SHARED %+v: want the store's file, allowed shared", e["MUSTER_AUDIT_SIGNING_KEY_FILE"], e["MUSTER_SECRET_FILES_ALLOW_SHARED"])
	}
	for _, v := range sts.Spec.Template.Spec.Volumes {
		if v.Name == "signing-key" {
			t.Errorf("the signing key's Secret volume is rendered with signingKey.file: %+v", v)
		}
	}
	if e := env(container(t, one[*appsv1.StatefulSet](t, mustRender(t, []string{"extras.yaml"}, nil)))); e["MUSTER_SECRET_FILES_ALLOW_SHARED"].Value != "true" {
		t.Errorf("extras.yaml (a CSI volume): MUSTER_SECRET_FILES_ALLOW_SHARED = %+v, want true", e["MUSTER_SECRET_FILES_ALLOW_SHARED"])
	}
	if _, ok := env(container(t, one[*appsv1.StatefulSet](t, mustRender(t, []string{"minimal.yaml"}, nil))))["MUSTER_SECRET_FILES_ALLOW_SHARED"]; ok {
		t.Error("MUSTER_SECRET_FILES_ALLOW_SHARED set without a CSI volume")
	}
	for what, tc := range map[string]struct {
		set  map[string]any
		want string
	}{
		"file outside every mount": {merged(map[string]any{"signingKey": map[string]any{"file": "/etc/elsewhere/signing.key"}}, map[string]any{"signingKey": map[string]any{"existingSecret": ""}}), "in none of extraVolumeMounts"},
		"file and Secret":          {merged(store, map[string]any{"signingKey": map[string]any{"existingSecret": "muster-signing-key"}}), "not both"},
		"neither":                  {map[string]any{"signingKey": map[string]any{"existingSecret": ""}}, "existingSecret"},
		"relative file":            {map[string]any{"signingKey": map[string]any{"existingSecret": "", "file": "signing.key"}}, "/signingKey/file"},
	} {
		if _, err := render(t, []string{"minimal.yaml"}, tc.set); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want a refusal saying %q", what, err, tc.want)
		}
	}
}

// weight is a hook's helm.sh/hook-weight (0 when not set).
func weight(ann map[string]string) int {
	w, _ := strconv.Atoi(ann["helm.sh/hook-weight"])
	return w
}

// mustRenderText renders a values file's release objects as text.
func mustRenderText(t *testing.T, f string, set map[string]any) string {
	t.Helper()
	m, err := render(t, []string{f}, set)
	if err != nil {
		t.Fatalf("render %s: %v", f, err)
	}
	return m
}
