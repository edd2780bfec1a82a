package app

import (
	"github.com/musterhq/muster/internal/ownerread"
	"github.com/musterhq/muster/internal/peer"
	"github.com/musterhq/muster/server"
)

// buildOwnerReads builds the reader that answers reads of evaluator
// state (eligibility, quarantines, the UI's counts) from each service's
// owner: only the owner evaluates a service's evidence. It asks the live
// replicas the forwarder and the relay use, signed with the region's
// key; without a key every read is answered locally (replicas cannot
// prove themselves to one another, and each then evaluates what it is
// sent). It also tells the server which peers may read.
func (a *App) buildOwnerReads(cfg Config, svc *server.Config) error {
	rc := ownerread.Config{Self: cfg.Replica, Evaluator: a.Evaluator, Logger: a.log, Registerer: a.Metrics, Now: cfg.Now}
	if cfg.Policy.Sealer != nil {
		rc.Ownership = a.Ownership
		rc.Signer = peer.Signer{ID: cfg.Replica, Key: cfg.Policy.Sealer, Now: cfg.Now, V1: cfg.PeerUpgrade}
		rc.Client = peerClient(cfg.Relay.TLS)
		rc.Peers = func() []ownerread.Peer {
			var out []ownerread.Peer
			for _, r := range livePeers(a.Ownership.Region(), cfg.Region) {
				out = append(out, ownerread.Peer{ID: r.ID, Address: r.Address, Owns: r.Shards > 0})
			}
			return out
		}
	}
	var err error
	if a.OwnerReads, err = ownerread.New(rc); err != nil {
		return err
	}
	svc.Reads = a.OwnerReads
	// A replica that has heartbeated since this one started: one cut off
	// from PostgreSQL since still serves its callers, and asks owners for
	// them.
	svc.PeerLive = func(id string) bool {
		return a.Ownership.Region().At.IsZero() || a.Ownership.Seen(id)
	}
	return nil
}
