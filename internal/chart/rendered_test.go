package chart_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	proxyproto "github.com/pires/go-proxyproto"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/musterhq/muster/db/dbtest"
	"github.com/musterhq/muster/internal/devissuer"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/tlsreload/tlstest"
	"github.com/musterhq/muster/internal/wait"
)

// TestMain stops the PostgreSQL cluster dbtest starts for
// TestRenderedStatefulSetRuns.
func TestMain(m *testing.M) { dbtest.Main(m) }

// realTime skips a test that runs real processes on the wall clock under
// -short, as cmd/muster's do.
func realTime(t *testing.T, what string) {
	t.Helper()
	if testing.Short() {
		t.Skip("real-time test (" + what + "): skipped with -short")
	}
}

// TestRenderedStatefulSetRuns renders the chart with production-like
// values (testdata/e2e.yaml: three replicas, TLS with the peers' CA and
// client certificates mapped by SPIFFE ID, PROXY protocol from
// 127.0.0.0/8) and runs three muster processes with the StatefulSet's
// container arguments and environment exactly as rendered, each with the
// files of its volumes materialised as the kubelet lays them out. What a
// pod has and loopback does not is substituted, and nothing else:
//   - status.podIP is ::1 (the pod network; 127.0.0.0/8 is the NLB's)
//     and metadata.name the pod's name, muster-0 to muster-2;
//   - each mount path is a folder of the pod's own under the test's temp
//     folder: the path prefix is rewritten in the arguments and
//     environment, and TMPDIR names the /tmp mount;
//   - the ports: the three share one host, so the API's, xDS's and the
//     metrics' ports are free ports of each replica's own;
//   - the replicas' stable DNS names (MUSTER_PEERS, MUSTER_ADVERTISE_URL)
//     are [::1] and their API ports: there is no cluster DNS;
//   - the Secrets the values name (existingSecret) are the test's: the
//     database URL from dbtest's PostgreSQL, a signing key, a CA with a
//     server certificate and a SPIFFE bundle, all generated here; the
//     issuer is a dev issuer on loopback (values, not a substitution).
//
// Then: all three are ready; web's SPIFFE certificate registers web's
// instance through a PROXY v2 sender (the header's address is the
// instance's) and gets its endpoints over xDS through the same sender
// from every replica; xDS without a client certificate or with one of
// another CA is refused; the rotated certificate Secret is served by the
// API, xDS and metrics listeners of every replica within 30 s.
func TestRenderedStatefulSetRuns(t *testing.T) {
	realTime(t, "three muster processes")
	bin := buildMuster(t)

	// The issuer the test's operator token comes from.
	iss, err := devissuer.LoadOrCreate(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	issSrv := httptest.NewServer(http.StripPrefix("/issuer", iss.Handler()))
	t.Cleanup(issSrv.Close)
	if err := iss.SetURL(issSrv.URL + "/issuer"); err != nil {
		t.Fatal(err)
	}

	o := mustRender(t, []string{"e2e.yaml"}, map[string]any{"issuers": []any{iss.URL()}})
	sts := one[*appsv1.StatefulSet](t, o)
	c := container(t, sts)

	serverCA := tlstest.NewCA(t)
	clientCA := tlstest.NewCA(t)
	leaf1 := serverLeaf(t, serverCA, sts, "muster-1")
	secrets := map[string]map[string][]byte{
		"muster-database":      {"DATABASE_URL": []byte(dbtest.URL(t))},
		"muster-signing-key":   {"signing.key": []byte(generatedKey(t))},
		"muster-tls":           {"tls.crt": leaf1.cert, "tls.key": leaf1.key, "ca.crt": serverCA.PEM},
		"muster-spiffe-bundle": {"bundle.pem": clientCA.PEM},
	}
	configMaps := map[string]map[string][]byte{
		"muster-spiffe": {"spiffe.yaml": []byte("trust_domains:\n  - trust_domain: prod.example.org\n    path: /ns/{namespace}/sa/{service}\n")},
	}
	for _, s := range of[*corev1.Secret](o) {
		if _, dup := secrets[s.Name]; dup {
			t.Fatalf("the chart renders Secret %s, which the test also gives", s.Name)
		}
		secrets[s.Name] = s.Data
		for k, v := range s.StringData {
			secrets[s.Name][k] = []byte(v)
		}
	}
	for _, cm := range of[*corev1.ConfigMap](o) {
		data := map[string][]byte{}
		for k, v := range cm.Data {
			data[k] = []byte(v)
		}
		if _, dup := configMaps[cm.Name]; dup {
			t.Fatalf("the chart renders ConfigMap %s, which the test also gives", cm.Name)
		}
		configMaps[cm.Name] = data
	}

	n := int(*sts.Spec.Replicas)
	if n != 3 {
		t.Fatalf("%d replicas rendered, want 3", n)
	}
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	if ports["api"] == 0 || ports["xds"] == 0 || ports["metrics"] == 0 {
		t.Fatalf("container ports %v: want api, xds and metrics", c.Ports)
	}
	pods := make([]*pod, n)
	for i := range pods {
		pods[i] = &pod{name: fmt.Sprintf("%s-%d", sts.Name, i), root: filepath.Join(t.TempDir(), "pod"), ports: map[string]int{}}
		for name := range ports {
			pods[i].ports[name] = freePort(t)
		}
	}
	for i, p := range pods {
		p.start(t, bin, sts, c, pods, ports, secrets, configMaps)
		t.Logf("%s: muster %s (API [::1]:%d, xDS [::1]:%d, metrics [::1]:%d)", p.name, strings.Join(p.args, " "),
			p.ports["api"], p.ports["xds"], p.ports["metrics"])
		if i == 0 {
			t.Logf("%s's environment:\n  %s", p.name, strings.Join(p.env, "\n  "))
		}
	}

	roots := serverCA.Pool()
	api := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}
	t.Cleanup(api.CloseIdleConnections)
	began := time.Now()
	for _, p := range pods {
		wait.For(t, 90*time.Second, p.name+" ready (/readyz over https)", func() bool {
			p.mustRun(t)
			res, err := api.Get(p.url("api") + "/readyz")
			if err != nil {
				return false
			}
			res.Body.Close()
			return res.StatusCode == http.StatusOK
		})
	}
	t.Logf("the three replicas were ready %s after they started", time.Since(began).Round(10*time.Millisecond))

	admin, err := iss.Mint(devissuer.TokenRequest{Kind: identity.KindOperator, Subject: "alice", Role: identity.RoleAdmin}, time.Now())
	if err != nil {
		t.Fatal(err)
	}

	// The replicas found each other at the addresses the rendered
	// MUSTER_PEERS and MUSTER_ADVERTISE_URL give (over https, verified
	// with MUSTER_TLS_CA), believe each other's sealed rows, and share the
	// shards with none unowned.
	for _, p := range pods {
		var last string
		wait.For(t, 60*time.Second, p.name+" seeing the three replicas, each with a share", func() bool {
			p.mustRun(t)
			req, _ := http.NewRequest("GET", p.url("api")+"/v1/replicas", nil)
			req.Header.Set("Authorization", "Bearer "+admin)
			res, err := api.Do(req)
			if err != nil {
				last = err.Error()
				return false
			}
			b, _ := io.ReadAll(res.Body)
			res.Body.Close()
			code, body := res.StatusCode, string(b)
			last = fmt.Sprintf("%d %s", code, body)
			var st struct {
				Replicas []struct {
					ID      string `json:"id"`
					Address string `json:"address"`
					Shards  int    `json:"shards"`
				} `json:"replicas"`
				Unowned    []int `json:"unowned"`
				Unbelieved []any `json:"unbelieved"`
				Relay      []struct {
					Peer      string `json:"peer"`
					Address   string `json:"address"`
					Connected bool   `json:"connected"`
				} `json:"relay"`
			}
			if code != http.StatusOK || json.Unmarshal([]byte(body), &st) != nil || len(st.Unowned) > 0 || len(st.Unbelieved) > 0 {
				return false
			}
			var got, relayed, want, wantRelayed []string
			for _, r := range st.Replicas {
				if r.Shards > 0 {
					got = append(got, fmt.Sprintf("%s=%s", r.ID, r.Address))
				}
			}
			// Each replica follows the other two's views over https.
			for _, r := range st.Relay {
				if r.Connected {
					relayed = append(relayed, r.Peer+"="+r.Address)
				}
			}
			for _, q := range pods {
				want = append(want, q.name+"="+q.url("api"))
				if q != p {
					wantRelayed = append(wantRelayed, q.name+"="+q.url("api"))
				}
			}
			slices.Sort(got)
			slices.Sort(relayed)
			last = fmt.Sprintf("replicas with shards %v, relays connected %v", got, relayed)
			return slices.Equal(got, want) && slices.Equal(relayed, wantRelayed)
		})
		t.Logf("%s: %s", p.name, last)
	}

	// An operator creates web, over the pod network.
	req, _ := http.NewRequest("PUT", pods[0].url("api")+"/v1/services/web", strings.NewReader(`{"owner":"payments","capabilities":[]}`))
	req.Header.Set("Authorization", "Bearer "+admin)
	req.Header.Set("Content-Type", "application/json")
	if res, body := do(t, api, req); res != http.StatusCreated {
		t.Fatalf("create web: %d %s", res, body)
	}

	// web registers its instance at 10.9.8.7 through the NLB (127.0.0.2,
	// in 127.0.0.0/8) with its SPIFFE certificate and no token: the PROXY
	// header's source address is what proves the instance's.
	webCert := clientCA.ClientCert(t, "spiffe://prod.example.org/ns/shop/sa/web")
	lb := throughNLB(roots, &webCert, "10.9.8.7:41000")
	req, _ = http.NewRequest("POST", fmt.Sprintf("https://127.0.0.1:%d/v1/services/web/instances", pods[1].ports["api"]),
		strings.NewReader(`{"address":"10.9.8.7","port":9000,"zone":"az1"}`))
	req.Header.Set("Content-Type", "application/json")
	if res, body := do(t, lb, req); res != http.StatusCreated {
		t.Fatalf("web registers 10.9.8.7 through the NLB with its certificate: %d %s", res, body)
	}

	// Every replica's xDS, through the NLB, answers web's certificate with
	// web's endpoints.
	for i, p := range pods {
		xds := fmt.Sprintf("127.0.0.1:%d", p.ports["xds"])
		var last string
		wait.For(t, 30*time.Second, p.name+"'s xDS serving web's endpoints through the NLB", func() bool {
			p.mustRun(t)
			r, err := xdsFirst(t, xds, roots, &webCert, nlbDialer(fmt.Sprintf("10.9.8.7:%d", 42000+i)))
			last = fmt.Sprintf("%d resources, %v", len(r.GetResources()), err)
			return err == nil && len(r.GetResources()) == 1
		})
		t.Logf("%s's xDS through the NLB: %s", p.name, last)
	}
	xds0 := fmt.Sprintf("127.0.0.1:%d", pods[0].ports["xds"])
	if _, err := xdsFirst(t, xds0, roots, nil, nlbDialer("10.9.8.7:43000")); status.Code(err) != codes.Unauthenticated {
		t.Errorf("xDS through the NLB without a client certificate (or token): %v, want Unauthenticated", err)
	}
	stranger := tlstest.NewCA(t).ClientCert(t, "spiffe://prod.example.org/ns/shop/sa/web")
	if _, err := xdsFirst(t, xds0, roots, &stranger, nlbDialer("10.9.8.7:43001")); status.Code(err) != codes.Unavailable {
		t.Errorf("xDS through the NLB with a certificate of another CA: %v, want the handshake refused (Unavailable)", err)
	}
	// 127.0.0.1 is in the NLB's networks: a connection without a header
	// is not the balancer's, and is closed.
	if _, err := xdsFirst(t, xds0, roots, &webCert); status.Code(err) != codes.Unavailable {
		t.Errorf("xDS from 127.0.0.1 without a PROXY header: %v, want the connection refused (Unavailable)", err)
	}

	// Every listener serves the Secret's certificate; then cert-manager
	// rotates the Secret and the kubelet swaps each pod's files.
	listeners := func() map[string]string {
		m := map[string]string{}
		for _, p := range pods {
			for _, l := range []string{"api", "xds", "metrics"} {
				m[fmt.Sprintf("%s %s [::1]:%d", p.name, l, p.ports[l])] = fmt.Sprintf("[::1]:%d", p.ports[l])
			}
		}
		return m
	}()
	for name, addr := range listeners {
		if s := servedSerial(t, addr, roots); s != leaf1.serial.String() {
			t.Fatalf("%s serves serial %s, want the Secret's %s", name, s, leaf1.serial)
		}
	}
	leaf2 := serverLeaf(t, serverCA, sts, "muster-2")
	secrets["muster-tls"] = map[string][]byte{"tls.crt": leaf2.cert, "tls.key": leaf2.key, "ca.crt": serverCA.PEM}
	rotated := time.Now()
	for _, p := range pods {
		p.update(t, "muster-tls", secrets["muster-tls"])
	}
	var stale []string
	wait.For(t, 30*time.Second, "every listener serving the rotated certificate", func() bool {
		stale = stale[:0]
		for name, addr := range listeners {
			if servedSerial(t, addr, roots) != leaf2.serial.String() {
				stale = append(stale, name)
			}
		}
		return len(stale) == 0
	})
	t.Logf("all %d listeners served the rotated certificate %s after the swap", len(listeners), time.Since(rotated).Round(10*time.Millisecond))
	for _, p := range pods {
		p.mustRun(t)
	}
	if r, err := xdsFirst(t, xds0, roots, &webCert, nlbDialer("10.9.8.7:43002")); err != nil || len(r.GetResources()) != 1 {
		t.Errorf("xDS through the NLB after the rotation: %v", err)
	}
}

