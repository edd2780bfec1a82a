package reconcile

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	yaml "go.yaml.in/yaml/v3"

	"github.com/musterhq/muster/internal/identity"
)

// FileConfig is the file `muster serve --reconcile-config FILE` reads
// (YAML, or JSON, which is YAML too): the sources to reconcile, the
// disbelief threshold, and the platform issuers whose tokens the
// reconciled workloads present. docs/reconciliation.md has a complete example.
type FileConfig struct {
	// Every is the pass period of every source (default 5 s).
	Every     time.Duration     `yaml:"every"`
	Disbelief DisbeliefFile     `yaml:"disbelief"`
	Clusters  []ClusterFile     `yaml:"kubernetes"`
	Snapshots []SnapshotFile    `yaml:"snapshots"`
	Issuers   []PlatformIssuers `yaml:"issuers"`
}

// DisbeliefFile is Disbelief as the file spells it.
type DisbeliefFile struct {
	Fraction    float64       `yaml:"fraction"`
	MinRemovals int           `yaml:"min_removals"`
	Window      time.Duration `yaml:"window"`
	// Dwell is the old name of Window. It once also released a hold when
	// a later reading still lacked the instances; nothing but recovery
	// or a confirmation releases one now.
	Dwell time.Duration `yaml:"dwell"`
}

// disbelief is the file's Disbelief.
func (f DisbeliefFile) disbelief() Disbelief {
	w := f.Window
	if w == 0 {
		w = f.Dwell
	}
	return Disbelief{Fraction: f.Fraction, MinRemovals: f.MinRemovals, Window: w}
}

// ClusterFile is one Kubernetes cluster.
type ClusterFile struct {
	Cluster string `yaml:"cluster"`
	// Kubeconfig and Context; both empty for the in-cluster config.
	Kubeconfig     string `yaml:"kubeconfig"`
	Context        string `yaml:"context"`
	Namespace      string `yaml:"namespace"`
	Selector       string `yaml:"selector"`
	Annotation     string `yaml:"annotation"`
	PortAnnotation string `yaml:"port_annotation"`
	// Members maps a muster service to the namespaces whose Services may
	// supply its members from this cluster while the service names no
	// member sources of its own (PUT /v1/services/{name}/member-sources).
	// The issuer's service_accounts count too: "shop/web: web" lets
	// namespace shop supply web.
	Members map[string][]string `yaml:"members"`
	// Issuer is the cluster's service-account token issuer, when its pods
	// authenticate with their projected tokens.
	Issuer *ClusterIssuer `yaml:"issuer"`
}

// ClusterIssuer is a cluster's service-account issuer and its mapping.
type ClusterIssuer struct {
	URL      string `yaml:"url"`
	Audience string `yaml:"audience"`
	// ServiceAccounts maps "namespace/serviceaccount" to a muster service.
	ServiceAccounts map[string]string `yaml:"service_accounts"`
}

// SnapshotFile is one inventory snapshot.
type SnapshotFile struct {
	Name   string `yaml:"name"`
	File   string `yaml:"file"`
	URL    string `yaml:"url"`
	Format string `yaml:"format"`
	// TokenFile holds the bearer token for URL (secrets live in files).
	TokenFile string `yaml:"token_file"`
}

// PlatformIssuers is a platform issuer outside Kubernetes (AWS web
// identity).
type PlatformIssuers struct {
	URL      string `yaml:"url"`
	Audience string `yaml:"audience"`
	// Type is aws.
	Type string `yaml:"type"`
	// Claim holds the role session ARN ("sub" by default).
	Claim string `yaml:"claim"`
	// Roles maps an IAM role name to a muster service.
	Roles map[string]string `yaml:"roles"`
}

// LoadConfig reads and validates the file at path. Its errors name the
// file, the line and the field.
func LoadConfig(path string) (FileConfig, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return FileConfig{}, fmt.Errorf("reconcile config: %w", err)
	}
	return ParseConfig(path, b)
}

