package tgsync

import (
	"bytes"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Defaults of a configuration.
const (
	DefaultInterval              = 30 * time.Second
	DefaultMaxDeregisterFraction = 0.10
	DefaultAddStepFraction       = 0.25
	DefaultAWSMaxAttempts        = 10
	DefaultAWSMaxBackoff         = 20 * time.Second
	DefaultSlotPrefix            = "slot"
)

// Config is `muster tgsync --config FILE`, parsed and validated.
type Config struct {
	Muster   MusterConfig
	Interval time.Duration
	AWS      AWSConfig
	Bindings []Binding
}

// MusterConfig says where the views come from.
type MusterConfig struct {
	// URLs are muster servers' base URLs.
	URLs []string
	// TokenFile holds a bearer token of kind tool, read again for every
	// (re)subscription so it can rotate. Empty: the command's --token, or
	// a dev token.
	TokenFile string
	// CAFile is a PEM CA bundle to trust for https URLs; empty: the
	// system roots (the command's --ca wins).
	CAFile string
	// CertFile and KeyFile are a PEM client certificate and its key,
	// presented to a muster that asks for one (mutual TLS); empty: none
	// (the command's --cert and --key win).
	CertFile, KeyFile string
	// CacheDir keeps the resolver's last-known-good views: tgsync started
	// while muster is down syncs from them.
	CacheDir string
	// ConfirmAfter is the resolver's confirm time: how long muster must
	// stand by a smaller set the client guard holds back before tgsync
	// follows it. 0: the resolver's default (60 s).
	ConfirmAfter time.Duration
}

// AWSConfig tunes the ELBv2 client; credentials and region come from the
// SDK's default chain unless Region is set.
type AWSConfig struct {
	Region      string
	EndpointURL string
	// MaxAttempts and MaxBackoff shape the SDK's standard retryer
	// (jittered exponential backoff; throttling is retried).
	MaxAttempts int
	MaxBackoff  time.Duration
}

// Binding syncs one muster service to one target.
type Binding struct {
	Name    string
	Service string
	ELBv2   *ELBv2Target
	HAProxy *HAProxyTarget
	Policy  Policy
}

// ELBv2Target is an AWS ELBv2 (ALB or NLB) target group.
type ELBv2Target struct {
	TargetGroupARN string
	// TargetType is "ip" (the only type muster's views can fill: they
	// carry addresses, not EC2 instance ids).
	TargetType string
	// Port overrides the endpoints' ports (0: each endpoint's own).
	Port int
}

// HAProxyTarget is an HAProxy backend with a server-template pool.
type HAProxyTarget struct {
	// Socket is the Runtime API's unix socket (stats socket … level
	// admin).
	Socket string
	// Backend is the backend's name; SlotPrefix the server-template's
	// prefix (slots are SlotPrefix1 … SlotPrefixN).
	Backend    string
	SlotPrefix string
	// Port overrides the endpoints' ports (0: each endpoint's own).
	Port int
}

// Kind is "elbv2" or "haproxy".
func (b Binding) Kind() string {
	if b.ELBv2 != nil {
		return "elbv2"
	}
	return "haproxy"
}

// Target names the binding's target: the group's ARN or backend.
func (b Binding) Target() string {
	if b.ELBv2 != nil {
		return b.ELBv2.TargetGroupARN
	}
	return b.HAProxy.Backend + " at " + b.HAProxy.Socket
}

// FieldError is a configuration error at one line and field.
type FieldError struct {
	File  string
	Line  int
	Field string
	Msg   string
}

func (e *FieldError) Error() string {
	return fmt.Sprintf("%s:%d: %s: %s", e.File, e.Line, e.Field, e.Msg)
}

// The file's shape. Durations and numbers are strings or scalars decoded
// by hand, so an error names the field and line.
type rawConfig struct {
	Muster struct {
		URLs         []string `yaml:"urls"`
		TokenFile    string   `yaml:"token_file"`
		CAFile       string   `yaml:"ca_file"`
		CertFile     string   `yaml:"cert_file"`
		KeyFile      string   `yaml:"key_file"`
		CacheDir     string   `yaml:"cache_dir"`
		ConfirmAfter string   `yaml:"confirm_after"`
	} `yaml:"muster"`
	Interval string `yaml:"interval"`
	AWS      struct {
		Region      string `yaml:"region"`
		EndpointURL string `yaml:"endpoint_url"`
		MaxAttempts *int   `yaml:"max_attempts"`
		MaxBackoff  string `yaml:"max_backoff"`
	} `yaml:"aws"`
	Bindings []rawBinding `yaml:"bindings"`
}

type rawBinding struct {
	Name    string `yaml:"name"`
	Service string `yaml:"service"`
	ELBv2   *struct {
		TargetGroupARN string `yaml:"target_group_arn"`
		TargetType     string `yaml:"target_type"`
		Port           int    `yaml:"port"`
	} `yaml:"elbv2"`
	HAProxy *struct {
		Socket     string `yaml:"socket"`
		Backend    string `yaml:"backend"`
		SlotPrefix string `yaml:"slot_prefix"`
		Port       int    `yaml:"port"`
	} `yaml:"haproxy"`
	Policy struct {
		MaxDeregisterFraction *float64 `yaml:"max_deregister_fraction"`
		AddStepFraction       *float64 `yaml:"add_step_fraction"`
		OwnGroup              bool     `yaml:"own_group"`
	} `yaml:"policy"`
}

var (
	arnRE     = regexp.MustCompile(`^arn:aws[a-z-]*:elasticloadbalancing:[a-z0-9-]+:[0-9]{12}:targetgroup/[A-Za-z0-9-]{1,32}/[0-9a-f]{16}$`)
	nameRE    = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)
	haproxyRE = regexp.MustCompile(`^[A-Za-z0-9_.:-]{1,64}$`)
)

