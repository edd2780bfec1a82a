// Package federation follows the peer regions (ADR-14): each region's
// muster is complete on its own, and what it knows of the others is a
// read-only aggregate pulled asynchronously from them.
//
// One Follower per peer region lists the peer's services (GET
// /v1/services, every page) and keeps a resolver.Client subscribed to
// their views on the peer's own watch API, with a token the peer issued
// to this region. The client is muster's public client library: it
// applies versions monotonically, verifies checksums, and keeps a
// last-known-good copy on disk (Config.CacheDir/<peer>), so a restart
// serves the peer's views before the peer answers. The follower never
// writes to the peer: it sends GET requests only, and turns the client's
// outcome reports off.
//
// The Aggregate holds, per peer region and service, the newest view
// received (versions decide, never timestamps) and the link's status.
// Its guarantee: remote endpoints are as fresh as the aggregate's lag,
// the time since the peer last answered, which View returns with every
// view. Losing a peer degrades only cross-region answers: the peer goes
// stale after Config.StaleAfter, the peer_stale alarm opens with its
// age, and the copy held is served as it was.
//
// A partition heal is explicit: while a peer is stale (or its copy was
// loaded from disk at start) the aggregate leaves its copy untouched;
// once the peer is reached again and its stream has caught up, the copy
// is replaced whole from the peer's current views, the versions are
// compared service by service (Diff), and one audit row
// (ActionReconcile, actor system:federation) records what changed. Only
// the replica that owns OwnershipKey(peer) among the region's replicas
// writes it; every replica follows the peers for its own reads.
//
// The DESIGN card names this package federation/; the card also fixes
// the repository's top level, so it lives under internal/ like every
// other package but the public client.
package federation