// ParseConfig parses and validates b, read from name.
func ParseConfig(name string, b []byte) (FileConfig, error) {
	var c FileConfig
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil {
		if errors.Is(err, io.EOF) || strings.TrimSpace(string(b)) == "" {
			return FileConfig{}, fmt.Errorf("%s: empty reconcile config", name)
		}
		return FileConfig{}, fmt.Errorf("%s: %s", name, strings.ReplaceAll(strings.TrimPrefix(err.Error(), "yaml: "), "\n ", ""))
	}
	var root yaml.Node
	_ = yaml.Unmarshal(b, &root)
	var errs []string
	bad := func(path string, format string, args ...any) {
		errs = append(errs, fmt.Sprintf("%s:%d: %s: %s", name, lineOf(&root, path), path, fmt.Sprintf(format, args...)))
	}
	d := c.Disbelief.disbelief()
	if err := d.Validate(); err != nil {
		bad("disbelief", "%v", err)
	}
	if c.Every < 0 || (c.Every > 0 && c.Every < 100*time.Millisecond) {
		bad("every", "%s: must be at least 100ms", c.Every)
	}
	if len(c.Clusters) == 0 && len(c.Snapshots) == 0 {
		bad("kubernetes", "no sources: configure kubernetes clusters or snapshots")
	}
	seen := map[string]bool{}
	for i, k := range c.Clusters {
		p := fmt.Sprintf("kubernetes.%d", i)
		if !validName(k.Cluster) {
			bad(p+".cluster", "%q must be a DNS label (the source is k8s/<cluster>)", k.Cluster)
		} else if seen["k8s/"+k.Cluster] {
			bad(p+".cluster", "cluster %s configured twice", k.Cluster)
		}
		seen["k8s/"+k.Cluster] = true
		if k.Context != "" && k.Kubeconfig == "" {
			bad(p+".context", "a context needs a kubeconfig")
		}
		for svc, nss := range k.Members {
			if !validName(svc) {
				bad(p+".members", "%q is not a service name", svc)
			}
			if len(nss) == 0 {
				bad(p+".members."+svc, "name at least one namespace")
			}
			for _, n := range nss {
				if !validName(n) {
					bad(p+".members."+svc, "%q is not a namespace name", n)
				}
			}
		}
		if k.Issuer != nil {
			m := identity.ClaimMapping{Type: identity.MappingKubernetes, Cluster: k.Cluster, Services: k.Issuer.ServiceAccounts}
			if err := identity.ValidateIssuerURL(k.Issuer.URL); err != nil {
				bad(p+".issuer.url", "%v", err)
			}
			if err := m.Validate(); err != nil {
				bad(p+".issuer.service_accounts", "%v", err)
			}
		}
	}
	for i, s := range c.Snapshots {
		p := fmt.Sprintf("snapshots.%d", i)
		if !validName(s.Name) {
			bad(p+".name", "%q must be a DNS label (the source is snapshot/<name>)", s.Name)
		} else if seen["snapshot/"+s.Name] {
			bad(p+".name", "snapshot %s configured twice", s.Name)
		}
		seen["snapshot/"+s.Name] = true
		if (s.File == "") == (s.URL == "") {
			bad(p, "needs exactly one of file and url")
		}
		if s.URL != "" {
			if err := checkURL(s.URL); err != nil {
				bad(p+".url", "%v", err)
			}
		}
		if s.TokenFile != "" && s.URL == "" {
			bad(p+".token_file", "a token is sent to a url only")
		}
		if s.Format != "" && s.Format != FormatJSON && s.Format != FormatCSV {
			bad(p+".format", "%q: want json or csv", s.Format)
		}
	}
	for i, is := range c.Issuers {
		p := fmt.Sprintf("issuers.%d", i)
		if err := identity.ValidateIssuerURL(is.URL); err != nil {
			bad(p+".url", "%v", err)
		}
		m := identity.ClaimMapping{Type: is.Type, Claim: is.Claim, Services: is.Roles}
		if is.Type != identity.MappingAWS {
			bad(p+".type", "%q: want aws (a cluster's service-account issuer goes under its kubernetes entry)", is.Type)
		} else if err := m.Validate(); err != nil {
			bad(p+".roles", "%v", err)
		}
	}
	if len(errs) > 0 {
		return FileConfig{}, errors.New(strings.Join(errs, "\n"))
	}
	return c, nil
}