// ParseConfig reads a configuration (YAML, or JSON, which is YAML) and
// validates it. Every problem found is reported, each as a *FieldError
// with its line (joined with errors.Join).
func ParseConfig(file string, data []byte) (Config, error) {
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return Config{}, fmt.Errorf("%s: %w", file, err)
	}
	if len(root.Content) == 0 {
		return Config{}, &FieldError{File: file, Line: 1, Field: "bindings", Msg: "the file is empty; at least one binding is required"}
	}
	var raw rawConfig
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true) // a misspelt knob is an error, not a default
	if err := dec.Decode(&raw); err != nil {
		return Config{}, fmt.Errorf("%s: %w", file, err)
	}
	v := validator{file: file, root: root.Content[0]}
	cfg := Config{
		Muster: MusterConfig{URLs: raw.Muster.URLs, TokenFile: raw.Muster.TokenFile, CAFile: raw.Muster.CAFile,
			CertFile: raw.Muster.CertFile, KeyFile: raw.Muster.KeyFile, CacheDir: raw.Muster.CacheDir},
		AWS: AWSConfig{Region: raw.AWS.Region, EndpointURL: raw.AWS.EndpointURL, MaxAttempts: DefaultAWSMaxAttempts, MaxBackoff: DefaultAWSMaxBackoff},
	}
	if len(cfg.Muster.URLs) == 0 {
		v.fail("muster.urls", "at least one muster URL is required")
	}
	if (cfg.Muster.CertFile == "") != (cfg.Muster.KeyFile == "") {
		v.fail("muster.cert_file", "cert_file and key_file go together: give both to present a client certificate, or neither")
	}
	for i, u := range cfg.Muster.URLs {
		if p, err := url.Parse(u); err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
			v.fail(fmt.Sprintf("muster.urls[%d]", i), fmt.Sprintf("%q is not an http(s) URL", u))
		}
	}
	cfg.Muster.ConfirmAfter = v.duration("muster.confirm_after", raw.Muster.ConfirmAfter, 0, time.Second, 24*time.Hour)
	cfg.Interval = v.duration("interval", raw.Interval, DefaultInterval, time.Second, time.Hour)
	cfg.AWS.MaxBackoff = v.duration("aws.max_backoff", raw.AWS.MaxBackoff, DefaultAWSMaxBackoff, time.Millisecond, 10*time.Minute)
	if raw.AWS.MaxAttempts != nil {
		if n := *raw.AWS.MaxAttempts; n < 1 || n > 50 {
			v.fail("aws.max_attempts", fmt.Sprintf("%d is not between 1 and 50", n))
		} else {
			cfg.AWS.MaxAttempts = n
		}
	}
	if e := cfg.AWS.EndpointURL; e != "" {
		if p, err := url.Parse(e); err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
			v.fail("aws.endpoint_url", fmt.Sprintf("%q is not an http(s) URL", e))
		}
	}
	if len(raw.Bindings) == 0 {
		v.fail("bindings", "at least one binding is required")
	}
	names := map[string]bool{}
	targets := map[string]string{}
	for i, rb := range raw.Bindings {
		at := func(f string) string { return fmt.Sprintf("bindings[%d].%s", i, f) }
		b := Binding{Name: rb.Name, Service: rb.Service, Policy: Policy{
			MaxDeregisterFraction: DefaultMaxDeregisterFraction, AddStepFraction: DefaultAddStepFraction, OwnGroup: rb.Policy.OwnGroup,
		}}
		switch {
		case !nameRE.MatchString(b.Name):
			v.fail(at("name"), fmt.Sprintf("%q: a name of letters, digits, '.', '_' or '-' is required", b.Name))
		case names[b.Name]:
			v.fail(at("name"), fmt.Sprintf("%q names two bindings", b.Name))
		}
		names[b.Name] = true
		if b.Service == "" {
			v.fail(at("service"), "the muster service to sync is required")
		}
		switch {
		case rb.ELBv2 == nil && rb.HAProxy == nil:
			v.fail(at("name"), "a binding needs a target: elbv2 or haproxy")
		case rb.ELBv2 != nil && rb.HAProxy != nil:
			v.fail(at("haproxy"), "a binding has one target: elbv2 or haproxy, not both")
		case rb.ELBv2 != nil:
			e := &ELBv2Target{TargetGroupARN: rb.ELBv2.TargetGroupARN, TargetType: rb.ELBv2.TargetType, Port: rb.ELBv2.Port}
			if !arnRE.MatchString(e.TargetGroupARN) {
				v.fail(at("elbv2.target_group_arn"), fmt.Sprintf("%q is not an ELBv2 target group ARN (arn:aws:elasticloadbalancing:REGION:ACCOUNT:targetgroup/NAME/ID)", e.TargetGroupARN))
			}
			switch e.TargetType {
			case "":
				e.TargetType = "ip"
			case "ip":
			case "instance":
				v.fail(at("elbv2.target_type"), "instance target groups take EC2 instance ids, which muster's views do not carry (they carry addresses): use a target group of type ip")
			default:
				v.fail(at("elbv2.target_type"), fmt.Sprintf("%q: want ip", e.TargetType))
			}
			v.port(at("elbv2.port"), e.Port)
			if prev, ok := targets[e.TargetGroupARN]; ok {
				v.fail(at("elbv2.target_group_arn"), "the target group is already bound by "+prev+": two bindings would fight over it")
			}
			targets[e.TargetGroupARN] = b.Name
			b.ELBv2 = e
		default:
			h := &HAProxyTarget{Socket: rb.HAProxy.Socket, Backend: rb.HAProxy.Backend, SlotPrefix: rb.HAProxy.SlotPrefix, Port: rb.HAProxy.Port}
			if h.Socket == "" {
				v.fail(at("haproxy.socket"), "the Runtime API's unix socket is required")
			}
			if !haproxyRE.MatchString(h.Backend) {
				v.fail(at("haproxy.backend"), fmt.Sprintf("%q is not an HAProxy backend name", h.Backend))
			}
			if h.SlotPrefix == "" {
				h.SlotPrefix = DefaultSlotPrefix
			} else if !haproxyRE.MatchString(h.SlotPrefix) {
				v.fail(at("haproxy.slot_prefix"), fmt.Sprintf("%q is not an HAProxy server name prefix", h.SlotPrefix))
			}
			v.port(at("haproxy.port"), h.Port)
			key := h.Socket + " " + h.Backend
			if prev, ok := targets[key]; ok {
				v.fail(at("haproxy.backend"), "the backend is already bound by "+prev+": two bindings would fight over it")
			}
			targets[key] = b.Name
			b.HAProxy = h
		}
		if f := rb.Policy.MaxDeregisterFraction; f != nil {
			if *f <= 0 || *f > 1 {
				v.fail(at("policy.max_deregister_fraction"), fmt.Sprintf("%g is not in (0, 1]", *f))
			} else {
				b.Policy.MaxDeregisterFraction = *f
			}
		}
		if f := rb.Policy.AddStepFraction; f != nil {
			if *f <= 0 || *f > 1 {
				v.fail(at("policy.add_step_fraction"), fmt.Sprintf("%g is not in (0, 1]", *f))
			} else {
				b.Policy.AddStepFraction = *f
			}
		}
		cfg.Bindings = append(cfg.Bindings, b)
	}
	if len(v.errs) > 0 {
		return Config{}, errors.Join(v.errs...)
	}
	return cfg, nil
}

