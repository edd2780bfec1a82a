package federation

import (
	"net/url"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParsePeer(t *testing.T) {
	for _, tc := range []struct {
		in, name, base, err string
	}{
		{in: "b=http://127.0.0.1:8080", name: "b", base: "http://127.0.0.1:8080"},
		{in: " eu-west-1 = https://muster.eu-west-1.example/ ", name: "eu-west-1", base: "https://muster.eu-west-1.example"},
		{in: "b", err: "want NAME=URL"},
		{in: "=https://x", err: "want NAME=URL"},
		{in: "b=", err: "want NAME=URL"},
		{in: "B=https://x", err: "DNS label"},
		{in: "-b=https://x", err: "DNS label"},
		{in: "b=ftp://x", err: "http:// or https://"},
		{in: "b=http://", err: "no host"},
		{in: "b=https://x/v1", err: "no user, path"},
		{in: "b=http://u:p@x", err: "no user, path"},
		{in: "b=https://x?q=1", err: "no user, path"},
		{in: "b=x:80", err: "http:// or https://"},
	} {
		name, base, err := ParsePeer(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ParsePeer(%q) = %q, %q, %v; want an error with %q", tc.in, name, base, err, tc.err)
			}
			continue
		}
		if err != nil || name != tc.name || base != tc.base {
			t.Errorf("ParsePeer(%q) = %q, %q, %v; want %q, %q", tc.in, name, base, err, tc.name, tc.base)
		}
	}
}

func TestSettingsBuild(t *testing.T) {
	s := Settings{
		Peers:  []string{"b=https://b1:8080", "c=https://c:8443", "b=https://b2:8080"},
		Tokens: []string{"b=/run/b.token", "c=/run/c.token"},
		CAs:    []string{"c=/run/c-ca.pem"},
	}
	got, err := s.Build("a")
	if err != nil {
		t.Fatal(err)
	}
	want := []PeerConfig{
		{Name: "b", URLs: []string{"https://b1:8080", "https://b2:8080"}, TokenFile: "/run/b.token"},
		{Name: "c", URLs: []string{"https://c:8443"}, TokenFile: "/run/c.token", CAFile: "/run/c-ca.pem"},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Fatalf("Build (-want +got):\n%s", d)
	}
	for _, tc := range []struct {
		s    Settings
		want string
	}{
		{Settings{Peers: []string{"a=https://x"}, Tokens: []string{"a=/t"}}, "this region's own name"},
		{Settings{Peers: []string{"b=https://x"}}, "has no token"},
		{Settings{Peers: []string{"b=https://x"}, Tokens: []string{"b=/t", "b=/u"}}, "has one already"},
		{Settings{Peers: []string{"b=https://x"}, Tokens: []string{"b=/t", "c=/u"}}, `no peer region "c"`},
		{Settings{Peers: []string{"b=https://x"}, Tokens: []string{"b=/t"}, CAs: []string{"b"}}, "want NAME=FILE"},
		{Settings{Peers: []string{"b=https://x", "b=https://x/"}, Tokens: []string{"b=/t"}}, "given twice"},
	} {
		if _, err := tc.s.Build("a"); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Build(%+v) = %v; want an error with %q", tc.s, err, tc.want)
		}
	}
}

// FuzzParsePeer: whatever the flag or the environment holds, ParsePeer
// either refuses it or returns a region name that is a DNS label and an
// http(s) base URL with a host and no path, query, fragment or user, that
// parses back to itself.
func FuzzParsePeer(f *testing.F) {
	for _, s := range []string{"b=http://127.0.0.1:8080", "eu-west-1=https://m.example/", "b=http://[::1]:80", "=", "b==https://x", "b=https://x#f", "b=http://%zz"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		name, base, err := ParsePeer(s)
		if err != nil {
			return
		}
		if !ValidName(name) {
			t.Fatalf("ParsePeer(%q): name %q is not a DNS label", s, name)
		}
		u, err := url.Parse(base)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" || u.Path != "" || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
			t.Fatalf("ParsePeer(%q): base %q (%v)", s, base, err)
		}
		if n2, b2, err := ParsePeer(name + "=" + base); err != nil || n2 != name || b2 != base {
			t.Fatalf("ParsePeer(%q) = %q, %q; again: %q, %q, %v", s, name, base, n2, b2, err)
		}
	})
}

// TestPlainHTTPPeerRefused: a peer region's requests carry the token it
// issued to this region, so an http:// URL outside loopback is refused
// wherever a peer configuration is made (the flags' parser and the
// federation's own Validate, for configurations built in code), with a
// message naming https and --peer-ca; https and loopback http pass.
func TestPlainHTTPPeerRefused(t *testing.T) {
	s := Settings{Peers: []string{"b=https://muster.b.example:8443", "b=http://muster-b.lab:8080"}, Tokens: []string{"b=/t"}}
	_, err := s.Build("a")
	if err == nil || !strings.Contains(err.Error(), "in clear text") || !strings.Contains(err.Error(), "--peer-ca b=FILE") {
		t.Errorf("Build with http://muster-b.lab: %v; want a refusal naming https and --peer-ca", err)
	}
	for _, tc := range []struct {
		urls []string
		want string // "" valid
	}{
		{[]string{"https://muster.b.example:8443"}, ""},
		{[]string{"http://127.0.0.1:8080", "http://localhost:8081"}, ""},
		{[]string{"https://muster.b.example:8443", "http://192.0.2.7:8080"}, "in clear text"},
		{[]string{"ftp://muster.b.example"}, "not an http(s) base URL"},
	} {
		c := Config{Region: "a", Peers: []PeerConfig{{Name: "b", URLs: tc.urls, TokenFile: "/t"}}}
		err := c.Validate()
		if (tc.want == "" && err != nil) || (tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want))) {
			t.Errorf("Validate(%v) = %v; want %q", tc.urls, err, tc.want)
		}
	}
}
