package app

import (
	"crypto/tls"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"time"

	"github.com/musterhq/muster/internal/ownership"
	"github.com/musterhq/muster/internal/peer"
	"github.com/musterhq/muster/internal/relay"
	"github.com/musterhq/muster/internal/seal"
	"github.com/musterhq/muster/internal/tenure"
)

// WorkerRelay keeps a stream open to every live peer replica and hands
// what each publishes to this replica's hub (every replica
// serves every view).
const WorkerRelay = "relay"

// buildRelay builds the relay from the live replicas of the region
// (ownership) to the hub, and the verifier of peer streams the server
// answers. Without the region's signing key replicas cannot prove
// themselves to one another: both are left out, and muster says so once.
func (a *App) buildRelay(cfg Config) (*peer.Verifier, error) {
	if cfg.Policy.Sealer == nil {
		a.log.Warn("relaying between replicas is off: the region has no signing key, so replicas cannot authenticate each other; this replica serves only the views it publishes")
		return nil, nil
	}
	if !peer.ValidName(cfg.Replica) {
		return nil, fmt.Errorf("replica name %q cannot sign requests to its peers: want 1 to 512 printable characters without spaces (MUSTER_REPLICA)", cfg.Replica)
	}
	trusted := cfg.Policy.SealKeys.With(cfg.Policy.Sealer)
	rc := cfg.Relay
	rc.Hub, rc.Logger, rc.Registerer = a.Hub, a.log, a.Metrics
	// Signed and checked on the app's clock, the one forwarded evidence
	// is stamped with (server translates it by the signing time).
	rc.Signer = peer.Signer{ID: cfg.Replica, Key: cfg.Policy.Sealer, Now: cfg.Now, V1: cfg.PeerUpgrade}
	// A relayed view is believed only if the region's key signed it, and
	// only within a sealed tenure of its shard held by its signer.
	// MUSTER_PEER_TRUST=upgrade also takes unsigned views, for a rolling
	// upgrade from the release before, which signs nothing.
	rc.AcceptUnsigned = rc.AcceptUnsigned || cfg.PeerUpgrade
	rc.ViewKeys = trusted
	if rc.Tenures == nil && cfg.Pool != nil {
		rc.Tenures = tenure.NewBook(cfg.Pool, func() seal.Keys { return trusted }, time.Second)
	}
	configured := configuredPeers(cfg.Peers, cfg.Address)
	if rc.Peers == nil {
		rc.Peers = func() []relay.Peer {
			var out []relay.Peer
			status := a.Ownership.Region()
			for _, r := range livePeers(status, cfg.Region) {
				out = append(out, relay.Peer{ID: r.ID, Address: r.Address})
			}
			if len(status.Replicas) == 0 {
				// Not read yet (a start without the database): the
				// configured peers, known by their addresses.
				for _, p := range configured {
					out = append(out, relay.Peer{ID: p, Address: p})
				}
			}
			return out
		}
	}
	// What this replica hears of its peers, and what they hear, meet in
	// PostgreSQL: the one channel a replica cut off from its peers still
	// shares with them (relay.Reports).
	if rc.Reports == nil && cfg.Pool != nil {
		rc.Reports = relay.DBReports{Pool: cfg.Pool}
	}
	if rc.Owned == nil {
		rc.Owned = func() []int { return slices.Sorted(maps.Keys(a.Ownership.Owned())) }
	}
	if rc.ShardOf == nil {
		rc.ShardOf = a.shardOf
	}
	if rc.OnStale == nil {
		rc.OnStale = func(services []string) {
			if a.XDS != nil {
				a.XDS.DrainServices(services)
			}
		}
	}
	var err error
	if a.Relay, err = relay.New(rc); err != nil {
		return nil, err
	}
	if len(configured) > 0 {
		interval := cfg.Authz.Interval
		if interval <= 0 {
			interval = 2 * time.Second
		}
		a.peerAuthz = &peerAuthzWorker{peers: configured, signer: rc.Signer, authz: a.Authz, interval: interval,
			client: peerClient(rc.TLS), log: a.log.With("worker", WorkerPeerAuthz)}
	}
	refused, err := peer.NewRefusedCounter(a.Metrics)
	if err != nil {
		return nil, err
	}
	accepted, err := peer.NewAcceptedCounter(a.Metrics)
	if err != nil {
		return nil, err
	}
	// A request is for this replica when it names its id, or the base
	// URL it advertises (a peer that knows it only from MUSTER_PEERS).
	return &peer.Verifier{Keys: func() seal.Keys { return trusted }, Now: cfg.Now,
		Self: selfNames(cfg), AcceptV1: cfg.PeerUpgrade, Refused: refused, Accepted: accepted}, nil
}

// shardOf is the shard of a service, false while the shard count is not
// known (before the first reading of the leases).
func (a *App) shardOf(service string) (int, bool) {
	n := a.Ownership.Shards()
	if n == 0 {
		return 0, false
	}
	return ownership.ShardOf(service, n), true
}

// peerClient is the client that takes the authorisation copy from a
// peer: the relay's TLS configuration (the peers' CA bundle) when set.
func peerClient(tc *tls.Config) *http.Client {
	c := &http.Client{Timeout: 10 * time.Second}
	if tc != nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.TLSClientConfig = tc
		c.Transport = t
	}
	return c
}