// buildMuster builds the muster binary once for the test (without the
// race detector: it is the program under test, not the test).
func buildMuster(t *testing.T) string {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	}
	bin := filepath.Join(t.TempDir(), "muster")
	cmd := exec.Command(goTool, "build", "-o", bin, "./cmd/muster")
	cmd.Dir = "../.."
	began := time.Now()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/muster: %v\n%s", err, out)
	}
	t.Logf("built muster in %s", time.Since(began).Round(100*time.Millisecond))
	return bin
}

// freePort returns a port nothing listens on, on any address, below
// Linux's ephemeral range (so no outgoing connection takes it before the
// process binds it).
func freePort(t *testing.T) int {
	t.Helper()
	for range 100 {
		p := 20000 + mrand.IntN(12000)
		ln, err := net.Listen("tcp", fmt.Sprintf(":%d", p))
		if err != nil {
			continue
		}
		ln.Close()
		return p
	}
	t.Fatal("no free port in 100 draws")
	return 0
}

// pod is one replica: its name, its folder (mount paths lie under it),
// its ports, and the muster process running its container.
type pod struct {
	name  string
	root  string
	ports map[string]int // by the container port's name
	args  []string
	env   []string
	// mounts are the container's volume mounts with their volumes.
	mounts []mountedVolume
	cmd    *exec.Cmd
	log    *os.File
	done   chan struct{}
}

