package federation

import (
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"slices"
	"strings"
)

// maxNameLen bounds a region name: a DNS label.
const maxNameLen = 63

// PeerConfig is one peer region: its name, the base URLs of its muster
// replicas, the file holding the token that region issued to this one,
// and the CA bundle its TLS certificates chain to.
type PeerConfig struct {
	// Name is the peer's region name (its MUSTER_REGION), a DNS label.
	Name string
	// URLs are base URLs (https://host:port; http only on loopback) of
	// the peer's replicas; the client rotates through them on every
	// reconnect.
	URLs []string
	// TokenFile holds the bearer token the peer issued to this region
	// (an operator with the viewer role, or a tool with it: it may list
	// and resolve every service, and write nothing). It is read again
	// for every request, so a rotated file is taken at the next one.
	TokenFile string
	// CAFile, when set, is the PEM bundle the peer's https certificates
	// chain to. Empty: the system roots.
	CAFile string
}

// ValidName reports whether s is a region name: a lowercase DNS label
// (letters, digits and inner hyphens, 1 to 63 characters).
func ValidName(s string) bool {
	if s == "" || len(s) > maxNameLen || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	for _, r := range s {
		if (r < 'a' || r > 'z') && (r < '0' || r > '9') && r != '-' {
			return false
		}
	}
	return true
}

// ParsePeer reads one "NAME=URL" (as --peer and each element of
// MUSTER_PEER_REGIONS give it): NAME a region name, URL an https base URL
// (http only on a loopback host) with a host and nothing after the host
// but an optional "/".
func ParsePeer(s string) (name, base string, err error) {
	name, base, ok := strings.Cut(strings.TrimSpace(s), "=")
	name, base = strings.TrimSpace(name), strings.TrimSpace(base)
	if !ok || name == "" || base == "" {
		return "", "", fmt.Errorf("peer %q: want NAME=URL, e.g. eu-west-1=https://muster.eu-west-1.example:8080", s)
	}
	if !ValidName(name) {
		return "", "", fmt.Errorf("peer %q: region name %q must be a DNS label (lowercase letters, digits, inner hyphens; at most 63)", s, name)
	}
	u, err := url.Parse(base)
	switch {
	case err != nil:
		return "", "", fmt.Errorf("peer %q: URL: %w", s, err)
	case u.Scheme != "http" && u.Scheme != "https":
		return "", "", fmt.Errorf("peer %q: URL must be http:// or https://", s)
	case u.Host == "" || u.Hostname() == "":
		return "", "", fmt.Errorf("peer %q: URL names no host", s)
	case u.User != nil || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" || u.ForceQuery || u.Opaque != "":
		return "", "", fmt.Errorf("peer %q: a base URL has no user, path, query or fragment", s)
	}
	if err := checkPlainHTTP(name, u); err != nil {
		return "", "", fmt.Errorf("peer %q: %w", s, err)
	}
	return name, strings.TrimSuffix(base, "/"), nil
}

// checkPlainHTTP refuses an http:// URL for a peer region outside
// loopback. Every request to a peer carries the bearer token that region
// issued to this one; over plain http anyone on the path between the
// regions (and cross-region paths are long) could read it and then list
// and resolve every service of that region as this one, or rewrite the
// views this region follows. Loopback stays open for a region and its
// peer on one machine (a lab, the tests), where the path is the kernel.
// There is no switch to allow more: a lab across machines gives the peer
// a certificate and this region its CA (--peer-ca NAME=FILE).
func checkPlainHTTP(name string, u *url.URL) error {
	if u.Scheme != "http" || loopbackHost(u.Hostname()) {
		return nil
	}
	return fmt.Errorf("http://%s would send the token region %s issued to this one in clear text; use https:// (with --peer-ca %s=FILE, MUSTER_PEER_CAS, when its certificate chains to a private CA); plain http is allowed only on a loopback address", u.Host, name, name)
}

// loopbackHost reports whether host is localhost or a loopback address.
func loopbackHost(host string) bool {
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

// ParseNamedFile reads one "NAME=FILE" (--peer-token, --peer-ca).
func ParseNamedFile(s string) (name, file string, err error) {
	name, file, ok := strings.Cut(strings.TrimSpace(s), "=")
	name, file = strings.TrimSpace(name), strings.TrimSpace(file)
	if !ok || name == "" || file == "" {
		return "", "", fmt.Errorf("%q: want NAME=FILE", s)
	}
	if !ValidName(name) {
		return "", "", fmt.Errorf("%q: region name %q must be a DNS label", s, name)
	}
	return name, file, nil
}

// Settings are the peer settings as the flags and the environment give
// them, before they are joined into PeerConfigs.
type Settings struct {
	// Peers are "NAME=URL" entries; repeating a NAME adds a URL.
	Peers []string
	// Tokens and CAs are "NAME=FILE" entries, one per NAME.
	Tokens, CAs []string
}

// Build joins s into one PeerConfig per region, in the order the regions
// were first named. self is this region's name, which no peer may take.
// Every peer needs a token file; a token or CA for a region that is not
// a peer, and a second one for the same region, are refused.
func (s Settings) Build(self string) ([]PeerConfig, error) {
	var out []PeerConfig
	idx := map[string]int{}
	for _, p := range s.Peers {
		name, base, err := ParsePeer(p)
		if err != nil {
			return nil, err
		}
		if name == self {
			return nil, fmt.Errorf("peer %q: %q is this region's own name (MUSTER_REGION); a peer region must differ", p, name)
		}
		i, ok := idx[name]
		if !ok {
			i = len(out)
			idx[name] = i
			out = append(out, PeerConfig{Name: name})
		}
		if slices.Contains(out[i].URLs, base) {
			return nil, fmt.Errorf("peer %q: URL %s given twice for region %s", p, base, name)
		}
		out[i].URLs = append(out[i].URLs, base)
	}
	set := func(what string, entries []string, field func(*PeerConfig) *string) error {
		for _, e := range entries {
			name, file, err := ParseNamedFile(e)
			if err != nil {
				return fmt.Errorf("peer %s %w", what, err)
			}
			i, ok := idx[name]
			if !ok {
				return fmt.Errorf("peer %s %q: no peer region %q is configured (--peer %s=URL)", what, e, name, name)
			}
			f := field(&out[i])
			if *f != "" {
				return fmt.Errorf("peer %s %q: region %s has one already", what, e, name)
			}
			*f = file
		}
		return nil
	}
	if err := set("token", s.Tokens, func(p *PeerConfig) *string { return &p.TokenFile }); err != nil {
		return nil, err
	}
	if err := set("CA", s.CAs, func(p *PeerConfig) *string { return &p.CAFile }); err != nil {
		return nil, err
	}
	for _, p := range out {
		if p.TokenFile == "" {
			return nil, fmt.Errorf("peer region %s has no token: give --peer-token %s=FILE (MUSTER_PEER_TOKENS), the token region %s issued to this one", p.Name, p.Name, p.Name)
		}
	}
	return out, nil
}

// SplitList splits a comma-separated environment value, dropping blanks.
func SplitList(v string) []string {
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// errNoPeers is Config.Validate's answer to an empty peer list.
var errNoPeers = errors.New("federation: no peer regions configured")
