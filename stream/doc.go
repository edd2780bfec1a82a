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
// Admission (ADR-13): at most a fraction of the recent peak subscriber
// population may (re)subscribe per window; the rest are told to come back
// after a jittered delay, so a control-plane restart does not become a
// synchronised reconnect storm.
package stream
