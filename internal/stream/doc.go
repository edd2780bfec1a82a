// Package stream is the streaming tier (ADR-10, 11, 13): it holds the latest
// view of every service and a short history of deltas, and fans published
// changes out to watch subscribers.
//
// Encode once: the assembler hands over each view and delta already encoded;
// the hub shares those bytes with every subscriber, so per-subscriber work
// is filtering and writing, never re-encoding. A reconnect storm costs
// writes, not CPU per subscriber.
//
// Ordering and reconciliation: versions are region-wide and increase with
// every publication, and the hub delivers in version order, so a client
// that has applied everything up to N can resume with since=N and receive
// exactly the deltas after N for each of its services, or a full view for a
// service whose history no longer reaches back to N.
//
// Bounded memory: each subscriber has a small queue of pointers to shared
// frames. A subscriber too slow to keep its queue from filling is not
// allowed to grow it: its queue is dropped and it is marked for a resync,
// receiving full views of its services when it catches up.
//
// Synced means "holds a view": a subscription's synced frame follows its
// catch-up frames only once the client has been sent a view of every
// service it asked for, or is current by its since. A service the hub has
// no view of yet (the evaluator is rebuilding after a restart) holds
// synced back; the client keeps what it has and gets heartbeats, then the
// first view, then synced. The first publication of a service in a hub
// always goes out as the full view, since its delta may start from a
// version only the previous process published.
//
// Admission (ADR-13): in no window (10 s) may more than a fraction (5%) of
// the expected subscriber population (re)subscribe; the rest are told to
// come back after a full-jitter delay spread over the windows the backlog
// needs, so a control-plane restart does not become a synchronised
// reconnect storm. The population must be known without having been seen
// since start: the Census persists each replica's subscriber count (table
// stream_population, with the replica's recent peak) every window and
// reads back the region's expected population, the sum over live
// replicas (a heartbeat in table replicas within the lease TTL) seen
// within 15 min of their recent peak; a dead replica's clients come back
// through the live ones, and counting its peak too would count them twice. Each live replica admits its share,
// so the region admits 5% of its population per window whatever the
// number of replicas. A restarted replica thus admits 5% of the clients
// about to come back (60,000 in ~200 s) instead of 5% of the nothing it
// remembers. When PostgreSQL is away, the last reading stays in force for
// 15 min; with no reading at all, admission falls back to this process's
// own recent peak (and the floor), and the census logs that it did.
package stream
