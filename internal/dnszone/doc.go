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
// second (timed by the monotonic clock), and each commit takes a serial
// from the views it holds, not from this replica's clock
// (several replicas serve one zone, and a secondary may transfer from any
// of them). The serial is the low 32 bits of a 64-bit point:
//
//	content point  c(M) = newest << 7 | (fp & 127)
//	newest         the latest generated_at among the held views, in
//	               tenths of a second of its owner's clock
//	fp             XOR over the held views of FNV-64a(service, version)
//	commit         point = c(M) if c(M) > the previous point, or if the
//	               previous zone was never served (not ready);
//	               otherwise previous point + 1 + (fp >> 7) mod 8
//
// (a) Same views, same serial: c depends only on M, the map service →
// version (generated_at is part of the view its owner published, the
// same bytes on every replica). Two replicas holding the same M serve the
// same serial whenever each one's last commit took c(M), which is so
// whenever the newest view of M arrived in that commit or later than
// every earlier commit's newest view by a tenth of a second: the usual
// case, since a change is published by its owner now, after what came
// before. The second rule below is where (a) weakens.
//
// (b) Never backwards: the point rises with every commit by
// construction (c(M), taken only when above, or a step of 1 to 8), so
// the serial rises in RFC 1982 order while a step stays under 2^31, i.e.
// while less than 2^24 tenths of a second (19 days) of owner time pass
// between two commits; a zone unchanged for longer has expired at every
// secondary (expire is 7 days) anyway. Neither clock stepping back
// lowers it: this replica's wall clock is not read (but for the empty
// zone below), and an owner whose clock stepped back stamps views that
// do not raise c, so the commit steps on from the previous point.
//
// When the content changes but c does not rise (a view stamped earlier
// than the newest held arrives late, as relayed views from another owner
// do; a second change within the same tenth whose fingerprint bits
// happen to be lower; an owner's clock stepped back), the replica steps
// on locally. Its serial is then its own, not c(M): another replica with
// the same M may serve a different serial (harmless: a secondary
// transfers content it has, or waits for the next change), and another
// replica with different content may, by chance, serve the same one
// (the step is 1 to 8, chosen by the fingerprint, so two replicas
// stepping from one serial with different content collide about one
// time in 8; with c, different content under the same newest stamp
// collides one time in 128). The next commit whose newest view is
// stamped a tenth later than that local serial takes c again, and every
// replica agrees again: a local step lasts until the next fresh change.
//
// (c) No coordination: replicas exchange nothing about serials; they
// only need the same views, which the relay gives them.
//
// A restarted process keeps no serial: its first served commit takes
// c(M) (the zone is not served before it is ready), which is below what
// secondaries hold only if its views are not newer than before it
// stopped (they then keep their copy, which is at least as new) or if
// the previous process had stepped locally. A zone with no views at all
// takes its point from the local clock (tenths of a second), its only
// use of it. Versions could not be the serial themselves: they are 53
// bits, and a new owner's epoch moves them by a multiple of 2^31, more
// than RFC 1982 allows in one step; and a sum over services (which
// would rise with every change, even a late one) grows without bound
// as services are added.
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