// lineOf is the line of the node at a dotted path (map keys, list
// indexes), or of the deepest part of it that exists.
func lineOf(root *yaml.Node, path string) int {
	n := root
	if n.Kind == yaml.DocumentNode && len(n.Content) > 0 {
		n = n.Content[0]
	}
	line := n.Line
	for _, part := range strings.Split(path, ".") {
		var next *yaml.Node
		switch n.Kind {
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				if n.Content[i].Value == part {
					line, next = n.Content[i].Line, n.Content[i+1]
					break
				}
			}
		case yaml.SequenceNode:
			if i, err := strconv.Atoi(part); err == nil && i < len(n.Content) {
				next = n.Content[i]
				line = next.Line
			}
		}
		if next == nil {
			return line
		}
		n = next
	}
	return line
}

// Build makes the sources and the issuers the file configures. Kubernetes
// clients are built from each kubeconfig (or the in-cluster config); no
// connection is made until the sources start.
func (c FileConfig) Build(now func() time.Time) (Config, []identity.IssuerConfig, error) {
	cfg := Config{Every: c.Every, Disbelief: c.Disbelief.disbelief(), Now: now}
	var issuers []identity.IssuerConfig
	for _, k := range c.Clusters {
		client, err := KubernetesClient(k.Kubeconfig, k.Context)
		if err != nil {
			return Config{}, nil, fmt.Errorf("cluster %s: %w", k.Cluster, err)
		}
		src, err := NewKubernetesSource(KubernetesConfig{Cluster: k.Cluster, Client: client, Namespace: k.Namespace, Selector: k.Selector,
			Annotation: k.Annotation, PortAnnotation: k.PortAnnotation, Members: k.DefaultMembers(), Now: now})
		if err != nil {
			return Config{}, nil, err
		}
		cfg.Sources = append(cfg.Sources, src)
		if k.Issuer != nil {
			issuers = append(issuers, identity.IssuerConfig{URL: k.Issuer.URL, Audience: k.Issuer.Audience, Mapping: &identity.ClaimMapping{
				Type: identity.MappingKubernetes, Cluster: k.Cluster, Services: k.Issuer.ServiceAccounts}})
		}
	}
	for _, s := range c.Snapshots {
		sc := SnapshotConfig{Name: s.Name, File: s.File, URL: s.URL, Format: s.Format, Now: now}
		if s.TokenFile != "" {
			b, err := os.ReadFile(s.TokenFile)
			if err != nil {
				return Config{}, nil, fmt.Errorf("snapshot %s: token_file: %w", s.Name, err)
			}
			sc.Token = strings.TrimSpace(string(b))
		}
		src, err := NewSnapshotSource(sc)
		if err != nil {
			return Config{}, nil, err
		}
		cfg.Sources = append(cfg.Sources, src)
	}
	for _, is := range c.Issuers {
		issuers = append(issuers, identity.IssuerConfig{URL: is.URL, Audience: is.Audience, Mapping: &identity.ClaimMapping{
			Type: is.Type, Claim: is.Claim, Services: is.Roles}})
	}
	return cfg, issuers, nil
}

// DefaultMembers are the namespaces the cluster's configuration vouches
// for, by muster service: its members, and the namespaces of its issuer's
// service accounts mapped to each service. A service that names no member
// sources takes members from this cluster from these namespaces only.
func (k ClusterFile) DefaultMembers() map[string][]string {
	out := map[string][]string{}
	add := func(svc, ns string) {
		if !slices.Contains(out[svc], ns) {
			out[svc] = append(out[svc], ns)
		}
	}
	for svc, nss := range k.Members {
		for _, n := range nss {
			add(svc, n)
		}
	}
	if k.Issuer != nil {
		for sa, svc := range k.Issuer.ServiceAccounts {
			if ns, _, ok := strings.Cut(sa, "/"); ok {
				add(svc, ns)
			}
		}
	}
	return out
}
