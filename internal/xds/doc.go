// Package xds is muster's xDS surface (ADR-10): an aggregated discovery
// service, state of the world and delta, that Envoy and proxyless gRPC
// clients follow, built on go-control-plane's servers (no xDS protocol is
// written here) answering from muster's own cache (watchCache), which
// encodes each resource once and shares it among every stream sent it.
//
// # Resources
//
// Every service SERVICE the hub holds a view of becomes four resources
// named SERVICE: a Listener whose API listener is an HttpConnectionManager
// taking its routes by RDS over ADS (what grpc-go asks for when it dials
// xds:///SERVICE), a RouteConfiguration sending everything to the cluster
// SERVICE, an EDS Cluster, and a ClusterLoadAssignment built from the
// view's resolver.Snapshot.Targets, so xDS clients route exactly where
// muster's Go resolver routes (see Assignment for the mapping of states
// and weights). The first three depend only on the name; the assignment
// is rebuilt whenever the service's view changes.
//
// # Weights
//
// Envoy weighs endpoints within a locality; gRPC clients weigh only
// localities (round robin within one, endpoint weights ignored). So an
// endpoint whose weight is below its zone's top weight (slow start, an
// override, a guard's republished endpoints) is given a locality of its
// own, sub_zone its instance id, weighted by its share: both kinds of
// client then give every endpoint the resolver's share. A zone of one
// weight stays one locality, as it always was, so the steady state's
// bytes and versions are unchanged; while a zone is split the locality
// weights are ×10,000 rather than ×100, for resolution (Assignment).
//
// # Regions
//
// With Config.Regions, a service's assignment also carries the
// peer regions' views of it, the remote series SERVICE@REGION the
// federation follower hands the hub: the local view's localities at
// priority 0 (locality.region Config.Region), then each peer region, in
// Config.Regions order, whose series the hub holds and the node may
// resolve, at the next priority (locality.region that region), with no
// gap for a region that holds nothing routable (Priorities). gRPC and
// Envoy send traffic to a priority only when the ones before it have no
// healthy capacity left, so a client fails over to a peer region, and
// back, by itself. A service held only by peer regions is served from
// their priorities alone, starting at 0. Which regions a node sees is
// each region's decision (Config.MayResolveRemote, its grants), re-read
// with every node's authority; a service this region holds and the node
// may not resolve here is not served at all, as /v1/watch refuses it.
//
// # Versions
//
// An assignment's version is its view's version; one that carries peer
// regions' priorities adds "." and a hash of their (series, version)
// pairs in priority order (mergeTiers), the same on every replica for
// the same views and changed by any of them. The delta protocol carries
// it per resource, so one change sends that service's assignment alone;
// the listener, route and cluster are named by a hash of their bytes. A
// state-of-the-world response's version names what it holds: the hash
// of the (name, version) pairs of the resources sent, led, for
// assignments, by the newest local view version among them; a stream
// is sent a response only when one of the resources it asks for
// changed. Every version is a function of
// the views a node sees, never of the order they arrived in or of the
// process, so replicas whose hubs hold the same views serve the same
// versions and bytes, and a client moving between them with the versions
// it holds is sent nothing again by delta (TestReplicasServeTheSameVersions).
//
// # Fan-out
//
// A resource is encoded once per version, when it is built, and every
// stream sent it, whichever principal, gets those bytes: go-control-plane's
// SnapshotCache would encode it again for each response (and hash it for
// each delta response). A node's state-of-the-world response to a set of
// names is assembled once per snapshot and shared; a change answers only
// the watches that follow one of the names it changed, clusters and
// assignments before listeners and routes (pushOrder). muster serves ADS
// itself (ads.go): a stream's subscriptions live as long as it, an ACK
// changes nothing, and a response goes out as the bytes encoded once
// with the stream's nonce appended (adsCodec)
// (TestAChangeIsEncodedOnceAndReachesOnlyItsStreams,
// TestStreamsAnswerOnlyWhatConcernsThem; docs/measuring.md has the
// figures).
//
// # Who sees what
//
// Every stream presents a muster token ("authorization: Bearer" metadata),
// verified by the HTTP server's authenticator, or, with mutual TLS
// (Config.ClientCertificates), a client certificate that maps to
// a workload; without either it is refused UNAUTHENTICATED before it can
// ask for anything, and a workload token the certificate contradicts is
// refused PERMISSION_DENIED. The cache is
// keyed by principal: a request's node is ignored for the principal's
// name, and each principal with an open stream
// (a node) has a snapshot of its own holding the services it may resolve
// (registry.AuthzCache's decision, as for /v1/watch). Any other service is
// absent, as one that does not exist would be, and asking for it is
// counted. The feeder re-reads every node's authority each Rescan (a
// grant given) and at once when the authorisation copy signals a
// withdrawal.
//
// # The feeder
//
// One hub subscription follows every service with a view, and the
// series of Config.Regions the hub holds (re-made when the hub's set of
// either changes, within Rescan); each frame names a series whose latest
// view the feeder reads from the hub, decodes and turns into its part of
// a service's assignment (a frame of SERVICE@REGION rebuilds SERVICE),
// so it never applies deltas itself and an overflowed subscription costs
// a resync of full views. A node's snapshot is rebuilt when a service it
// sees changes; building shares the services' resources (each variant of
// an assignment, by the regions nodes see, is built once), so it costs a
// few maps per node.
//
// # Readiness
//
// After a start nothing is answered until Config.Ready holds (app: the
// evaluator rebuilt, views published, the authorisation copy loaded): a
// snapshot set earlier would tell clients that services they route to do
// not exist, and a gRPC client drops a listener it is told is gone.
//
// # Streams
//
// Each stream passes the watch stream's reconnect admission (checked
// before the token is verified, taken after), is counted in the hub's
// subscriber population (Hub.CountSubscriber, which the census persists),
// and ends when its token expires. A NACK is logged and counted; the
// state-of-the-world cache would answer the rejected version at once, so
// the server records the version it sent and hands the cache that one,
// and the client gets nothing until the resources change (delta never
// resends an unchanged resource). Drain (shutdown) sends GOAWAY and ends
// the open streams spread over DrainWindow, UNAVAILABLE, so clients
// reconnect elsewhere over the window rather than at once.
package xds
