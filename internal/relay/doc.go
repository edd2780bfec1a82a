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
