// Package resolver is muster's cache-first client library: it holds the
// routing view of each configured service in process and answers lookups
// from it without consulting muster.
//
// # Design notes
//
// The view a client holds is authoritative for routing (ADR-01). Resolve
// and Pick are in-process lookups: no I/O, no lock, no allocation. Each
// service has one atomic pointer to an immutable Snapshot, in a map fixed
// when the Cache is built (services are configured up front, so the map is
// only ever read concurrently). A reader loads the pointer and uses what it
// finds; a writer builds a new Snapshot off to the side and swaps it in.
// Everything Pick needs (the routable subset and its cumulative weights) is
// computed once per Snapshot, so a pick is one random draw and a binary
// search. Pick's randomness comes from math/rand/v2's per-thread ChaCha8
// unless WithRandom replaces it. Snapshots hold their endpoints by
// pointer, so a delta copies a pointer per endpoint and builds only the
// endpoints it changes.
//
// Updates are monotonic and checked. A view or delta at or below the held
// version is ignored (ErrStale); a delta that does not start at the held
// version is refused (ErrGap); an update whose resulting endpoint set does
// not hash to its checksum is refused (ErrChecksum). In those cases the
// held snapshot stays and the caller fetches a full view. The checksum is
// the sum modulo 2^256 of each endpoint's SHA-256 digest, so a delta is
// checked by adjusting the held sum for the endpoints it touches, before
// anything is built. Checksum re-implements muster's algorithm; a test
// cross-checks it against muster's own, and a fixed vector was computed
// independently.
//
// The checksum is a public function of the endpoints: it catches a lost
// delta, not a forger. muster also signs every view with the region's
// Ed25519 key (Signature: over the service, version, checksum, a digest
// of the zones and the signing replica), and a delta carries the
// signature of the view it produces. A client given the region's public
// keys (WithViewKeys, Config.ViewKeys; LoadViewKeys reads the PEM files
// muster's MUSTER_AUDIT_PUBLIC_KEY_FILES names) verifies it over the
// checksum and zones it computed itself, and refuses an update that is
// unsigned or does not verify (ErrSignature, Stats.SignatureRefusals): the
// held snapshot stays and the client resubscribes for a full view.
// Without keys nothing is verified, as before. Views of peer regions
// (series "service@region") and last-known-good files are not checked by
// these keys.
//
// The client guards exist a second time here because a server bug must
// not empty a fleet's routing tables, but they must not outlive the
// doubt: a guard that never lets go keeps a client routing to terminated
// instances. A shrink is measured against the set routing holds, less the
// instances the registry removed: each zone's Zone.Registered (how many
// instances the registry lists there) carries the drop from the routing
// snapshot to the update, and a zone absent from the update counts as all
// of its instances gone. Only when both snapshots carry Registered for
// every zone involved is anything subtracted (a muster from before issue
// 12 sends none). An update that removes more than the shrink cap
// (default half) of the routable set beyond what the registry removed
// (ErrShrinkCapped), or that leaves nothing routable while the registry
// neither removed every routable instance nor lists none at all
// (ErrWouldEmpty), is held: recorded, with routing kept on the larger set.
// Anything else is taken at once, so a scale-down from 10 to 4
// (registered 10 -> 4) and a decommission (every zone gone, or every zone
// at 0 registered) are followed immediately (Stats.RegistryShrinks). The
// shrink cap does not apply when the update reports a tripped zone guard
// (muster then publishes full zones); emptying the service is still held.
//
// A hold records when it began (the Cache's clock) and why; Result.Hold
// shows it, with the held and newest versions and routable counts. It
// lasts only until the server has stood by a smaller set for the confirm
// time (WithConfirmAfter, Config.ConfirmAfter; default 60 s): if every
// update since the hold began was also refused, routing follows the newest
// one, on the next update after the deadline or on the next Sweep (the
// Client sweeps every second, so a quiet server is followed too), with an
// event wrapping ErrHoldFollowed and Stats.HoldsFollowed counting it. An
// update the guard takes (the server sent a larger set again) switches
// routing as usual and ends the hold, so the next refusal starts the
// confirm time afresh. Release lets an operator follow at once. Recording
// held updates matters: the next delta chains on the newest version, so a
// refusal does not turn into an endless cycle of gaps and full fetches.
// Refusals are counted in Stats and reported through the WithEventHook
// callback.
//
// Routable means weight > 0 and either the zone's guard tripped or the
// endpoint is in rotation by its own verdict (state not "ineligible", not
// quarantined). Pick weighs each routable endpoint by its zone's traffic
// weight (shift-backs, ADR-13), so a drained zone gets no picks without
// counting as a shrink; if every zone is drained the traffic weights are
// ignored rather than leaving nothing to pick.
//
// With WithDir every snapshot routing switches to (an update taken, a hold
// followed or released) is written as the service's last-known-good file,
// so a restarted process starts from what this one routed on, never from
// a set it had stopped routing to. The file is the view's JSON inside a
// small envelope carrying the SHA-256 of exactly those bytes, written to
// a temporary file in the same directory, fsynced, renamed over the old
// file, and the directory fsynced. New loads the files; one that is
// truncated, edited or otherwise untrustworthy is ignored whole, with the
// reason reported. The write is synchronous under the service's writer
// lock; readers never wait on it.
//
// Instance ids are compared as text, which matches muster's byte order
// for the canonical lowercase UUID form muster publishes.
//
// Client keeps a Cache current from muster's watch stream
// (GET /v1/watch, Server-Sent Events). One goroutine subscribes for all
// configured services, naming the version it holds of each (held=, issue
// 27: versions are unique in the region, so any replica resumes each
// service from exactly that copy; since = the lowest version held for a
// server that predates held, 0 when any service has none), applies views
// and deltas, and on a
// gap or checksum mismatch resubscribes for full views. When the stream is
// lost (end, error, a drain event, or no frame within HeartbeatTimeout) it
// resubscribes to the next URL after a full-jitter exponential backoff,
// or the server's Retry-After when that is longer. Losing the stream
// changes nothing in routing: Resolve keeps answering from the held view
// and only its age grows. ResolveOrDefault treats a service as cold until
// routing has had a routable endpoint since New: with nothing cached, or
// only views with nothing routable (instances awaiting readiness), it
// waits for an update until its context's deadline, then returns
// Config.Default. A service that had routable endpoints and now has none
// (decommissioned, or a hold followed to nothing) answers ErrNoEndpoints.
// The server's synced event says the stream caught up; it is never taken
// for a view: ClientStats.Synced is true only while the cache also holds
// a view of every configured service (muster sends synced only after
// those views, and an older server that sent it earlier still leaves
// Synced false until they arrive).
//
// # Outcomes and local ejection
//
// Record notes the outcome of each call the caller makes (lock-free, no
// allocation), including whether the endpoint's most recent outcome was a
// failure. The counts serve twice. Local passive ejection
// (EjectionPolicy) leaves an endpoint with five consecutive failures out
// of Pick for 30 s (longer each time). The cap is on healthy-looking
// capacity: while another routable endpoint still in rotation looks
// healthy (its most recent outcome a success, or none yet), the endpoint
// is ejected however many already are, so no dead endpoint stays pickable
// for rounding's sake; when nothing else looks healthy (the caller itself
// may be the problem) no more than half of the service's routable
// endpoints (floor(MaxFraction x routable)) are ejected at once, and
// ejections beyond that end early. The last routable endpoint in rotation
// is never ejected. Ejection is this
// process's decision and changes nothing in muster. And the Client sends
// them back to muster every ReportInterval as passive aggregates (POST
// /v1/reports, at most MaxReportItems endpoints per interval, in batches
// of 5,000), where they are one evidence class among three and cannot by
// themselves drain anything. When muster is away the counts are dropped
// and counted (ClientStats.OutcomesDropped), never queued: Record must
// not block or grow memory because the control plane is down.
package resolver