type mountedVolume struct {
	m corev1.VolumeMount
	v corev1.Volume
}

func (p *pod) url(port string) string { return fmt.Sprintf("https://[::1]:%d", p.ports[port]) }

// start materialises the pod's volumes and runs its container.
func (p *pod) start(t *testing.T, bin string, sts *appsv1.StatefulSet, c corev1.Container, pods []*pod,
	ports map[string]int32, secrets, configMaps map[string]map[string][]byte) {
	t.Helper()
	vols := map[string]corev1.Volume{}
	for _, v := range sts.Spec.Template.Spec.Volumes {
		vols[v.Name] = v
	}
	var pairs []string // for the rewriting, longest first
	var mountPaths []string
	for _, m := range c.VolumeMounts {
		v, ok := vols[m.Name]
		if !ok {
			t.Fatalf("mount %s names no volume", m.Name)
		}
		if m.SubPath != "" || m.SubPathExpr != "" {
			t.Fatalf("mount %s uses a subPath, which the test does not lay out", m.Name)
		}
		p.mounts = append(p.mounts, mountedVolume{m, v})
		mountPaths = append(mountPaths, m.MountPath)
		dir := p.root + m.MountPath
		switch {
		case v.EmptyDir != nil:
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
		case v.Secret != nil:
			data, ok := secrets[v.Secret.SecretName]
			if !ok {
				t.Fatalf("volume %s: no Secret %s", v.Name, v.Secret.SecretName)
			}
			project(t, dir, data, v.Secret.Items, v.Secret.DefaultMode)
		case v.ConfigMap != nil:
			data, ok := configMaps[v.ConfigMap.Name]
			if !ok {
				t.Fatalf("volume %s: no ConfigMap %s", v.Name, v.ConfigMap.Name)
			}
			project(t, dir, data, v.ConfigMap.Items, v.ConfigMap.DefaultMode)
		default:
			t.Fatalf("volume %s: a kind the test does not lay out: %+v", v.Name, v.VolumeSource)
		}
	}
	slices.SortFunc(mountPaths, func(a, b string) int { return len(b) - len(a) })
	for _, mp := range mountPaths {
		pairs = append(pairs, mp+"/", p.root+mp+"/")
	}
	// The replicas' stable names, then this replica's ports.
	for _, q := range pods {
		pairs = append(pairs, fmt.Sprintf("%s.%s.%s.svc.cluster.local:%d", q.name, sts.Spec.ServiceName, namespace, ports["api"]),
			fmt.Sprintf("[::1]:%d", q.ports["api"]))
	}
	for name, port := range ports {
		pairs = append(pairs, fmt.Sprintf(":%d", port), fmt.Sprintf(":%d", p.ports[name]))
	}
	rewrite := strings.NewReplacer(pairs...)

	// The environment in order, each $(VAR) expanded from the variables
	// before it, as the kubelet does; then the arguments from all of it.
	vars := map[string]string{}
	expand := func(s string) string { return expandVars(s, vars) }
	var names []string
	for _, e := range c.Env {
		var v string
		switch {
		case e.ValueFrom == nil:
			v = expand(e.Value)
		case e.ValueFrom.FieldRef != nil:
			switch e.ValueFrom.FieldRef.FieldPath {
			case "status.podIP":
				v = "::1"
			case "metadata.name":
				v = p.name
			default:
				t.Fatalf("%s: field %s is not substituted", e.Name, e.ValueFrom.FieldRef.FieldPath)
			}
		case e.ValueFrom.SecretKeyRef != nil:
			v = string(secrets[e.ValueFrom.SecretKeyRef.Name][e.ValueFrom.SecretKeyRef.Key])
		case e.ValueFrom.ConfigMapKeyRef != nil:
			v = string(configMaps[e.ValueFrom.ConfigMapKeyRef.Name][e.ValueFrom.ConfigMapKeyRef.Key])
		default:
			t.Fatalf("%s: a valueFrom the test does not resolve: %+v", e.Name, e.ValueFrom)
		}
		if v == "" && e.ValueFrom != nil {
			t.Fatalf("%s: nothing at %+v", e.Name, e.ValueFrom)
		}
		if _, dup := vars[e.Name]; dup {
			t.Fatalf("%s set twice", e.Name)
		}
		vars[e.Name] = v
		names = append(names, e.Name)
	}
	for _, name := range names {
		p.env = append(p.env, name+"="+rewrite.Replace(vars[name]))
	}
	p.env = append(p.env, "TMPDIR="+p.root+"/tmp")
	if len(c.Command) > 0 {
		t.Fatalf("the container sets a command %v: the test runs the image's entrypoint, muster", c.Command)
	}
	for _, a := range c.Args {
		p.args = append(p.args, rewrite.Replace(expand(a)))
	}

	log, err := os.Create(filepath.Join(filepath.Dir(p.root), p.name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	p.log = log
	p.cmd = exec.Command(bin, p.args...)
	p.cmd.Env = p.env
	p.cmd.Dir = p.root
	p.cmd.Stdout, p.cmd.Stderr = log, log
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p.done = make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			b, _ := os.ReadFile(log.Name())
			lines := strings.Split(string(b), "\n")
			if len(lines) > 60 {
				lines = lines[len(lines)-60:]
			}
			t.Logf("%s's log (its last %d lines):\n%s", p.name, len(lines), strings.Join(lines, "\n"))
		}
		log.Close()
	})
}

