// Package dnszone is muster's authoritative DNS zone (ADR-10's
// compatibility surface): the same routing set the Go resolver uses,
// served over UDP and TCP with github.com/miekg/dns, for clients that
// cannot hold a watch subscription.
//
// # Where answers come from
//
// A follower (one goroutine, the worker) subscribes to the stream hub for
// the served services and keeps each one's latest view, applying deltas
// (checked by the view's checksum; a delta that does not follow or does
// not check out is replaced by the hub's latest full view). Each changed
// service's records are rebuilt from resolver.SnapshotOf(view).Targets(),
// so DNS publishes exactly what Pick routes to: the endpoints in rotation
// (eligible, degraded, health unknown), every endpoint of a zone whose
// guard tripped, drained zones (traffic weight 0) left out unless every
// zone is drained. The zone is an immutable value swapped atomically: a
// query reads memory only, never PostgreSQL, so DNS keeps answering while
// the database is away, and with muster's own last views while the
// publisher is stuck. When the hub closes (shutdown) the zone stays as it
// was until the server stops.
//
// Until views have been published since muster started (Config.Ready,
// what /readyz waits for), the zone is not served: names in it answer
// SERVFAIL, transfers too, and no NOTIFY goes out. A rebuilding muster's
// empty zone would otherwise tell every client that no service exists
// (NXDOMAIN, negatively cached) and hand secondaries an empty zone under
// a newer serial; SERVFAIL sends resolvers to another server or to what
// they hold, and secondaries keep their copy and retry.
//
// # Names
//
//	ZONE                   SOA, NS (and the in-zone nameserver's address)
//	_muster.ZONE           TXT: the caching caveat below
//	SERVICE.ZONE           A/AAAA of every target; TXT muster-view-version=N
//	ZONENAME.SERVICE.ZONE  A/AAAA of the targets in one zone (NODATA when
//	                       none is routable there, e.g. the zone is drained;
//	                       fall back to SERVICE.ZONE)
//	ID.SERVICE.ZONE        A/AAAA of one instance: the SRV records' targets
//	_SERVICE._tcp.ZONE     SRV of every target: priority 0, port, weight =
//	                       share / largest share × 65535 (at least 1)
//
// A name that does not exist is NXDOMAIN, a name with no records of the
// type asked is NODATA (NOERROR, empty), both with the SOA in the
// authority section, whose minimum (the TTL, 5 s) bounds negative caching.
// Names outside the zone are REFUSED: muster does not recurse. Addresses
// rotate per query. Over UDP an answer is cut to the client's EDNS0 buffer
// (512 bytes without EDNS0) with TC set, so the client asks again over
// TCP, where it is complete.
//
// # Serials (RFC 1982)
//
// Every change of a served view's version is a change of the zone: the
// follower commits the changed services at most once per tenth of a
// second, and each commit takes the serial tick(now) = (Unix time in
// tenths of a second) mod 2^32, or the previous serial + 1 when the clock
// has not moved past it (it stepped back). Serials therefore increase in
// RFC 1982 order with every view change, never run ahead of the wall
// clock (one commit per tick at most), and a restarted muster starts above
// every serial it served before, without remembering anything: view
// versions themselves cannot be the serial, since their low 32 bits
// restart with every process's epoch. Secondaries that see serials from
// two muster replicas would see two unrelated sequences: point a
// secondary at one replica (or one address in front of one).
//
// # Transfers and NOTIFY
//
// The last History commits' diffs are kept, so IXFR (RFC 1995) from a
// serial inside them sends the changes since; from anything older, the
// whole zone (AXFR-style, which RFC 1995 allows). Transfers are answered
// only to the configured secondaries' addresses and only when signed with
// the configured hmac-sha256 TSIG key (anything else is REFUSED, a bad
// signature NOTAUTH, and counted in muster_dns_transfers_total). Every
// commit wakes a notifier that sends each secondary a signed NOTIFY
// (RFC 1996; three tries of one second); commits that land meanwhile are
// coalesced into the next round. The SOA's expire is 7 days: a secondary
// keeps serving its copy through a long muster outage, as a client keeps
// routing on its last-known-good view.
//
// # What DNS cannot promise, and who may ask
//
// DNS clients, resolvers, language runtimes and sidecars cache answers,
// often beyond the TTL; a withdrawal reaches them when their caches
// expire, which is other people's software. That is the weaker guarantee
// ADR-10 states, and _muster.ZONE says so in the zone itself.
//
// DNS carries no identity, so the per-caller resolution grants that guard
// the watch stream cannot apply: anybody who can reach the listener can
// resolve every served service. The zone therefore serves only the
// services configured (Config.Services), or all of them only when "*" is
// configured deliberately (muster dev's default); under muster serve the
// list is required. A service not served is NXDOMAIN, as if it did not
// exist. Zone transfers, which would list everything, need the TSIG key.
package dnszone
