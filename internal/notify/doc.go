// Package notify sends muster's alarms to the teams that own them and to
// the platform: each open alarm (a flap quarantine, a guard
// trip, a prober outage or suspicion, a lease or reconciliation hold,
// unsealed rows, a pending shift-back, …) goes to its service's owning
// team's target and to the platform's, as an Alertmanager v2 alert (POST
// /api/v2/alerts, so existing routing, silences and paging apply) or as a
// plain JSON webhook, and is resolved there when the alarm clears.
//
// # Shape
//
// The Notifier is a worker (Start, Stop) around RunOnce, which takes the
// current alarm set (Config.Alarms), diffs it against what it has sent,
// queues a firing alert for each new alarm (and again every Resend while
// it stays open: Alertmanager resolves an alert it stops hearing about
// once its endsAt passes, which the notifier sets to four resends ahead),
// queues a resolution (the same labels, endsAt now) for each alarm that
// cleared, and delivers what is due. It runs on its own goroutine and
// reads the alarm set the server's GET /v1/alarms reads, from memory: a
// slow or dead target costs retries here, never a request or a
// publication.
//
// # One sender per region
//
// Every replica holds the region's alarms; Config.Sends says which this
// replica sends (app: the owner of the alarm's service's shard, or of
// the region alarms' key; a replica's own condition, Alarm.Replica,
// always), so a webhook, which deduplicates nothing, hears of each alarm
// once per region. An alarm that becomes another replica's to send is
// forgotten without a resolution (it has not ended), its queued copies
// dropped; the new sender fires it afresh.
//
// # Delivery
//
// Each target has a bounded queue (Config.QueueSize) holding at most one
// delivery per alarm (a resolution replaces a firing alert not yet
// delivered). A failed POST (a transport error or a status other than
// 2xx) is retried after an exponential backoff with jitter, from
// Config.Backoff doubling to Config.MaxBackoff; after Config.MaxAttempts
// attempts, or when a full queue drops its oldest delivery, the delivery
// is dead-lettered: counted in muster_alerts_dead_letter_total and
// logged, never retried. Target URLs may carry credentials, so only
// their host is ever logged or used as a label.
//
// # Labels
//
// alertname is the alarm's kind, team its service's owning team
// (platform for an estate-wide alarm, or a service whose owner the
// authorisation copy does not hold), service, instance and zone where the
// alarm has them, region this muster's, and alarm a short hash of the
// alarm's identity (kind, service, instance, zone and when it began), so
// two open alarms of one kind never merge in Alertmanager. The
// annotations carry the human text: summary and description (for a
// quarantine, the instance and its flap history).
package notify
