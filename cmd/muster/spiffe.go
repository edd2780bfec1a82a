package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	yaml "go.yaml.in/yaml/v3"

	"github.com/musterhq/muster/internal/identity"
)

// spiffeFile is the file --spiffe (MUSTER_SPIFFE) names: per SPIFFE trust
// domain, the template its IDs' paths must match, whose {service}
// segment is the muster service. Like the platform issuers'
// mappings of --reconcile-config, it is read once at start and a mistake
// in it stops the start.
//
//	trust_domains:
//	  - trust_domain: prod.example.org
//	    path: /ns/{namespace}/sa/{service}
type spiffeFile struct {
	TrustDomains []struct {
		TrustDomain string `yaml:"trust_domain"`
		Path        string `yaml:"path"`
	} `yaml:"trust_domains"`
}

// loadSPIFFE reads and checks the trust domains file.
func loadSPIFFE(path string) (*identity.TrustDomains, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--spiffe: %w", err)
	}
	return parseSPIFFE(path, b)
}

// parseSPIFFE parses b, read from name. Its errors name the file and the
// entry.
func parseSPIFFE(name string, b []byte) (*identity.TrustDomains, error) {
	var f spiffeFile
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%s: empty; name at least one trust domain under trust_domains", name)
		}
		return nil, fmt.Errorf("%s: %s", name, strings.TrimPrefix(err.Error(), "yaml: "))
	}
	if len(f.TrustDomains) == 0 {
		return nil, fmt.Errorf("%s: trust_domains: name at least one trust domain", name)
	}
	cfgs := make([]identity.TrustDomainConfig, 0, len(f.TrustDomains))
	for i, t := range f.TrustDomains {
		c := identity.TrustDomainConfig{TrustDomain: t.TrustDomain, Path: t.Path}
		if _, err := identity.NewTrustDomains([]identity.TrustDomainConfig{c}); err != nil {
			return nil, fmt.Errorf("%s: trust_domains.%d: %w", name, i, err)
		}
		cfgs = append(cfgs, c)
	}
	td, err := identity.NewTrustDomains(cfgs)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return td, nil
}
