package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/musterhq/muster/internal/federation"
)

// repeated is a flag given any number of times.
type repeated []string

func (r *repeated) String() string     { return strings.Join(*r, ",") }
func (r *repeated) Set(v string) error { *r = append(*r, v); return nil }

// federationFlags holds the peer-region flags as given; empty means
// "not set".
type federationFlags struct {
	peers, tokens, cas             repeated
	staleAfter, discover, cacheDir string
}

// addFederationFlags declares the peer-region flags (docs/regions.md).
func addFederationFlags(fs *flag.FlagSet) *federationFlags {
	f := &federationFlags{}
	fs.Var(&f.peers, "peer", "a peer region to follow, NAME=URL (its MUSTER_REGION and a replica's base URL); repeat for more regions, or repeat a NAME for more replicas of one (MUSTER_PEER_REGIONS, comma-separated; docs/regions.md)")
	fs.Var(&f.tokens, "peer-token", "NAME=FILE: the file holding the token peer region NAME issued to this one (a viewer: it lists and resolves, never writes); read again for every request (MUSTER_PEER_TOKENS, comma-separated)")
	fs.Var(&f.cas, "peer-ca", "NAME=FILE: the PEM CA bundle peer region NAME's https certificates chain to (MUSTER_PEER_CAS, comma-separated; default the system roots)")
	fs.StringVar(&f.staleAfter, "peer-stale-after", "", "a peer region not reached for longer is stale and raises peer_stale (MUSTER_PEER_STALE_AFTER; default 30s)")
	fs.StringVar(&f.discover, "peer-discover-every", "", "how often each peer region's service list is read again (MUSTER_PEER_DISCOVER_EVERY; default 30s)")
	fs.StringVar(&f.cacheDir, "peer-cache-dir", "", "folder for the peer regions' last-known-good views, one subfolder per region (MUSTER_PEER_CACHE_DIR; muster dev: DATA/federation; serve: none, memory only)")
	return f
}

// apply parses the peer-region settings into cfg.Federation: a flag wins
// over its environment variable, which wins over the default. It runs
// after loadEnv (cfg.Region is known).
func (f *federationFlags) apply(cfg *Config) error {
	s := federation.Settings{Peers: f.peers, Tokens: f.tokens, CAs: f.cas}
	if len(s.Peers) == 0 {
		s.Peers = federation.SplitList(os.Getenv("MUSTER_PEER_REGIONS"))
	}
	if len(s.Tokens) == 0 {
		s.Tokens = federation.SplitList(os.Getenv("MUSTER_PEER_TOKENS"))
	}
	if len(s.CAs) == 0 {
		s.CAs = federation.SplitList(os.Getenv("MUSTER_PEER_CAS"))
	}
	peers, err := s.Build(cfg.Region)
	if err != nil {
		return fmt.Errorf("peer regions: %w", err)
	}
	fc := federation.Config{Peers: peers}
	for _, d := range []struct {
		flag, env string
		v         string
		to        *time.Duration
	}{
		{"--peer-stale-after", "MUSTER_PEER_STALE_AFTER", f.staleAfter, &fc.StaleAfter},
		{"--peer-discover-every", "MUSTER_PEER_DISCOVER_EVERY", f.discover, &fc.Discover},
	} {
		v := cmpOr(d.v, os.Getenv(d.env))
		if v == "" {
			continue
		}
		if *d.to, err = time.ParseDuration(v); err != nil || *d.to <= 0 {
			return fmt.Errorf("%s (%s) %q: want a duration above 0, e.g. 30s", d.flag, d.env, v)
		}
	}
	fc.CacheDir = cmpOr(f.cacheDir, os.Getenv("MUSTER_PEER_CACHE_DIR"))
	if fc.CacheDir == "" && cfg.Dev && cfg.DataDir != "" {
		fc.CacheDir = filepath.Join(cfg.DataDir, "federation")
	}
	for _, p := range peers {
		if _, err := os.Stat(p.TokenFile); err != nil {
			return fmt.Errorf("peer region %s: token file: %w", p.Name, err)
		}
		if p.CAFile != "" {
			if _, err := os.Stat(p.CAFile); err != nil {
				return fmt.Errorf("peer region %s: CA bundle: %w", p.Name, err)
			}
		}
	}
	cfg.Federation = fc
	return nil
}