// mustRun fails the test when the pod's process has exited.
func (p *pod) mustRun(t *testing.T) {
	t.Helper()
	select {
	case <-p.done:
		t.Fatalf("%s exited: %v", p.name, p.cmd.ProcessState)
	default:
	}
}

// update lays the Secret's new data into every volume of the pod that
// projects it, as the kubelet does when a Secret changes.
func (p *pod) update(t *testing.T, secret string, data map[string][]byte) {
	t.Helper()
	n := 0
	for _, mv := range p.mounts {
		if s := mv.v.Secret; s != nil && s.SecretName == secret {
			project(t, p.root+mv.m.MountPath, data, s.Items, s.DefaultMode)
			n++
		}
	}
	if n == 0 {
		t.Fatalf("%s mounts no volume of Secret %s", p.name, secret)
	}
}

var projections sync.Mutex

// project writes a Secret's or ConfigMap's data into dir as the kubelet's
// atomic writer does: the files in a fresh hidden folder, ..data a
// symbolic link to it, renamed over the last one, and each visible file a
// link through ..data. Only items are written when given; modes are the
// item's, else defaultMode, else 0644.
func project(t *testing.T, dir string, data map[string][]byte, items []corev1.KeyToPath, defaultMode *int32) {
	t.Helper()
	projections.Lock()
	defer projections.Unlock()
	mode := os.FileMode(0o644)
	if defaultMode != nil {
		mode = os.FileMode(*defaultMode)
	}
	files := map[string]os.FileMode{} // path in the volume: mode
	content := map[string][]byte{}
	if len(items) == 0 {
		for k, v := range data {
			files[k], content[k] = mode, v
		}
	}
	for _, it := range items {
		v, ok := data[it.Key]
		if !ok {
			t.Fatalf("%s: no key %s", dir, it.Key)
		}
		m := mode
		if it.Mode != nil {
			m = os.FileMode(*it.Mode)
		}
		files[it.Path], content[it.Path] = m, v
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	ts, err := os.MkdirTemp(dir, ".."+time.Now().UTC().Format("2006_01_02_15_04_05.")+"*")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(ts, 0o755); err != nil {
		t.Fatal(err)
	}
	for f, m := range files {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(ts, f)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(ts, f), content[f], m); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(filepath.Join(ts, f), m); err != nil { // past the umask
			t.Fatal(err)
		}
	}
	old, _ := os.Readlink(filepath.Join(dir, "..data"))
	tmp := filepath.Join(dir, "..data_tmp")
	_ = os.Remove(tmp)
	if err := os.Symlink(filepath.Base(ts), tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	for f := range files {
		top := strings.Split(f, "/")[0]
		link := filepath.Join(dir, top)
		if _, err := os.Lstat(link); errors.Is(err, os.ErrNotExist) {
			if err := os.Symlink(filepath.Join("..data", top), link); err != nil {
				t.Fatal(err)
			}
		}
	}
	if old != "" {
		_ = os.RemoveAll(filepath.Join(dir, old))
	}
}

// expandVars expands $(NAME) from vars as Kubernetes expands container
// environment values and arguments: $$ is a literal $, and a reference to
// a variable not defined before it stays as written.
func expandVars(s string, vars map[string]string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 == len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$':
			b.WriteByte('$')
			i++
		case '(':
			end := strings.IndexByte(s[i+2:], ')')
			if end < 0 {
				b.WriteString(s[i:])
				return b.String()
			}
			name := s[i+2 : i+2+end]
			if v, ok := vars[name]; ok {
				b.WriteString(v)
			} else {
				b.WriteString(s[i : i+3+end])
			}
			i += 2 + end
		default:
			b.WriteByte('$')
		}
	}
	return b.String()
}

