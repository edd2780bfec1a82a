// Package streamcheck checks muster's watch stream (GET /v1/watch) from
// the outside, as a strict client would see it, so a test or a load
// generator can say "0 gaps" with numbers behind it.
//
// It speaks the protocol over raw HTTP and keeps its own copy of every
// service's view, applying each frame itself: it does not use the
// resolver library, whose repair logic (resubscribing after a gap,
// ignoring stale frames) would hide exactly what is checked here. On
// every frame:
//
//   - a delta must start from the version held for its service (its
//     from_version): otherwise it is a gap, counted, and the checker
//     resubscribes for full views (no since), as the resolver does;
//   - no frame may be at or below the version held (a duplicate), and no
//     full view below it (a regression). A full view at exactly the held
//     version is a duplicate only on a subscription that told the server
//     it had that version (since at or above it): after a resubscription
//     from scratch the server cannot know;
//   - after applying, the checksum of the copy's endpoints
//     (assembler.Checksum, the function muster itself publishes with)
//     must equal the frame's.
//
// A stream that ends (a drain, the connection lost, a process killed) is
// resumed after a full-jitter backoff with since set to the checker's
// watermark: the highest version it applied, across its services. The hub
// delivers each subscription's frames in version order, so a client that
// applied version N holds everything published up to N for its services;
// that is the contract the watermark checks. (The resolver resumes more
// cautiously, from the lowest version it holds, and ignores the stale
// frames that brings.)
//
// Compare asks GET /v1/resolve/{service} for every service and reports
// any difference from the copy (version, checksum, endpoints, zones):
// what a checker holds once the churn stops must be what muster serves.
package streamcheck
