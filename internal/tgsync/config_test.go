package tgsync

import (
	"errors"
	"os"
	"strings"
	"testing"
	"time"
)

const exampleYAML = `muster:
  urls: [https://muster.internal]
  token_file: /run/secrets/muster-tgsync-token
  ca_file: /etc/muster/ca.pem
  cert_file: /run/spire/svid.pem
  key_file: /run/spire/svid.key
  cache_dir: /var/cache/muster-tgsync
  confirm_after: 2m
interval: 15s
aws:
  max_attempts: 8
bindings:
  - name: web-alb
    service: web
    elbv2:
      target_group_arn: arn:aws:elasticloadbalancing:eu-west-1:123456789012:targetgroup/web/0123456789abcdef
      port: 8080
    policy:
      max_deregister_fraction: 0.2
  - name: web-edge
    service: web
    haproxy:
      socket: /run/haproxy/admin.sock
      backend: web
    policy:
      own_group: true
`

// TestParseConfig: a full file, its defaults, and the same file as JSON.
func TestParseConfig(t *testing.T) {
	cfg, err := ParseConfig("tgsync.yaml", []byte(exampleYAML))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Muster.CAFile != "/etc/muster/ca.pem" {
		t.Errorf("muster.ca_file: %q", cfg.Muster.CAFile)
	}
	if cfg.Muster.CertFile != "/run/spire/svid.pem" || cfg.Muster.KeyFile != "/run/spire/svid.key" {
		t.Errorf("muster.cert_file, key_file: %q, %q", cfg.Muster.CertFile, cfg.Muster.KeyFile)
	}
	half := strings.Replace(exampleYAML, "  key_file: /run/spire/svid.key\n", "", 1)
	if _, err := ParseConfig("tgsync.yaml", []byte(half)); err == nil || !strings.Contains(err.Error(), "cert_file and key_file go together") {
		t.Errorf("cert_file without key_file: %v", err)
	}
	if cfg.Interval != 15*time.Second || cfg.Muster.ConfirmAfter != 2*time.Minute || cfg.AWS.MaxAttempts != 8 || cfg.AWS.MaxBackoff != DefaultAWSMaxBackoff {
		t.Errorf("globals: %+v", cfg)
	}
	alb, hap := cfg.Bindings[0], cfg.Bindings[1]
	if alb.ELBv2 == nil || alb.ELBv2.TargetType != "ip" || alb.ELBv2.Port != 8080 || alb.Policy.MaxDeregisterFraction != 0.2 || alb.Policy.AddStepFraction != DefaultAddStepFraction {
		t.Errorf("elbv2 binding: %+v %+v", alb, alb.ELBv2)
	}
	if hap.HAProxy == nil || hap.HAProxy.SlotPrefix != DefaultSlotPrefix || !hap.Policy.OwnGroup || hap.Policy.MaxDeregisterFraction != DefaultMaxDeregisterFraction {
		t.Errorf("haproxy binding: %+v %+v", hap, hap.HAProxy)
	}
	if s := cfg.Services(); len(s) != 1 || s[0] != "web" {
		t.Errorf("services: %v", s)
	}
	js := `{"muster":{"urls":["http://127.0.0.1:8080"]},"bindings":[{"name":"b","service":"api","haproxy":{"socket":"/tmp/s","backend":"api","slot_prefix":"api"}}]}`
	cfg, err = ParseConfig("tgsync.json", []byte(js))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Interval != DefaultInterval || cfg.Bindings[0].HAProxy.SlotPrefix != "api" {
		t.Errorf("json: %+v", cfg)
	}
}

