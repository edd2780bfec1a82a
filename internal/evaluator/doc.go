// Package evaluator is the embedded evaluation worker: it feeds health
// evidence into the pure eligibility core and queues verdicts and
// transitions for the next stage, which pulls them (Changed, TakeChanges)
// and reads each service as the assembler takes it (Snapshot).
//
// One Evaluator owns one eligibility.Engine behind a mutex. Ingest attributes
// each report to an authenticated identity (ADR-15) against an in-memory copy
// of the registry (which instance belongs to which service, which prober is
// assigned to what), so the hot path does no database work; refused items are
// counted and explained per item, and never poison the rest of a batch.
//
// State classes (ADR-02): the engine's state is computed and lives only in
// memory. At start the evaluator rebuilds it from the registry plus the
// observed windows retained in PostgreSQL (an UNLOGGED table written by COPY
// every FlushEvery), and holds publication (Ready is false, nothing is
// queued for the publisher) until the rebuild is done. Losing the windows costs confidence, not
// correctness: the instances come back as unknown and stay in rotation.
//
// Every eligibility transition after the rebuild is appended to the
// transitions table by a background writer; when PostgreSQL is away the
// writer buffers a bounded number and counts what it had to drop, and
// evaluation never waits for it. Registry refreshes and window flushes run
// in a loop of their own beside the evaluation loop, so a database that
// hangs (each refresh is bounded by DBTimeout) delays what the registry
// says, never an evaluation or a withdrawal.
//
// # Probers
//
// Each prober assignment is handed to the engine with the prober's name
// (assignProber), so verdict reasons name it ("probe failing (prober
// prober-az1) contradicted by self: degraded") rather than by its interned
// number. A prober in outage (silent on all its targets) or suspect (its
// failures contradicted by other evidence on many of its targets, and so
// ignored; see the eligibility package) is exported as
// muster_prober_outage and muster_prober_suspect, with
// muster_prober_contradicted_targets and, per service,
// muster_instances_contradicted, muster_contradicted_failures_total and
// muster_instances_suspect_probed; ProberAlarms lists both kinds, named and
// dated, for the server's alarm list.
//
// # What the rebuild reads
//
// Instance ids are never reused, so ended rows only accumulate: a region
// with ~900 deploys a day holds a million of them within weeks, and each
// costs a seal check (some 40 us of CPU) if read. The rebuild reads what
// the evaluator acts on (load; Registry.InstancesToRebuild): every live
// row (by instances_live_endpoint_idx, which holds live rows only), the
// rows that read ended with no end time (never muster's; kept in
// rotation), and the rows ended within ExpiredHorizon (by
// instances_ended_idx on the end time), which may still hold their zone's
// guard. Nothing older matters: quarantines are restored for live
// instances only, and a replay (an ended row written back to 'active') is
// a live row, checked by id against muster's record of the end like every
// live row. Measured with `muster loadgen rebuild` (docs/measuring.md).
// An end written by hand with an end time older than the horizon is not
// seen by a rebuilt replica, as a row deleted by hand is not
// (docs/overrides.md). The incremental refreshes go on from
// refreshOverlap before the read began (no later than the newest stamp on
// record), so what committed during the read is read again.
//
// # Admissions across a restart
//
// A new instance of a service with a readiness signal starts out of
// rotation, awaiting its first success, and the guard does not count it
// as capacity (assembler.InstanceInput.Awaiting). That is right for a new
// registration and wrong for an instance that served before a restart: if
// the observed windows are gone (muster down longer than Retention) every
// instance of every probe service would come back awaiting, the guard
// would count nothing and the views would empty. So the rebuild, after
// loading the registry and before replaying windows, reads the newest
// transition of each instance that would start awaiting (one index probe
// per instance, TransitionsLatestFor) and hands it to
// eligibility.Engine.RestoreAdmission: an instance with any transition on
// record has been in rotation; left in rotation it is restated as unknown
// at full weight (nobody has heard it since; silence is not failure), left
// out it is restated out of rotation since then, to re-enter by the
// re-entry rules. Expired instances kept for the guard are settled the
// same way. An admission whose transition was still buffered when the
// process died is lost with it; that instance awaits its next success.
//
// # Instances registered a moment ago
//
// A workload registers and sends its first report at once, well inside
// the refresh period. Two paths make sure that report finds its instance.
// The registration hand-off: muster serve gives the registry a Registered
// hook that calls InstancesRegistered after the commit and before the 201
// is written, so the new instance, and any instance of the same endpoint
// it replaced, is applied exactly as the refresh would apply the rows
// (applyInstance; a row already applied changes nothing, so the refresh
// reading it later is a no-op). A service the evaluator meets first this
// way has its contract read too. The on-demand load: a registration on
// another replica (or one whose hand-off failed) is not known here, so
// Ingest collects the ids a batch names that the evaluator does not know
// and, without holding the evaluator's lock, looks them up in one query
// (Registry.InstancesByID), bounded by 500 ms (or DBTimeout if shorter),
// loads the active ones, and only then attributes the batch. Ids with no
// instance, and ids of ended instances, are refused as unknown_instance
// with a reason naming which; ids it could not look up are refused as
// unverified_instance and ask for an early refresh. Reports naming
// made-up ids must not turn into unbounded database work: at most 100
// unknown ids of a batch are looked up (the rest are unverified), at most
// four lookups run at once, none while the database monitor says
// PostgreSQL is down, and ids found missing or ended (and instances the
// evaluator retires) are remembered for a minute, up to 16,384 of them,
// so naming them again costs nothing. Missing and ended are permanent
// (ids are never reused), so that memory is never wrong, only bounded.
// muster_evaluator_instances_loaded_on_demand_total counts the instances
// loaded either way, muster_evaluator_instance_lookups_total the queries
// and muster_evaluator_instance_lookup_ids_total what became of each
// unknown id.
//
// # Readiness from reconciliation
//
// A reconciled instance (package reconcile) has no token of its own to
// report with until its workload presents one; its orchestrator relays
// its readiness probe instead. ObserveReadiness takes that relay as
// self-class samples attributed to the source ("reconcile:k8s/prod"):
// serving is a success, not serving a failure, restated every pass so the
// class is heard while the source reports the instance. It is an
// in-process path from muster's own reconciler, so it needs no token, and
// it reaches only instances the evaluator knows. A workload token bound to
// a pod (identity.Principal.Pod) may self-report for that pod's instance
// only.
//
// # Quarantines across a restart
//
// A flap quarantine (ADR-09) is computed state, but losing it on a restart
// would put a known-bad instance back into rotation and start its next
// quarantine at 1 min again. Nothing extra is written for it: the
// transition that starts a quarantine already goes to the transitions
// table, and now carries quarantined_until and quarantine_step in columns
// of their own (migration 000010). After loading instances and replaying
// windows, and before its first Tick, the rebuild reads the newest
// quarantine of each instance among those ending after now minus the
// engine's QuarantineForgive (1 h), and hands those of active instances to
// eligibility.Engine.RestoreQuarantine: one still in force holds its
// instance out until the same time; one that ended sets the next one's
// step. The read goes through a partial index on quarantined_until, so it
// touches recent quarantines only, however long the transition log (five
// years of audit) grows; a separate table of quarantines would have added
// a second write path, updates and pruning for the same rows. Measured
// with
//
//	muster loadgen seed --data /tmp/lg && muster loadgen rebuild --data /tmp/lg
//
// (60,000 instances, 601,200 transitions, 1,200 quarantines in the last
// hour): reading and restoring them takes 2 to 3 ms of a 7 s rebuild. With
// every instance quarantined within the hour (--quarantined 30000: 60,000
// rows) it takes 0.2 to 0.6 s. A quarantine transition still buffered when
// the process dies (PostgreSQL away, say) is lost with it; the changes
// counted toward the next quarantine since the last one are not restored
// either (the flap window starts empty).
package evaluator