// nlbDialer sends, from 127.0.0.2 (in the NLB's networks), a PROXY v2
// header for a client at src before anything else, as an NLB passing TLS
// through does.
func nlbDialer(src string) grpc.DialOption {
	return grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
		return dialNLB(ctx, addr, src)
	})
}

func dialNLB(ctx context.Context, addr, src string) (net.Conn, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}, Timeout: 5 * time.Second}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	h := proxyproto.HeaderProxyFromAddrs(2, net.TCPAddrFromAddrPort(netip.MustParseAddrPort(src)), c.RemoteAddr())
	if _, err := h.WriteTo(c); err != nil {
		_ = c.Close()
		return nil, err
	}
	return c, nil
}

// throughNLB is an HTTPS client whose connections come through the NLB
// for a client at src, presenting cert.
func throughNLB(roots *x509.CertPool, cert *tls.Certificate, src string) *http.Client {
	tc := &tls.Config{RootCAs: roots}
	if cert != nil {
		tc.Certificates = []tls.Certificate{*cert}
	}
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig:   tc,
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			return dialNLB(ctx, addr, src)
		},
	}}
}

func do(t *testing.T, c *http.Client, req *http.Request) (int, string) {
	t.Helper()
	res, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

// xdsFirst opens a delta ADS stream to addr over TLS trusting roots,
// presenting cert (none when nil), subscribes to web's endpoints and
// returns the first response or the stream's error, within 10 s.
func xdsFirst(t *testing.T, addr string, roots *x509.CertPool, cert *tls.Certificate, extra ...grpc.DialOption) (*discovery.DeltaDiscoveryResponse, error) {
	t.Helper()
	tc := &tls.Config{RootCAs: roots}
	if cert != nil {
		tc.Certificates = []tls.Certificate{*cert}
	}
	conn, err := grpc.NewClient(addr, append([]grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(tc))}, extra...)...)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	s, err := discovery.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(ctx)
	if err != nil {
		return nil, err
	}
	if err := s.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNamesSubscribe: []string{"web"}}); err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	return s.Recv()
}

