// Package ownership gives each service one owning replica in a region
// ("One owner per service"): services hash onto a fixed set of
// virtual shards, and each shard is held by one replica at a time through
// a lease row in PostgreSQL, timed by the database's clock and carrying
// an epoch that fences a deposed owner. Muster uses it for lease expiry,
// observation writes and publication (see docs/replicas.md).
//
// # Shards and the balance
//
// ShardOf maps a service to a shard with a fixed hash; the shard set is
// the rows of shard_leases (64, seeded by migration 000026), read by
// every replica, so no two replicas can disagree about the count. Every
// round a replica heartbeats its replicas row, and the replicas seen
// within a TTL are the live ones. Balance, a pure function of one round's
// reading, gives each live replica a target of shards/N (the remainder
// one apiece in id order) and says which shards this replica should take
// (free ones: never taken, released, or expired) and which it should
// release (its excess). Free shards are dealt in rendezvous order, the
// same way by every replica, so replicas short at once do not race for
// the same shards. A replica never takes a shard someone else holds: it
// waits for the holder to release it or for the lease to expire.
//
// # Leases and epochs
//
// A lease row is (shard, owner, epoch, acquired_at, renewed_at,
// expires_at). Every time is the database's clock (clock_timestamp()),
// so skew between replicas cannot make two of them believe they hold a
// shard at once. Taking a shard (only when free) increments its epoch;
// renewing and releasing do not, so (shard, epoch) names exactly one
// tenure, and every statement that renews or releases names its tenure,
// not only its owner. Release keeps the epoch because the next take
// increments it anyway; nothing is gained by burning one.
//
// There are no advisory locks and no LISTEN: session state does not
// survive an Aurora failover or a transaction pooler, and a row does.
// Nothing here depends on NOTIFY either; if it is added, it is only a
// hint to run a round sooner.
//
// # Fencing
//
// Two guards keep a deposed owner from acting, one for work without the
// database and one for work with it.
//
// The local deadline. A replica counts a shard as its own only until
// send + TTL - Margin on its own monotonic clock, where send is the
// moment it sent the last renewal (or take) that landed. The database
// stamps expires_at = (its clock when it runs the statement) + TTL, and
// it runs the statement after it was sent; so, as long as the two clocks
// run at the same rate over a TTL (their offset does not matter), the
// local deadline passes at least Margin before anyone else may take the
// shard. When it passes, Owns stops answering yes at once and the
// OnChange callbacks hear of the loss within Margin/4 (a watch apart from
// the rounds), even while the database is unreachable and every round
// hangs. A replica that loses a shard is therefore told before a new
// owner can take it; Margin pays for clock drift over a TTL (parts per
// million), the watch's lag, and the callbacks. What it cannot cover is a
// process frozen for longer than Margin between asking Owns and acting
// (a stop-the-world pause, SIGSTOP): that is what the second guard is
// for, wherever the action is a write.
//
// Fence. A writer runs Fence(ctx, q, shard, epoch) in its transaction:
// SELECT … WHERE shard, epoch, owner match AND expires_at > now … FOR
// SHARE. The row lock makes a takeover (an UPDATE of the row) wait, or
// skip the shard, until the writer's transaction ends, so a fenced write
// either commits before the next tenure begins or, once the epoch has
// moved, fails with ErrNotOwner. Releasing a shard tells the callbacks
// first and frees the row after, so a graceful hand-over needs neither
// guard to be tested.
//
// # Timing
//
// TTL 7 s, Interval 2 s, Margin 1 s by default. A replica killed without
// a word leaves leases that expire at most TTL after its last renewal;
// its heartbeat, sent just before that renewal, stops counting at the
// same time, so the survivors' targets already include its shards and
// their next round takes them: the shards move within TTL + Interval = 9
// s (the issue asks for at most 10 s). The local deadline is TTL - Margin
// = 6 s after a renewal is sent, so two rounds (0 s and 2 s) may fail and
// the third (4 s) still keeps the shard; Config.Validate insists on room
// for two renewals. A graceful stop (Stop, Release) frees its shards and
// its replicas row at once, so they move within one Interval.
//
// # Who is a member
//
// The region's members are the live rows of table replicas this replica
// believes (members.go): each replica seals its own row's identity with
// the region's key, and a row whose seal does not verify (written by
// hand, re-pointed, sealed by a key not trusted) or whose address is
// plain http off loopback is left out of every reading: the balance, the
// relay, the forwarder and the census never see it. A sealed row proves
// who wrote the identity, not that a process stands behind it: a replica
// that leaves an offer, or a free shard dealt to it, untaken for
// OfferTimeout is dealt nothing for UnresponsiveFor.
//
// # What we learned from others
//
// Kubernetes Leases with client-go's leaderelection measure a lease on
// the local clock from when the candidate observed the record change,
// which tolerates skew but, as its own documentation says, does not
// fence: a paused leader can act after its lease has gone. River's
// leader election keeps one row per leader name with expires_at computed
// by now() in PostgreSQL and re-election by the same id, but carries no
// token to check at write time. Here the expiry is the database's (as in
// River), the holder's local deadline is the pessimistic bound (as the
// renew deadline in client-go), and the epoch makes the tenure checkable
// where it matters, in the writer's transaction.
package ownership
