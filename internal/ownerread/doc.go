// Package ownerread answers reads of evaluator state (a service's
// verdicts, the quarantines in force, every service's counts, a contract
// preview's replay) on any replica of a region, from the replica that
// holds that state.
//
// Only the owner of a service's shard receives and evaluates its
// evidence, so another replica's evaluator knows nothing of it, and
// answering from there would show every instance "unknown" and no
// quarantine: wrong, and misleading exactly when an operator looks. So a
// Reader answers a service locally when this replica owns it, when the
// ownership has not been read yet, or when its shard has no live owner
// (every replica is then sent its evidence); otherwise it asks the owner
// over a signed replica-to-replica request (server's /v1/peer/eligibility,
// /v1/peer/quarantines, /v1/peer/stats and /v1/peer/contract-preview)
// with a short timeout.
//
// Lists fan out to every live replica holding shards, in parallel, each
// answering for the services it owns or publishes; the Reader keeps each
// service's answer only from the replica its own reading names, so a
// merged list has no duplicates. A replica that does not answer is named
// in the result (Incomplete): its services are missing, never made up as
// "unknown". A single service whose owner does not answer is an error
// (*OwnerUnreachableError) the HTTP layer answers 503 with a Retry-After.
//
// Merged lists are cached for at most CacheFor (1 s), so a UI refreshing
// or several operators looking do not multiply the requests. For the
// notifier, which must not resolve a quarantine only because its owner
// was briefly unreachable, QuarantinesHeld uses a replica's last answer
// for up to HoldFor (30 s; the shard moves within 9 s of its owner dying,
// after which its new owner answers).
package ownerread
