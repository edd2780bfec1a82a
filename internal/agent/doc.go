// Package agent is muster agent: a small local process that holds a
// workload's identity (a token file, or a SPIFFE SVID) and serves that
// workload's data planes on loopback or a Unix socket without
// credentials: xDS (state of the world and delta), muster's watch stream
// and /v1/resolve, /readyz and /metrics.
//
// Stock gRPC clients (grpc-java, grpc-js-xds, Envoy builds without JWT
// call credentials) accept only insecure or google_default channel
// credentials for their xDS server and send no call credentials, so they
// cannot present what muster's xDS requires. The agent presents it for
// them, as istio-agent's xDS proxy does for Envoy, but it is not a
// proxy of the xDS protocol: it follows muster through the resolver
// library (one watch stream for the service set, region fallbacks over
// the upstream URLs, backoff, the shrink guard, signed views, the
// last-known-good files on disk) and serves what that client routes on
// from a local stream.Hub, through muster's own xDS server. Local
// clients therefore see the guarded last-known-good view, the same bytes
// whichever surface they use, and a restart of the agent with muster
// down serves the cached views at once.
//
// # The service set
//
// The agent starts with the services it is told to hold and grows the
// set when a local client asks for one it does not hold (an xDS
// resource name, a watch, a resolve). It first asks upstream for the
// service's view with its own identity: a service upstream refuses
// (not granted, unknown) is not added, and is refused locally for a
// minute, so one bad name never takes the whole watch stream down (muster
// refuses a watch naming any service the caller may not resolve). A
// service muster knows is added, and the resolver client is replaced by
// one holding the larger set over the same cache folder; the views held
// keep being served while it connects.
//
// # Trust
//
// Everything served goes to whoever can reach the socket, with the
// agent's authority: a local client sees exactly what upstream grants
// the agent's identity. That is why the agent refuses to listen
// anywhere but on loopback or a Unix socket, and drops a TCP connection
// whose peer is not a loopback address.
package agent
