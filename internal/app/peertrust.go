package app

import (
	"strings"
	"time"

	"github.com/musterhq/muster/internal/assembler"
)

// AlarmPeerTrustUpgrade stands while this replica runs in upgrade mode
// (MUSTER_PEER_TRUST=upgrade): it believes unsealed rows of table
// replicas and the release before's request signatures, which name no
// receiver and can be replayed to another replica, and sends such
// signatures itself. The mode is for a rolling upgrade only; the alarm is
// there so that nobody forgets to roll the region once more in strict
// mode when no replica of the release before is left.
const AlarmPeerTrustUpgrade = "peer_trust_upgrade"

// peerTrustMode says at start how far this replica trusts its peers, and
// returns when upgrade mode began (zero: strict).
func (a *App) peerTrustMode(cfg Config) time.Time {
	if cfg.PeerAllowHTTP {
		a.log.Warn("MUSTER_PEER_ALLOW_HTTP=true: replicas at plain-http addresses off loopback are followed and sent evidence IN CLEAR; anyone on the network path can read and rewrite views and evidence between replicas; for a lab only")
	}
	if !cfg.PeerUpgrade {
		return time.Time{}
	}
	a.log.Warn("MUSTER_PEER_TRUST=upgrade: unsealed replica rows and the release before's request signatures (replayable to another replica) are accepted, and sent; roll every replica again with MUSTER_PEER_TRUST=strict once no replica of the release before is left")
	return a.clock()
}

// peerTrustAlarms is peer_trust_upgrade, standing in upgrade mode.
func (a *App) peerTrustAlarms() []assembler.Alarm {
	if a.peerUpgradeSince.IsZero() {
		return nil
	}
	return []assembler.Alarm{{Kind: AlarmPeerTrustUpgrade, Since: a.peerUpgradeSince, Detail: "this replica runs with MUSTER_PEER_TRUST=upgrade: it believes unsealed rows of table replicas and accepts and sends the release before's request signatures, which name no receiver and can be replayed to another replica; once every replica runs this release (muster_peer_requests_accepted_total{header=\"v1\"} no longer rises anywhere), roll the region again with MUSTER_PEER_TRUST=strict"}}
}

// selfNames are the names this replica answers to as a receiver of peer
// requests: its replica id, and the base URL it advertises.
func selfNames(cfg Config) []string {
	out := []string{cfg.Replica}
	if addr := strings.TrimSuffix(cfg.Address, "/"); addr != "" && addr != cfg.Replica {
		out = append(out, addr)
	}
	return out
}
