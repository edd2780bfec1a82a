package chart_test

import (
	"bufio"
	encjson "encoding/json"
	"errors"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/musterhq/muster/internal/agent"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/image"
)

const agentExamples = "../../deploy/agent"

// decodeFile decodes every YAML document of file strictly into the
// Kubernetes API types.
func decodeFile(t *testing.T, file string) []runtime.Object {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	r := utilyaml.NewYAMLReader(bufio.NewReader(strings.NewReader(string(b))))
	var out []runtime.Object
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if isBlank(doc) {
			continue
		}
		obj, _, err := decodeStrict(doc)
		if err != nil {
			t.Fatalf("%s: a document does not decode strictly: %v\n%s", file, err, doc)
		}
		out = append(out, obj)
	}
	return out
}

// TestAgentExamples: deploy/agent's sidecar and DaemonSet decode strictly
// into the Kubernetes API types, and run muster agent as docs/agent.md
// says it must run: listening on loopback only, holding a projected
// service-account token addressed to muster, non-root on a read-only
// root filesystem without privilege escalation or capabilities, with
// resources, and ready by its /readyz through a probe that can reach it;
// the sidecar's application is given a bootstrap pointing at the agent.
func TestAgentExamples(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		file    string
		kind    string // the workload's kind
		sidecar bool
	}{
		{"sidecar.yaml", "Deployment", true},
		{"daemonset.yaml", "DaemonSet", false},
	} {
		t.Run(tc.file, func(t *testing.T) {
			t.Parallel()
			objs := decodeFile(t, filepath.Join(agentExamples, tc.file))
			var pod *corev1.PodSpec
			configMaps := map[string]*corev1.ConfigMap{}
			for _, o := range objs {
				switch o := o.(type) {
				case *appsv1.Deployment:
					pod = &o.Spec.Template.Spec
				case *appsv1.DaemonSet:
					pod = &o.Spec.Template.Spec
					if !pod.HostNetwork {
						t.Error("a per-host agent without hostNetwork serves only its own pod's loopback")
					}
				case *corev1.ConfigMap:
					configMaps[o.Name] = o
				case *corev1.ServiceAccount:
				default:
					t.Errorf("unexpected object %T", o)
				}
			}
			if pod == nil {
				t.Fatalf("no %s in %s", tc.kind, tc.file)
			}
			var c *corev1.Container
			for i := range pod.InitContainers {
				if pod.InitContainers[i].Name == "muster-agent" {
					c = &pod.InitContainers[i]
					if rp := c.RestartPolicy; rp == nil || *rp != corev1.ContainerRestartPolicyAlways {
						t.Error("the agent as an init container must be a native sidecar (restartPolicy: Always), or it blocks the pod")
					}
				}
			}
			for i := range pod.Containers {
				if pod.Containers[i].Name == "muster-agent" {
					c = &pod.Containers[i]
				}
			}
			if c == nil {
				t.Fatal("no muster-agent container")
			}
			if tc.sidecar && (c.RestartPolicy == nil || slices.ContainsFunc(pod.Containers, func(c corev1.Container) bool { return c.Name == "muster-agent" })) {
				t.Error("the sidecar example should run the agent as a native sidecar, started before the application")
			}
			if len(c.Args) == 0 || c.Args[0] != "agent" {
				t.Fatalf("the container runs %v, not muster agent", c.Args)
			}
			flags := map[string]string{}
			for _, a := range c.Args[1:] {
				k, v, ok := strings.Cut(a, "=")
				if !strings.HasPrefix(a, "--") || !ok {
					t.Fatalf("argument %q: write --flag=value, so the test reads what the agent is given", a)
				}
				flags[k] = v
			}

			// Loopback only, every listening address given explicitly.
			for _, f := range []string{"--xds-addr", "--http-addr"} {
				if _, ok := flags[f]; !ok {
					t.Errorf("%s not given: say where the agent listens", f)
				}
			}
			for _, f := range []string{"--xds-addr", "--http-addr", "--dns-addr"} {
				if v, ok := flags[f]; ok {
					if err := agent.CheckLoopback(v); err != nil {
						t.Errorf("%s=%s: %v", f, v, err)
					}
				}
			}

			// The token file is a projected service-account token
			// addressed to muster.
			mounts := map[string]corev1.VolumeMount{}
			for _, m := range c.VolumeMounts {
				mounts[m.Name] = m
			}
			volumes := map[string]corev1.Volume{}
			for _, v := range pod.Volumes {
				volumes[v.Name] = v
			}
			tokenFile := flags["--token-file"]
			var audience string
			for name, m := range mounts {
				v := volumes[name]
				if v.Projected == nil || !strings.HasPrefix(tokenFile, m.MountPath+"/") {
					continue
				}
				for _, s := range v.Projected.Sources {
					if st := s.ServiceAccountToken; st != nil && path.Join(m.MountPath, st.Path) == tokenFile {
						audience = st.Audience
						if st.ExpirationSeconds == nil || *st.ExpirationSeconds > 24*3600 {
							t.Errorf("the token lives %v s; keep it short, the kubelet rewrites it", st.ExpirationSeconds)
						}
					}
				}
				if !m.ReadOnly {
					t.Errorf("the token volume %s is mounted writable", name)
				}
			}
			if audience != identity.DefaultAudience {
				t.Errorf("--token-file=%s is not a projected service-account token addressed to %q (audience %q)", tokenFile, identity.DefaultAudience, audience)
			}
			if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
				t.Error("the default service-account token is mounted too; the agent needs only the projected one")
			}
			if cache := flags["--cache"]; cache == "" || !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == cache && !m.ReadOnly }) {
				t.Errorf("--cache=%s is not a writable volume (the root filesystem is read-only)", cache)
			}

			// Least privilege.
			sc, psc := c.SecurityContext, pod.SecurityContext
			if sc == nil || psc == nil {
				t.Fatal("no securityContext")
			}
			if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
				t.Error("the root filesystem is writable")
			}
			if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
				t.Error("privilege escalation is allowed")
			}
			if sc.Privileged != nil && *sc.Privileged {
				t.Error("privileged")
			}
			nonRoot := (sc.RunAsNonRoot != nil && *sc.RunAsNonRoot) || (sc.RunAsNonRoot == nil && psc.RunAsNonRoot != nil && *psc.RunAsNonRoot)
			uid := sc.RunAsUser
			if uid == nil {
				uid = psc.RunAsUser
			}
			if !nonRoot || uid == nil || *uid == 0 {
				t.Errorf("not held to a non-root user (runAsNonRoot %v, runAsUser %v)", nonRoot, uid)
			}
			if sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") || len(sc.Capabilities.Add) > 0 {
				t.Errorf("capabilities %+v: drop ALL, add none", sc.Capabilities)
			}

			// Resources.
			if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
				t.Errorf("resources %+v: request CPU and memory, limit memory", c.Resources)
			}

			// Readiness by /readyz, through a probe that reaches a
			// loopback-only port: from the node when the pod has the
			// host's network, from inside the container otherwise.
			p := c.ReadinessProbe
			switch {
			case p == nil:
				t.Error("no readiness probe")
			case p.HTTPGet != nil:
				want := "127.0.0.1:" + p.HTTPGet.Port.String()
				if !pod.HostNetwork {
					t.Error("an HTTP probe is sent from the node to the pod's address, where the agent does not listen; use muster agent readyz")
				}
				if p.HTTPGet.Path != "/readyz" || p.HTTPGet.Host != "127.0.0.1" || flags["--http-addr"] != want {
					t.Errorf("the probe asks %s%s; want /readyz at --http-addr %s", want, p.HTTPGet.Path, flags["--http-addr"])
				}
			case p.Exec != nil:
				want := []string{image.BinaryPath, "agent", "readyz", "--http-addr=" + flags["--http-addr"]}
				if !slices.Equal(p.Exec.Command, want) {
					t.Errorf("the probe runs %v; want %v", p.Exec.Command, want)
				}
			default:
				t.Errorf("the readiness probe %+v does not ask /readyz", p)
			}

			// The sidecar's application is bootstrapped at the agent:
			// plaintext to its --xds-addr.
			if !tc.sidecar {
				return
			}
			checked := false
			for _, app := range pod.Containers {
				for _, e := range app.Env {
					if e.Name != "GRPC_XDS_BOOTSTRAP" {
						continue
					}
					for _, m := range app.VolumeMounts {
						v := volumes[m.Name]
						if v.ConfigMap == nil || !strings.HasPrefix(e.Value, m.MountPath+"/") {
							continue
						}
						cm := configMaps[v.ConfigMap.Name]
						if cm == nil {
							t.Fatalf("the bootstrap's ConfigMap %s is not in the example", v.ConfigMap.Name)
						}
						var b struct {
							XDSServers []struct {
								ServerURI    string                  `json:"server_uri"`
								ChannelCreds []struct{ Type string } `json:"channel_creds"`
							} `json:"xds_servers"`
						}
						if err := encjson.Unmarshal([]byte(cm.Data[strings.TrimPrefix(e.Value, m.MountPath+"/")]), &b); err != nil {
							t.Fatalf("the bootstrap: %v", err)
						}
						if len(b.XDSServers) != 1 || b.XDSServers[0].ServerURI != flags["--xds-addr"] || len(b.XDSServers[0].ChannelCreds) == 0 || b.XDSServers[0].ChannelCreds[0].Type != "insecure" {
							t.Errorf("the bootstrap %+v: want one xDS server, the agent's %s, with insecure channel credentials", b, flags["--xds-addr"])
						}
						checked = true
					}
				}
			}
			if !checked {
				t.Error("no application container is given a bootstrap (GRPC_XDS_BOOTSTRAP in a mounted ConfigMap)")
			}
		})
	}
	doc, err := os.ReadFile("../../docs/agent.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"deploy/agent/sidecar.yaml", "deploy/agent/daemonset.yaml"} {
		if !strings.Contains(string(doc), f) {
			t.Errorf("docs/agent.md does not link %s", f)
		}
	}
}