// TestParseConfigErrors: each mistake is named with its line and field,
// all of them at once, and a misspelt knob is refused, not defaulted.
func TestParseConfigErrors(t *testing.T) {
	bad := `muster:
  urls: [ftp://x]
interval: 5 minutes
bindings:
  - name: web-alb
    service: web
    elbv2:
      target_group_arn: arn:aws:elasticloadbalancing:eu-west-1:1:tg/web
      target_type: instance
  - name: web-alb
    service: ""
    haproxy:
      socket: /run/haproxy/admin.sock
      backend: "web backend"
      port: 70000
    policy:
      max_deregister_fraction: 0
`
	_, err := ParseConfig("tgsync.yaml", []byte(bad))
	if err == nil {
		t.Fatal("bad config accepted")
	}
	want := []string{
		"tgsync.yaml:2: muster.urls[0]: \"ftp://x\" is not an http(s) URL",
		"tgsync.yaml:3: interval: \"5 minutes\" is not a duration",
		"tgsync.yaml:8: bindings[0].elbv2.target_group_arn:",
		"tgsync.yaml:9: bindings[0].elbv2.target_type: instance target groups take EC2 instance ids",
		"tgsync.yaml:10: bindings[1].name: \"web-alb\" names two bindings",
		"tgsync.yaml:11: bindings[1].service: the muster service to sync is required",
		"tgsync.yaml:14: bindings[1].haproxy.backend:",
		"tgsync.yaml:15: bindings[1].haproxy.port: 70000 is not a port",
		"tgsync.yaml:17: bindings[1].policy.max_deregister_fraction: 0 is not in (0, 1]",
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("missing %q in:\n%v", w, err)
		}
	}
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Line == 0 {
		t.Errorf("not a FieldError with a line: %v", err)
	}

	_, err = ParseConfig("t.yaml", []byte("muster:\n  urls: [http://x]\nbindings:\n  - name: a\n    service: web\n    haproxy:\n      socket: /s\n      backend: web\n      max_weight: 3\n"))
	if err == nil || !strings.Contains(err.Error(), "line 9") || !strings.Contains(err.Error(), "max_weight") {
		t.Errorf("unknown field: %v", err)
	}
	for _, empty := range []string{"", "# nothing\n"} {
		if _, err := ParseConfig("t.yaml", []byte(empty)); err == nil || !strings.Contains(err.Error(), "binding") {
			t.Errorf("empty file %q: %v", empty, err)
		}
	}
	if _, err := ParseConfig("t.yaml", []byte("bindings: [")); err == nil || !strings.Contains(err.Error(), "t.yaml") {
		t.Errorf("broken YAML: %v", err)
	}
}

// FuzzParseConfig: no input makes the parser panic, and whatever it
// accepts is valid.
func FuzzParseConfig(f *testing.F) {
	f.Add([]byte(exampleYAML))
	f.Add([]byte(`{"muster":{"urls":["http://h"]},"bindings":[{"name":"b","service":"s","haproxy":{"socket":"/s","backend":"b"}}]}`))
	f.Add([]byte("bindings:\n  - name: [\n"))
	f.Add([]byte("&a [*a]"))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := ParseConfig("f.yaml", data)
		if err != nil {
			return
		}
		if len(cfg.Bindings) == 0 || len(cfg.Muster.URLs) == 0 || cfg.Interval <= 0 {
			t.Fatalf("accepted an invalid config: %+v", cfg)
		}
		for _, b := range cfg.Bindings {
			if (b.ELBv2 == nil) == (b.HAProxy == nil) || b.Service == "" || b.Policy.MaxDeregisterFraction <= 0 {
				t.Fatalf("accepted an invalid binding: %+v", b)
			}
		}
	})
}

// TestDocConfigParses: the ALB example in docs/tgsync.md, with the
// HAProxy binding added, is a valid configuration.
func TestDocConfigParses(t *testing.T) {
	b, err := os.ReadFile("../../docs/tgsync.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	i := strings.Index(readme, "    # /etc/muster/tgsync.yaml")
	if i < 0 {
		t.Fatal("no tgsync.yaml example in docs/tgsync.md")
	}
	var lines []string
	for line := range strings.Lines(readme[i:]) {
		if !strings.HasPrefix(line, "    ") {
			break
		}
		lines = append(lines, strings.TrimPrefix(line, "    "))
	}
	j := strings.Index(readme, "    # tgsync.yaml, bindings:")
	if j < 0 {
		t.Fatal("no HAProxy binding example in docs/tgsync.md")
	}
	for line := range strings.Lines(readme[j:]) {
		if !strings.HasPrefix(line, "    ") {
			break
		}
		lines = append(lines, strings.TrimPrefix(line, "    "))
	}
	cfg, err := ParseConfig("docs/tgsync.md", []byte(strings.Join(lines, "")))
	if err != nil {
		t.Fatalf("%v\n%s", err, strings.Join(lines, ""))
	}
	if len(cfg.Bindings) != 2 || cfg.Bindings[0].ELBv2 == nil || cfg.Bindings[1].HAProxy == nil || cfg.Bindings[0].ELBv2.Port != 8443 {
		t.Fatalf("docs/tgsync.md config: %+v", cfg.Bindings)
	}
}
