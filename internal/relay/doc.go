// Package relay makes every replica of a region serve every view (issue
// 27). Only a service's owner publishes its views; every other replica
// holds them too, so that a subscriber may connect to any replica. Each
// replica streams what its own publisher publishes (stream.Tap) to every
// peer that asks (GET /v1/peer/updates, signed by the region's key:
// internal/peer), and the Relay worker keeps one such stream open to
// every live peer and hands what it reads to its own hub (Hub.Relay).
//
// A peer stream is NDJSON: one Record a line. It opens with a snapshot
// record per view the peer holds, then carries an update record per
// publication (the view and the delta from the previous version, both
// as the publisher encoded them), a fresh snapshot whenever the peer's
// tap overflowed, and a heartbeat every 2 s. The frames' bytes travel
// verbatim (json.RawMessage both ways, no decode and re-encode): clients
// check checksums, and every replica must serve one version with the
// same bytes. Deltas travel with their views so that clients of any
// replica keep receiving deltas; the hub decides whether a delta chains
// onto what it holds (otherwise its subscribers get the view).
//
// Duplicates are harmless: the hub drops versions at or below what it
// holds, so a snapshot overlapping updates, two peers relaying the same
// view (an ownership move), or a reconnect's snapshot change nothing.
//
// # Signed views
//
// What a peer stream carries is believed only if the region's key signed
// it: whoever can put bytes in front of this replica (a rogue server at a
// peer's address, something on the network path of plain-HTTP replicas)
// can compute a view's checksum, but not its signature. Before a snapshot
// or update reaches the hub (verify.go) its view is decoded, must name
// the record's service and version, and must carry a signature by a key
// of Config.ViewKeys over exactly its service, version, endpoints (their
// checksum recomputed here) and zones. An update's delta must name the
// same service and versions and carry the view's checksum and signature,
// and, when this replica knows the base it applies to (the last view it
// verified, or its hub's), base plus delta must be the view; a delta
// whose base is not known here is dropped, so the hub sends the view.
// A record that fails is not applied, ends its stream like a malformed
// one (without resetting the reconnection backoff), is counted (muster_relay_forged_total{peer}) and raises
// relay_forged naming the peer's id and address for 15 minutes after the
// last one. Unsigned views are taken only with Config.AcceptUnsigned (a
// rolling upgrade from a release that signs nothing), their checksums
// still checked.
//
// A signed view is then believed only within a sealed tenure
// (internal/tenure): its version's epoch must be one the replica that
// signed it recorded for the service's shard while it held the shard's
// lease. A view outside every tenure (signed by the key, but not its
// signer's to sign) is not applied, counted
// (muster_relay_outside_tenure_total{peer}) and raises
// view_outside_tenure; its stream goes on, as what it carries is
// genuine. Tenures are remembered once read; when they cannot be read
// (PostgreSQL away, or the shard count not yet known at a start without
// it) the view is taken on its signature alone and counted
// (muster_relay_tenure_unchecked_total): a database outage must not stop
// relaying.
//
// The worker re-reads its peer list every second, disconnects from a
// peer that left it, reconnects with jittered exponential backoff (100 ms
// to 5 s), and treats 6 s without a line (three missed heartbeats) as a
// dead connection. A malformed record ends its connection and is counted;
// nothing of it reaches the hub.
//
// A replica that cannot hear a peer cannot tell by itself whether the
// peer died, the peer is cut off, or it is: the peers' streams are what
// it has lost. So every replica also says, every second and through
// PostgreSQL (Reports, table relay_reports), how long ago it last heard
// each peer and which shards it owns, and judges from what the others
// say (current.go): a peer it has not heard for 5 s while another
// replica heard it 2.5 s more recently is alive and talking, so that
// peer's services are stale here (the hub drains and refuses their
// subscribers, OnStale ends their xDS streams), and a replica that hears
// none of its live peers while such a peer exists is not ready. A
// replica that vouches for a peer hears it, so the replicas never all go
// unready; with no evidence (no reports) nothing is stale.
package relay