// Services lists the muster services the bindings sync, once each.
func (c Config) Services() []string {
	var out []string
	seen := map[string]bool{}
	for _, b := range c.Bindings {
		if !seen[b.Service] {
			seen[b.Service] = true
			out = append(out, b.Service)
		}
	}
	return out
}

type validator struct {
	file string
	root *yaml.Node
	errs []error
}

func (v *validator) fail(field, msg string) {
	v.errs = append(v.errs, &FieldError{File: v.file, Line: lineOf(v.root, field), Field: field, Msg: msg})
}

func (v *validator) duration(field, s string, def, least, most time.Duration) time.Duration {
	if s == "" {
		return def
	}
	d, err := time.ParseDuration(s)
	switch {
	case err != nil:
		v.fail(field, fmt.Sprintf("%q is not a duration (e.g. 30s, 2m)", s))
	case d < least || d > most:
		v.fail(field, fmt.Sprintf("%s is not between %s and %s", d, least, most))
	default:
		return d
	}
	return def
}

func (v *validator) port(field string, p int) {
	if p < 0 || p > 65535 {
		v.fail(field, fmt.Sprintf("%d is not a port (1-65535, or 0 for each endpoint's own)", p))
	}
}

// lineOf finds the line of a field path ("bindings[1].elbv2.port"): the
// deepest node of the path the document has (the parent when the field
// is missing).
func lineOf(n *yaml.Node, path string) int {
	line := n.Line
	for _, part := range strings.Split(path, ".") {
		name, idx := part, -1
		if i := strings.IndexByte(part, '['); i >= 0 {
			name = part[:i]
			idx, _ = strconv.Atoi(strings.TrimSuffix(part[i+1:], "]"))
		}
		next := mapValue(n, name)
		if next == nil {
			return line
		}
		n, line = next, next.Line
		if idx >= 0 {
			if n.Kind != yaml.SequenceNode || idx >= len(n.Content) {
				return line
			}
			n = n.Content[idx]
			line = n.Line
		}
	}
	return line
}

func mapValue(n *yaml.Node, key string) *yaml.Node {
	if n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return nil
}