// servedSerial is the serial number of the certificate addr serves on a
// new TLS connection.
func servedSerial(t *testing.T, addr string, roots *x509.CertPool) string {
	t.Helper()
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr,
		&tls.Config{RootCAs: roots, NextProtos: []string{"h2", "http/1.1"}})
	if err != nil {
		t.Fatalf("TLS handshake with %s: %v", addr, err)
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0].SerialNumber.String()
}

type leaf struct {
	cert, key []byte
	serial    *big.Int
}

// serverLeaf issues a replica's serving certificate from ca as
// cert-manager would for the chart: the headless Service's wildcard name,
// and here also the loopback addresses the test reaches them at.
func serverLeaf(t *testing.T, ca *tlstest.CA, sts *appsv1.StatefulSet, cn string) leaf {
	t.Helper()
	certPEM, keyPEM := ca.LeafFor(t, cn, []string{fmt.Sprintf("*.%s.%s.svc.cluster.local", sts.Spec.ServiceName, namespace), "localhost"},
		[]net.IP{net.IPv6loopback, net.IPv4(127, 0, 0, 1)}, 12*time.Hour)
	block, _ := pem.Decode(certPEM)
	if block == nil {
		t.Fatal("the issued certificate is not PEM")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return leaf{cert: certPEM, key: keyPEM, serial: cert.SerialNumber}
}

// TestExpandVars: $(VAR) as the kubelet expands it in the environment and
// arguments the process test runs with.
func TestExpandVars(t *testing.T) {
	vars := map[string]string{"POD_NAME": "muster-0", "POD_IP": "::1"}
	for in, want := range map[string]string{
		"$(POD_NAME)":            "muster-0",
		"https://$(POD_NAME).x":  "https://muster-0.x",
		"[$(POD_IP)]:9464":       "[::1]:9464",
		"$(UNSET) stays":         "$(UNSET) stays",
		"$$(POD_NAME) is quoted": "$(POD_NAME) is quoted",
		"a $ b $x":               "a $ b $x",
		"open $(POD_NAME":        "open $(POD_NAME",
		"end $":                  "end $",
	} {
		if got := expandVars(in, vars); got != want {
			t.Errorf("expand %q = %q, want %q", in, got, want)
		}
	}
}
