package reconcile_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/musterhq/muster/internal/reconcile"
)

const exampleConfig = `# muster serve --reconcile-config
every: 5s
disbelief:
  fraction: 0.2
  min_removals: 3
  dwell: 2m
kubernetes:
  - cluster: prod
    kubeconfig: KUBECONFIG
    context: prod
    namespace: shop
    issuer:
      url: https://oidc.eks.eu-west-1.amazonaws.com/id/EXAMPLE
      audience: muster
      service_accounts:
        shop/web: web
snapshots:
  - name: ec2-web
    file: /var/lib/inventory/web.json
  - name: ecs-api
    url: https://inventory.internal/ecs/api.csv
    token_file: TOKENFILE
issuers:
  - url: https://sts.example.internal
    type: aws
    roles:
      123456789012:role/api-task-role: api
`

func TestConfigExample(t *testing.T) {
	dir := t.TempDir()
	kube := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kube, []byte(`apiVersion: v1
kind: Config
clusters: [{name: prod, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: muster, user: {token: x}}]
contexts: [{name: prod, context: {cluster: prod, user: muster}}]
current-context: prod
`), 0o600); err != nil {
		t.Fatal(err)
	}
	tok := filepath.Join(dir, "token")
	if err := os.WriteFile(tok, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	body := strings.NewReplacer("KUBECONFIG", kube, "TOKENFILE", tok).Replace(exampleConfig)
	c, err := reconcile.ParseConfig("muster.yaml", []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	cfg, issuers, err := c.Build(time.Now)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range cfg.Sources {
		names = append(names, s.Name())
	}
	if strings.Join(names, ",") != "k8s/prod,snapshot/ec2-web,snapshot/ecs-api" {
		t.Fatalf("sources %v", names)
	}
	if len(issuers) != 2 || issuers[0].Mapping.Cluster != "prod" || issuers[0].Mapping.Services["shop/web"] != "web" || issuers[1].Mapping.Services["123456789012:role/api-task-role"] != "api" {
		t.Fatalf("issuers %+v", issuers)
	}
	if cfg.Disbelief.Window != 2*time.Minute || cfg.Every != 5*time.Second {
		t.Fatalf("config %+v", cfg)
	}
	// JSON is YAML too.
	if _, err := reconcile.ParseConfig("muster.json", []byte(`{"snapshots":[{"name":"a","file":"/x.json"}]}`)); err != nil {
		t.Fatal(err)
	}
}

func TestConfigErrorsNameLineAndField(t *testing.T) {
	for _, c := range []struct{ body, want string }{
		{"", "empty reconcile config"},
		{"snapshots:\n  - name: a\n    fil: /x\n", "line 3: field fil not found"},
		{"every: soon\nsnapshots: [{name: a, file: /x}]\n", "line 1"},
		{"snapshots:\n  - name: A\n    file: /x\n", "muster.yaml:2: snapshots.0.name"},
		{"snapshots:\n  - name: a\n", "muster.yaml:2: snapshots.0: needs exactly one of file and url"},
		{"snapshots:\n  - name: a\n    url: http://inventory.example/x\n", "muster.yaml:3: snapshots.0.url"},
		{"disbelief:\n  fraction: 1.5\nsnapshots: [{name: a, file: /x}]\n", "muster.yaml:1: disbelief"},
		{"kubernetes:\n  - cluster: prod\n    issuer:\n      url: https://i.example\n      service_accounts:\n        web: web\n", "muster.yaml:5: kubernetes.0.issuer.service_accounts: kubernetes mapping: key \"web\" must be namespace/serviceaccount"},
		{"kubernetes:\n  - cluster: prod\n  - cluster: prod\n", "muster.yaml:3: kubernetes.1.cluster: cluster prod configured twice"},
		{"issuers:\n  - url: https://i.example\n    type: gcp\nsnapshots: [{name: a, file: /x}]\n", "muster.yaml:3: issuers.0.type"},
		{"every: 1s\n", "no sources"},
		{"kubernetes:\n  - cluster: prod\n    members:\n      web: [Shop]\n", "muster.yaml:4: kubernetes.0.members.web: \"Shop\" is not a namespace name"},
		{"kubernetes:\n  - cluster: prod\n    members:\n      web: []\n", "kubernetes.0.members.web: name at least one namespace"},
	} {
		_, err := reconcile.ParseConfig("muster.yaml", []byte(c.body))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want an error with %q", c.body, err, c.want)
		}
	}
}

// TestConfigDocExample: the complete example in docs/reconciliation.md
// parses.
func TestConfigDocExample(t *testing.T) {
	b, err := os.ReadFile("../../docs/reconciliation.md")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	i := strings.Index(s, "A complete `--reconcile-config`")
	if i < 0 {
		t.Fatal("docs/reconciliation.md has no complete reconcile config example")
	}
	s = s[i:]
	start := strings.Index(s, "```yaml\n") + len("```yaml\n")
	end := strings.Index(s[start:], "```")
	c, err := reconcile.ParseConfig("docs/reconciliation.md", []byte(s[start:start+end]))
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Clusters) != 1 || len(c.Snapshots) != 2 || len(c.Issuers) != 1 || c.Clusters[0].Issuer == nil {
		t.Fatalf("docs/reconciliation.md example parsed to %+v", c)
	}
}

// TestConfigDefaultMembers: a cluster vouches, for a service that names
// no member sources, for the namespaces its members list and those of
// its issuer's service accounts mapped to the service; nothing else.
func TestConfigDefaultMembers(t *testing.T) {
	c, err := reconcile.ParseConfig("muster.yaml", []byte(`kubernetes:
  - cluster: prod
    members:
      web: [shop, shop-canary]
      api: [search]
    issuer:
      url: https://oidc.example
      service_accounts:
        shop/web: web
        payments/checkout: checkout
`))
	if err != nil {
		t.Fatal(err)
	}
	got := c.Clusters[0].DefaultMembers()
	want := map[string][]string{"web": {"shop", "shop-canary"}, "api": {"search"}, "checkout": {"payments"}}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("default members (-want +got):\n%s", d)
	}
}
